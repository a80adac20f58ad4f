"""The synchronous API: :class:`Sandbox` and its ``files``, ``processes`` and ``ports``."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

from . import _types as t
from ._conn import STREAM, WATCH, Connection, default_connection
from .errors import SandboxFileNotFoundError

Progress = Optional[Callable[[int, Optional[int]], None]]


def _conn(connection: Optional[Connection], host: Optional[str]) -> Connection:
    return connection if connection is not None else default_connection(host)


_LIVE: "weakref.WeakSet[ExecStream]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _end_live_streams() -> None:
    """A process that exits with streams still running ends their commands (a detached
    exec would otherwise run on in the sandbox)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for s in live:
        s._end_quietly()


class ExecStream:
    """A running command (``sb.exec_stream``): iterate it for :class:`~abx.ExecOutput`
    events in the order the output was read, then exactly one :class:`~abx.ExecExit`.
    ``write``/``close_stdin``/``resize``/``kill`` act on it; ``wait()`` drains it and returns
    the exit. ``exec_id`` and ``pid`` name it.

    The command ends with its handle: on Ctrl-C (``KeyboardInterrupt``) while it is read, on
    leaving a ``with`` block, and when the process exits; ``detach()`` lets it run on
    (``Sandbox.attach(exec_id)`` picks it up again)."""

    def __init__(self, conn: Connection, reply: Mapping[str, Any]) -> None:
        self._c = conn
        self.exec_id: str = reply["execId"]
        self.pid: Optional[int] = reply.get("pid")
        self.exit: Optional[t.ExecExit] = None
        #: For a re-attached stream: the attach reply (``running``, ``replayed``, ``dropped_bytes``).
        self.attached: Optional[t.Record] = None
        self._detached = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end_quietly()

    def detach(self) -> str:
        """Let the command run on after this handle (no kill on exit); returns its exec id."""
        self._detached = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return self.exec_id

    def _end_quietly(self) -> None:
        if self.exit is not None or self._detached:
            return
        try:
            self._c.call("exec/kill", t.p_exec_kill(self.exec_id, None, None), timeout=5)
        except Exception:
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __iter__(self) -> "ExecStream":
        return self

    def __next__(self) -> Union[t.ExecOutput, t.ExecExit]:
        ev = self.next()
        if ev is None:
            raise StopIteration
        return ev

    def next(self, timeout: Optional[float] = None) -> Union[t.ExecOutput, t.ExecExit, None]:
        """The next event; None after the exit (or when ``timeout`` passed first)."""
        if self.exit is not None:
            return None
        try:
            got = self._c.next_event(self.exec_id, timeout)
        except KeyboardInterrupt:
            self._end_quietly()
            raise
        if got is None:
            return None
        ev = t.stream_event(*got)
        if isinstance(ev, t.ExecExit):
            self.exit = ev
            with _LIVE_LOCK:
                _LIVE.discard(self)
        return ev

    def write(self, data: t.Data, eof: bool = False) -> None:
        """Write to the command's stdin (``eof=True`` closes it after)."""
        self._c.call("exec/write", t.p_exec_write(self.exec_id, data, eof))

    def close_stdin(self) -> None:
        self._c.call("exec/write", t.p_exec_write(self.exec_id, None, True))

    def resize(self, cols: int, rows: int) -> None:
        """Resize the pty (pty execs only)."""
        self._c.call("exec/resize", t.p_exec_resize(self.exec_id, cols, rows))

    def kill(self, signal: Optional[str] = None, escalate: Optional[bool] = None) -> None:
        """Signal the whole process tree (default KILL; INT/TERM escalate unless ``escalate=False``)."""
        self._c.call("exec/kill", t.p_exec_kill(self.exec_id, signal, escalate))

    def wait(self, timeout: Optional[float] = None) -> Optional[t.ExecExit]:
        """Drain the stream (output dropped) and return its exit."""
        while self.exit is None:
            if self.next(timeout) is None and self.exit is None:
                return None
        return self.exit


class Watch:
    """A ``files.watch``: iterate it for :class:`~abx.FileChange` events; ``close()`` (or
    ``with``) unwatches."""

    def __init__(self, conn: Connection, watch_id: str) -> None:
        self._c = conn
        self.watch_id = watch_id
        self.closed = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> t.FileChange:
        ev = self.next()
        if ev is None:
            raise StopIteration
        return ev

    def next(self, timeout: Optional[float] = None) -> Optional[t.FileChange]:
        if self.closed:
            return None
        p = self._c.next_change(self.watch_id, timeout)
        return None if p is None else t.FileChange(p)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._c.drop_watch(self.watch_id)
            self._c.call("files/unwatch", {"watchId": self.watch_id})

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Files:
    """``sb.files``: read, write, list, stat, exists, mkdir, remove, rename, upload,
    download, watch. Paths are under ``/workspace`` (relative) or ``/tmp``."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    def _call(self, method: str, params: Dict[str, Any], **kw: Any) -> Any:
        return self._sb._c.call(method, params, **kw)

    def read_bytes(self, path: str) -> bytes:
        """The whole file, exact (chunked: any size in constant broker memory)."""
        return self._read(path, True)

    def read(self, path: str, *, binary: bool = False) -> Any:
        """The file as text (UTF-8, invalid bytes replaced), or bytes with ``binary=True``."""
        b = self._read(path, binary)
        return b if binary else b.decode("utf-8", "replace")

    def _read(self, path: str, binary: bool) -> bytes:
        out = bytearray()
        while True:
            r = self._call("files/read", t.p_read(self._sb._route, path, len(out), None, binary))
            out += t.decode(r.get("data", ""), r.get("encoding"))
            if r.get("eof", True) or not r.get("data"):
                return bytes(out)

    def write(self, path: str, data: t.Data, *, mode: Optional[int] = None, append: bool = False) -> int:
        """Write ``data`` (str as UTF-8, bytes exact); a whole-file write is atomic; missing
        parent directories are made. Returns the size."""
        try:
            return self._write(path, data, mode, append)
        except SandboxFileNotFoundError:
            parent = t.parent_dir(path)
            if not parent:
                raise
            self.mkdir(parent, parents=True)
            return self._write(path, data, mode, append)

    def _write(self, path: str, data: t.Data, mode: Optional[int], append: bool) -> int:
        raw = data if isinstance(data, str) else bytes(data)
        if len(raw) <= t.CHUNK:
            return int(self._call("files/write", t.p_write(self._sb._route, path, raw, None, append, mode))["size"])
        b = raw.encode() if isinstance(raw, str) else raw
        size = 0
        for off in range(0, len(b), t.CHUNK):
            r = self._call("files/write", t.p_write(self._sb._route, path, b[off:off + t.CHUNK],
                                                    None if off == 0 else off, append and off == 0, mode))
            size = int(r["size"])
        return size

    def list(self, path: str = "", recursive: bool = False) -> List[t.Record]:
        """Entries ``{name, path, type, size, mode, modified_at}``."""
        p = {"sandbox": self._sb._route, **({"path": path} if path else {}), **({"recursive": True} if recursive else {})}
        return t.entries(self._call("files/list", p))

    def stat(self, path: str) -> t.Record:
        return t.Record(self._call("files/stat", t.p_path(self._sb._route, path)))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except SandboxFileNotFoundError:
            return False

    def mkdir(self, path: str, parents: bool = False) -> None:
        self._call("files/mkdir", t.p_path(self._sb._route, path, parents=parents))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._call("files/remove", t.p_path(self._sb._route, path, recursive=recursive))

    def rename(self, src: str, dst: str) -> None:
        self._call("files/rename", t.p_rename(self._sb._route, src, dst))

    def upload(self, local_path: str, path: str, on_progress: Progress = None) -> int:
        """Copy a file of this machine into the sandbox; returns its size. On this machine's
        broker the broker streams it (``files/upload``); with ``host=`` it is sent in chunks."""
        if self._sb._c.is_remote:
            with open(local_path, "rb") as f:
                data = f.read()
            return self.write(path, data)
        note = _progress(on_progress)
        r = self._call("files/upload", t.p_transfer(self._sb._route, os.path.abspath(local_path), path), on_note=note)
        return int(r["size"])

    def download(self, path: str, local_path: str, on_progress: Progress = None) -> int:
        """Copy a sandbox file to this machine; returns its size."""
        if self._sb._c.is_remote:
            data = self.read_bytes(path)
            with open(local_path, "wb") as f:
                f.write(data)
            return len(data)
        note = _progress(on_progress)
        r = self._call("files/download", t.p_transfer(self._sb._route, os.path.abspath(local_path), path), on_note=note)
        return int(r["size"])

    def watch(self, path: str = "", recursive: bool = False) -> Watch:
        """Watch a path for changes (``files.watch``): a :class:`Watch` of :class:`~abx.FileChange`."""
        p = {"sandbox": self._sb._route, "path": path or "/workspace", **({"recursive": True} if recursive else {})}
        r = self._call("files/watch", p, kind=WATCH)
        return Watch(self._sb._c, r["watchId"])


def _progress(cb: Progress) -> Optional[Callable[[str, Dict[str, Any]], None]]:
    if cb is None:
        return None

    def note(method: str, p: Dict[str, Any]) -> None:
        if method == "files/progress":
            cb(int(p.get("bytes", 0)), p.get("total"))

    return note


class Processes:
    """``sb.processes``: ``list()`` and ``kill(pid, signal=None)``."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    def list(self) -> List[t.Record]:
        """``[{pid, ppid, command, status}]``."""
        return t.processes(self._sb._c.call("process/list", t.p_sandbox(self._sb._route)))

    def kill(self, pid: int, signal: Optional[str] = None) -> None:
        self._sb._c.call("process/kill", t.p_process_kill(self._sb._route, pid, signal))


class Ports:
    """``sb.ports.url(port)``: ``{url, headers}`` to reach a port of the sandbox."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    def url(self, port: int) -> t.Record:
        return t.Record(self._sb._c.call("ports/url", t.p_port(self._sb._route, port)))


class Sandbox:
    """A sandbox of any provider, driven through the broker.

    ``Sandbox.create(...)`` makes one, ``Sandbox.connect(id)`` attaches to one,
    ``Sandbox.list()`` lists them. Every call raises an :class:`~abx.AbxError` subclass for
    its E-code. ``host=`` (or ``ABX_HOST``) reaches a broker on another machine over ssh;
    ``connection=`` shares an explicit :class:`~abx.Connection`."""

    def __init__(self, info: Mapping[str, Any], connection: Connection) -> None:
        self._c = connection
        self._info = t.SandboxInfo(info)
        self.files = Files(self)
        self.processes = Processes(self)
        self.ports = Ports(self)

    # -- class methods --------------------------------------------------------------------

    @classmethod
    def create(cls, provider: Optional[str] = None, template: Optional[str] = None, timeout: Optional[int] = None,
               env: Optional[Mapping[str, str]] = None, network: Any = None,
               limits: Optional[Mapping[str, Any]] = None, metadata: Optional[Mapping[str, str]] = None,
               mounts: Optional[List[Any]] = None, *,
               host: Optional[str] = None, connection: Optional[Connection] = None) -> "Sandbox":
        """Create a sandbox (``timeout`` s of life, default 300; ``network``: none / internet /
        host; ``limits``: ``{memory, cpus, pids}``; ``mounts``: host directories in it, each
        ``{"source": "/abs/dir", "target": "/workspace", "mode": "overlay"|"ro"|"rw"}`` or
        ``"SRC[:TARGET][:MODE]"``; ``overlay``, the default, changes the host only on
        :meth:`apply`)."""
        c = _conn(connection, host)
        r = c.call("sandbox/create", t.p_create(provider, template, timeout, env, network, limits, metadata, mounts))
        return cls(r, c)

    @classmethod
    def connect(cls, sandbox_id: str, *, host: Optional[str] = None,
                connection: Optional[Connection] = None) -> "Sandbox":
        """Attach to a sandbox by ``id`` or ``provider:id`` (its lifetime is untouched)."""
        c = _conn(connection, host)
        return cls(c.call("sandbox/connect", t.p_sandbox(sandbox_id)), c)

    @classmethod
    def list(cls, provider: Optional[str] = None, *, host: Optional[str] = None,
             connection: Optional[Connection] = None) -> t.SandboxList:
        """Every provider's sandboxes (or one provider's); ``.errors`` lists the providers
        that could not answer."""
        return t.sandbox_list(_conn(connection, host).call("sandbox/list", t.p_list(provider)))

    # -- this sandbox -----------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The sandbox's id (as ``Sandbox.list()`` shows it)."""
        return self._info.id

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (``id``; E2B's name for it)."""
        return self._info.id

    @property
    def _route(self) -> str:
        """``provider:id``: reaches this sandbox whatever the default provider."""
        return f"{self._info.provider}:{self._info.id}" if self._info.provider else self._info.id

    @property
    def provider(self) -> str:
        return self._info.provider

    @property
    def status(self) -> str:
        """As of the last reply (``refresh()`` asks again)."""
        return self._info.status

    @property
    def connection(self) -> Connection:
        return self._c

    def info(self) -> t.SandboxInfo:
        """Ask the broker again; the sandbox's fields."""
        self._info = t.SandboxInfo(self._c.call("sandbox/info", t.p_sandbox(self._route)))
        return self._info

    def refresh(self) -> "Sandbox":
        self.info()
        return self

    @property
    def last_info(self) -> t.SandboxInfo:
        """The fields as of the last reply, without a call."""
        return self._info

    def exec(self, cmd: t.Cmd, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             timeout: Optional[float] = None, stdin: Optional[t.Data] = None, *,
             max_output: Optional[int] = None) -> t.ExecResult:
        """Run ``cmd`` (a shell string, or argv as a list) to completion."""
        return t.ExecResult(self._c.call("exec/run", t.p_exec(self._route, cmd, env, cwd, timeout, stdin, max_output)))

    def exec_stream(self, cmd: t.Cmd, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    timeout: Optional[float] = None, stdin: Optional[t.Data] = None, *,
                    pty: Any = None) -> ExecStream:
        """Start ``cmd`` and stream its output (``pty=True`` or ``(cols, rows)`` for a terminal)."""
        r = self._c.call("exec/start", t.p_exec(self._route, cmd, env, cwd, timeout, stdin, pty=pty, stream=True),
                         kind=STREAM)
        return ExecStream(self._c, r)

    def attach(self, exec_id: str) -> ExecStream:
        """Take over a running (or recently ended) streamed command by its exec id
        (``exec/attach``): what it wrote while no one listened is replayed first."""
        r = self._c.call("exec/attach", {"execId": exec_id}, kind=STREAM)
        s = ExecStream(self._c, {"execId": r.get("execId", exec_id)})
        s.attached = t.Record(r)
        return s

    def set_timeout(self, seconds: int) -> t.SandboxInfo:
        """End the lifetime ``seconds`` from now."""
        self._info = t.SandboxInfo(self._c.call("sandbox/setTimeout", t.p_set_timeout(self._route, seconds)))
        return self._info

    def pause(self) -> t.SandboxInfo:
        self._info = t.SandboxInfo(self._c.call("sandbox/pause", t.p_sandbox(self._route)))
        return self._info

    def resume(self) -> t.SandboxInfo:
        self._info = t.SandboxInfo(self._c.call("sandbox/resume", t.p_sandbox(self._route)))
        return self._info

    def kill(self) -> bool:
        """Kill it (idempotent): True when this call killed it."""
        return bool((self._c.call("sandbox/kill", t.p_sandbox(self._route)) or {}).get("killed"))

    def capabilities(self) -> t.Record:
        return t.Record(self._c.call("sandbox/capabilities", t.p_sandbox(self._route)))

    def system_info(self) -> t.Record:
        return t.Record(self._c.call("sandbox/systemInfo", t.p_sandbox(self._route)))

    def set_network(self, network: Any) -> t.SandboxInfo:
        """Change the egress policy of the running sandbox (``{"allow": [...], "deny": [...]}``;
        ``network.vpc``): new connections follow it, open ones go on."""
        self._info = t.SandboxInfo(self._c.call("sandbox/setNetwork", {"sandbox": self._route, "network": network}))
        return self._info

    def diff(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None,
             patch: bool = False) -> List[t.Record]:
        """What the sandbox changed under its overlay mounts, against the host as it was at
        create: each ``{path, change, type, size, binary, mode?, symlink_target?, patch?}``
        (``patch=True``: a unified diff per text file)."""
        r = self._c.call("sandbox/diff", t.p_changes(self._route, target, paths,
                                                        format="patch" if patch else None))
        return [t.Record(c) for c in (r or {}).get("changes", [])]

    def apply(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None,
              dry_run: bool = False, force: bool = False) -> t.Record:
        """Write the sandbox's changes (all, or ``paths``) to the host, each file atomically:
        ``{applied, conflicts, skipped}``. A path the host changed since create is a conflict
        (left as it is) unless ``force``; the others are applied."""
        return t.Record(self._c.call("sandbox/apply", t.p_changes(
            self._route, target, paths, dryRun=dry_run or None, force=force or None)))

    def discard(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None) -> List[str]:
        """Drop the sandbox's changes (all, or ``paths``): it sees the host's files again."""
        r = self._c.call("sandbox/discard", t.p_changes(self._route, target, paths))
        return list((r or {}).get("discarded", []))

    def log(self, since: Optional[int] = None, limit: Optional[int] = None) -> t.Record:
        """Every command run in the sandbox, with the client that asked: ``{entries, dropped,
        last}`` (pass ``last`` as ``since`` for what comes next)."""
        return t.Record(self._c.call("sandbox/log", t.p_log(self._route, since, limit)))

    def run_code(self, code: str, language: Optional[str] = None,
                 context: Optional[str] = None, timeout: Optional[float] = None,
                 env: Optional[Dict[str, str]] = None, *,
                 on_output: Optional[Callable[[t.CodeOutput], None]] = None) -> t.CodeResult:
        """Run code in an interpreter (``code.interpret``; E8004 where the provider lacks it):
        a :class:`~abx.CodeResult` ``{results, stdout, stderr, error, execution_count, ...}``.
        ``on_output(CodeOutput)`` sees the cell's ``code/output`` as it comes (stdout,
        stderr, result, error, restarted), before the reply; it runs as the connection reads
        them, so it must not itself call the broker on this connection (hand off to another
        thread, as ``abx.e2b``'s callbacks do)."""
        rid, note = t.code_listener(on_output)
        return t.CodeResult(self._c.call(
            "code/run", t.p_code(self._route, code, language, context, timeout, env, rid), on_note=note))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, status={self.status!r})"
