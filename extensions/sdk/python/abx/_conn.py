"""The synchronous connection: newline-delimited JSON-RPC 2.0 (docs/design.md#wire) over the broker's
socket or an ssh child's stdio, safe to share between threads.

No reader thread: whichever thread waits for something (a reply, a stream event) reads the
connection and files every message it reads where it belongs (replies by id, ``exec/output``
/ ``exec/exit`` by ``execId``, ``files/changed`` by ``watchId``, other notifications to the
listeners of the calls in progress); other waiting threads sleep on a condition meanwhile.
A stream's queue is created when its ``exec/start`` reply is read, before the next message,
so no event can arrive before it (the broker always answers first).

A call interrupted before its reply (``KeyboardInterrupt``, its ``timeout``) sends
``$/cancelRequest`` for its id, so the broker stops the work; the late reply is dropped.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import _transport
from .errors import AbxError, RequestCancelledError, from_rpc, make_error

Listener = Callable[[str, Dict[str, Any]], None]

#: Bytes read at a time.
READ_SIZE = 64 * 1024

#: Pending-request kinds whose reply opens a queue.
STREAM = "stream"
WATCH = "watch"


class RequestTimeoutError(RequestCancelledError):
    """No reply within the call's ``timeout``: the request was cancelled at the broker."""


def encode(obj: Dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class _Timeout(Exception):
    pass


_SCOPE = threading.local()


class request_timeout_scope:  # noqa: N801 (used as a function: ``with request_timeout_scope(5):``)
    """Within the block, on this thread, calls with no ``timeout=`` of their own are bounded by
    ``seconds`` (then cancelled at the broker, :class:`RequestTimeoutError`), whatever the
    connection's ``request_timeout``. ``None``/0: no change."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.seconds = seconds or None

    def __enter__(self) -> None:
        self._prev = getattr(_SCOPE, "timeout", None)
        if self.seconds is not None:
            _SCOPE.timeout = self.seconds

    def __exit__(self, *exc: Any) -> None:
        _SCOPE.timeout = self._prev


class Connection:
    """One connection to the broker (``host``: ``ssh://[user@]host[:port]``, default
    ``ABX_HOST``, empty for this machine). The daemon is started when none answers
    (``start=False``: never). ``request_timeout`` (s) bounds every call made on it (a call
    past it is cancelled at the broker and raises :class:`RequestTimeoutError`). Thread-safe;
    close it with :meth:`close` or ``with``."""

    def __init__(self, host: Optional[str] = None, *, start: bool = True,
                 request_timeout: Optional[float] = None) -> None:
        self.request_timeout = request_timeout
        self.host = _transport.parse_host(host)
        self._sock: Optional[socket.socket] = None
        self._sock_timeout: Optional[float] = None
        self._ssh: Optional[_transport.SshProcess] = None
        if self.host is not None:
            self._ssh = _transport.SshProcess(self.host)
            assert self._ssh.proc.stdout is not None and self._ssh.proc.stdin is not None
            self._rfd = self._ssh.proc.stdout.fileno()
            self._wfd = self._ssh.proc.stdin.fileno()
        else:
            self._sock = _transport.connect_socket(start)
        self._cv = threading.Condition()
        self._wlock = threading.Lock()
        self._reading = False
        self._buf = bytearray()
        self._next = 0
        self._pending: Dict[int, str] = {}
        self._replies: Dict[int, Dict[str, Any]] = {}
        self._streams: Dict[str, Deque[Tuple[str, Dict[str, Any]]]] = {}
        self._watches: Dict[str, Deque[Dict[str, Any]]] = {}
        self._listeners: List[Listener] = []
        self._closed: Optional[AbxError] = None
        if self.host is not None:
            # Surface ssh's own failures (E1014-E1016) now rather than at the first call.
            self.call("broker/ping")

    @property
    def is_remote(self) -> bool:
        """Whether the broker is on another machine (``host=``)."""
        return self.host is not None

    # -- bytes ------------------------------------------------------------------------------

    def _send(self, body: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        try:
            with self._wlock:
                if self._sock is not None:
                    self._sock.sendall(body)
                else:
                    view = memoryview(body)
                    while view:
                        n = os.write(self._wfd, view)
                        view = view[n:]
        except OSError:
            raise self._broken() from None

    def _recv(self, timeout: Optional[float]) -> Optional[bytes]:
        """Some bytes, b"" at the end, None when ``timeout`` passed first."""
        try:
            if self._sock is not None:
                if timeout != self._sock_timeout:  # a syscall: only when it changes
                    self._sock.settimeout(timeout)
                    self._sock_timeout = timeout
                try:
                    # 64 KiB: a larger read buffer is an mmap and munmap per read
                    return self._sock.recv(READ_SIZE)
                except socket.timeout:
                    return None
            if timeout is not None:
                r, _, _ = select.select([self._rfd], [], [], timeout)
                if not r:
                    return None
            return os.read(self._rfd, READ_SIZE)
        except OSError:
            return b""

    def _broken(self) -> AbxError:
        with self._cv:
            if self._closed is None:
                if self._ssh is not None:
                    self._closed = self._ssh.failure()
                else:
                    self._closed = make_error(
                        "E1007", "The abx broker is not reachable: the broker closed the connection.",
                        "Run 'abx broker status'; the next connection starts a fresh broker.")
                self._cv.notify_all()
            return self._closed

    # -- messages ---------------------------------------------------------------------------

    def _dispatch(self, m: Any) -> None:
        """File one message (the condition is held)."""
        if not isinstance(m, dict):
            return
        method = m.get("method")
        if method is None:
            mid = m.get("id")
            kind = self._pending.pop(mid, None) if isinstance(mid, int) else None
            if kind is None:
                return  # cancelled or unknown: dropped
            r = m.get("result")
            if kind and isinstance(r, dict):
                if kind == STREAM and isinstance(r.get("execId"), str):
                    self._streams.setdefault(r["execId"], deque())
                elif kind == WATCH and isinstance(r.get("watchId"), str):
                    self._watches.setdefault(r["watchId"], deque())
            self._replies[mid] = m
            return
        p = m.get("params") if isinstance(m.get("params"), dict) else {}
        if method in ("exec/output", "exec/exit"):
            q = self._streams.get(p.get("execId"))
            if q is not None:
                q.append((method, p))
        elif method == "files/changed":
            w = self._watches.get(p.get("watchId"))
            if w is not None:
                w.append(p)
        else:
            for f in list(self._listeners):
                try:
                    f(method, p)
                except Exception:  # a listener's bug never breaks the connection
                    pass

    def _pump(self, done: Callable[[], bool], deadline: Optional[float]) -> None:
        """Read and file messages until ``done()`` (checked with the condition held)."""
        with self._cv:
            while True:
                if done():
                    return
                if self._closed is not None:
                    raise self._closed
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise _Timeout()
                if self._reading:
                    self._cv.wait(left)
                    continue
                self._reading = True
                self._cv.release()
                data: Optional[bytes] = None
                try:
                    data = self._recv(left)
                finally:
                    self._cv.acquire()
                    self._reading = False
                    self._cv.notify_all()
                if data is None:
                    continue
                if not data:
                    self._cv.release()
                    try:
                        self._broken()
                    finally:
                        self._cv.acquire()
                    continue
                buf = self._buf
                buf += data
                start = 0
                while True:
                    nl = buf.find(b"\n", start)
                    if nl < 0:
                        break
                    line = bytes(buf[start:nl])
                    start = nl + 1
                    if line.strip():
                        try:
                            self._dispatch(json.loads(line))
                        except ValueError:
                            pass
                del buf[:start]

    # -- calls ------------------------------------------------------------------------------

    def notify(self, method: str, params: Optional[Dict[str, Any]] = None) -> None:
        """Send a notification."""
        self._send(encode({"jsonrpc": "2.0", "method": method, "params": params or {}}))

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *, timeout: Optional[float] = None,
             kind: str = "", on_note: Optional[Listener] = None) -> Any:
        """Call ``method`` and return its result; an error reply raises its exception class.
        ``timeout`` (s) bounds the wait: then, as on ``KeyboardInterrupt``, the request is
        cancelled at the broker (``$/cancelRequest``) and :class:`RequestTimeoutError` raised.
        ``on_note(method, params)`` sees the notifications (progress) read meanwhile."""
        if timeout is None:
            timeout = getattr(_SCOPE, "timeout", None) or self.request_timeout
        with self._cv:
            self._next += 1
            mid = self._next
            self._pending[mid] = kind
            if on_note is not None:
                self._listeners.append(on_note)
        try:
            self._send(encode({"jsonrpc": "2.0", "id": mid, "method": method, "params": params or {}}))
            deadline = None if timeout is None else time.monotonic() + timeout
            self._pump(lambda: mid in self._replies, deadline)
            with self._cv:
                msg = self._replies.pop(mid)
        except BaseException as e:
            with self._cv:
                waiting = self._pending.pop(mid, None) is not None
                self._replies.pop(mid, None)
            if waiting and self._closed is None:
                try:
                    self.notify("$/cancelRequest", {"id": mid})
                except AbxError:
                    pass
            if isinstance(e, _Timeout):
                raise RequestTimeoutError(
                    f"No reply to '{method}' within {timeout} s: the request was cancelled.",
                    code="E1006", suggestion="Give the call a longer timeout.") from None
            raise
        finally:
            if on_note is not None:
                with self._cv:
                    try:
                        self._listeners.remove(on_note)
                    except ValueError:
                        pass
        if "error" in msg:
            raise from_rpc(msg["error"] if isinstance(msg["error"], dict) else {})
        return msg.get("result")

    def next_event(self, exec_id: str, timeout: Optional[float] = None) -> Optional[Tuple[str, Dict[str, Any]]]:
        """The next ``exec/output`` / ``exec/exit`` of a stream (None on timeout)."""
        q = self._streams.get(exec_id)
        if q is None:
            raise make_error("E3002", f"Exec '{exec_id}' is not streamed on this connection.",
                             "Start it with exec_stream on this connection.")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._pump(lambda: bool(q), deadline)
        except _Timeout:
            return None
        with self._cv:
            ev = q.popleft()
            if ev[0] == "exec/exit":
                self._streams.pop(exec_id, None)
            return ev

    def next_change(self, watch_id: str, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next ``files/changed`` of a watch (None on timeout)."""
        q = self._watches.get(watch_id)
        if q is None:
            raise make_error("E1004", f"Watch '{watch_id}' is not open on this connection.", "")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._pump(lambda: bool(q), deadline)
        except _Timeout:
            return None
        with self._cv:
            return q.popleft()

    def drop_watch(self, watch_id: str) -> None:
        with self._cv:
            self._watches.pop(watch_id, None)

    def close(self) -> None:
        """Close the connection (an ssh child ends with it)."""
        with self._cv:
            if self._closed is None:
                self._closed = make_error("E1007", "The abx broker is not reachable: this connection was closed.",
                                          "Open a new connection.")
            self._cv.notify_all()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if self._ssh is not None:
            self._ssh.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_default: Dict[Tuple[int, str], Connection] = {}
_default_lock = threading.Lock()


def default_connection(host: Optional[str] = None) -> Connection:
    """The shared connection of this process for ``host`` (default ``ABX_HOST``), opened on
    first use and again after it broke."""
    key = (os.getpid(), host if host is not None else os.environ.get(_transport.HOST_ENV, ""))
    with _default_lock:
        c = _default.get(key)
        if c is None or c._closed is not None:
            c = Connection(host)
            _default[key] = c
        return c
