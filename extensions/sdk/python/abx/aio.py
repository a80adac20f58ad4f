"""The asyncio API: :class:`AsyncSandbox` (``files``, ``processes``, ``ports``),
:class:`AsyncConnection` and :mod:`providers <abx.aio.providers>` functions, the same surface
as the sync API with ``await``.

One reader task per connection files replies by id and stream events by ``execId`` (the
stream's queue is created when its ``exec/start`` reply is read, before the next message).
Cancelling a task that awaits a call (or its ``timeout`` passing) sends ``$/cancelRequest``.
"""

from __future__ import annotations

import asyncio
import json
import os
import types
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Union

from . import _transport
from . import _types as t
from ._conn import STREAM, WATCH, Listener, RequestTimeoutError, encode
from .errors import AbxError, SandboxFileNotFoundError, from_rpc, make_error

_LIMIT = 128 * 1024 * 1024


class AsyncConnection:
    """One asyncio connection to the broker; open it with ``await AsyncConnection.open(host)``
    (``host``: ``ssh://[user@]host[:port]``, default ``ABX_HOST``)."""

    def __init__(self) -> None:
        self.request_timeout: Optional[float] = None
        self.host: Optional[_transport.Host] = None
        self._reader: asyncio.StreamReader
        self._writer: Any
        self._proc: Any = None
        self._stderr = bytearray()
        self._next = 0
        self._pending: Dict[int, "tuple[asyncio.Future[Any], str]"] = {}
        self._streams: Dict[str, "asyncio.Queue[tuple[str, Dict[str, Any]]]"] = {}
        self._watches: Dict[str, "asyncio.Queue[Dict[str, Any]]"] = {}
        self._listeners: List[Listener] = []
        self._closed: Optional[AbxError] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._tasks: List["asyncio.Task[Any]"] = []

    @classmethod
    async def open(cls, host: Optional[str] = None, *, start: bool = True,
                   request_timeout: Optional[float] = None) -> "AsyncConnection":
        """Connect (``request_timeout``: as for :class:`abx.Connection`)."""
        c = cls()
        c.request_timeout = request_timeout
        c.host = _transport.parse_host(host)
        if c.host is not None:
            try:
                c._proc = await asyncio.create_subprocess_exec(
                    *c.host.ssh_argv(["rpc"]), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, limit=_LIMIT, start_new_session=True)
            except OSError as e:
                raise make_error("E1014", f"Cannot reach host '{c.host.url}' over ssh: cannot run ssh: {e}",
                                 "Install an OpenSSH client, or set ABX_SSH to the ssh binary.") from None
            c._reader, c._writer = c._proc.stdout, c._proc.stdin
            c._tasks.append(asyncio.ensure_future(c._drain_stderr()))
        else:
            # Found as the CLI finds it (the runtime socket, else the one the data dir's record
            # names), started through `abx broker start` when none answers: blocking, so off the loop.
            sock = await asyncio.get_running_loop().run_in_executor(None, _transport.connect_socket, start)
            try:
                c._reader, c._writer = await asyncio.open_unix_connection(sock=sock, limit=_LIMIT)
            except BaseException:
                sock.close()
                raise
        c._task = asyncio.ensure_future(c._read_loop())
        if c.host is not None:
            await c.call("broker/ping")
        return c

    @property
    def is_remote(self) -> bool:
        return self.host is not None

    async def _drain_stderr(self) -> None:
        assert self._proc is not None
        while True:
            b = await self._proc.stderr.read(4096)
            if not b:
                return
            self._stderr += b
            del self._stderr[:-8192]

    async def _failure(self) -> AbxError:
        if self._proc is None:
            return make_error("E1007", "The abx broker is not reachable: the broker closed the connection.",
                              "Run 'abx broker status'; the next connection starts a fresh broker.")
        try:
            status = await asyncio.wait_for(self._proc.wait(), 10)
        except asyncio.TimeoutError:
            self._proc.kill()
            status = await self._proc.wait()
        for tk in self._tasks:
            try:
                await asyncio.wait_for(tk, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
        assert self.host is not None
        err = self._stderr.decode(errors="replace")
        e = self.host.classify(status, err)
        if e is not None:
            return e
        tail = " | ".join([ln for ln in err.splitlines() if ln.strip()][-3:])
        return make_error("E1007", f"The abx broker is not reachable: the remote '{self.host.remote_bin()} rpc' on "
                                   f"'{self.host.url}' ended (exit {status})" + (f": {tail}" if tail else ""),
                          "See the broker log on that machine.")

    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                self._dispatch(m)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass
        if self._closed is None:
            self._closed = await self._failure()
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(self._closed)
        self._pending.clear()
        for q in self._streams.values():
            q.put_nowait(("$/closed", {}))
        for w in self._watches.values():
            w.put_nowait({"$closed": True})

    def _dispatch(self, m: Any) -> None:
        if not isinstance(m, dict):
            return
        method = m.get("method")
        if method is None:
            mid = m.get("id")
            ent = self._pending.pop(mid, None) if isinstance(mid, int) else None
            if ent is None:
                return
            fut, kind = ent
            r = m.get("result")
            if kind and isinstance(r, dict):
                if kind == STREAM and isinstance(r.get("execId"), str):
                    self._streams.setdefault(r["execId"], asyncio.Queue())
                elif kind == WATCH and isinstance(r.get("watchId"), str):
                    self._watches.setdefault(r["watchId"], asyncio.Queue())
            if fut.done():
                return
            if "error" in m:
                fut.set_exception(from_rpc(m["error"] if isinstance(m["error"], dict) else {}))
            else:
                fut.set_result(r)
            return
        p = m.get("params") if isinstance(m.get("params"), dict) else {}
        if method in ("exec/output", "exec/exit"):
            q = self._streams.get(p.get("execId"))
            if q is not None:
                q.put_nowait((method, p))
        elif method == "files/changed":
            w = self._watches.get(p.get("watchId"))
            if w is not None:
                w.put_nowait(p)
        else:
            for f in list(self._listeners):
                try:
                    f(method, p)
                except Exception:
                    pass

    def _write(self, obj: Dict[str, Any]) -> None:
        if self._closed is not None:
            raise self._closed
        try:
            self._writer.write(encode(obj))
        except (OSError, RuntimeError):
            raise make_error("E1007", "The abx broker is not reachable: write failed.", "Reconnect.") from None

    async def notify(self, method: str, params: Optional[Dict[str, Any]] = None) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params or {}})

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None, *, timeout: Optional[float] = None,
                   kind: str = "", on_note: Optional[Listener] = None) -> Any:
        """As :meth:`abx.Connection.call`; a cancelled task cancels the request at the broker."""
        if timeout is None:
            timeout = self.request_timeout
        self._next += 1
        mid = self._next
        fut: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._pending[mid] = (fut, kind)
        if on_note is not None:
            self._listeners.append(on_note)
        try:
            self._write({"jsonrpc": "2.0", "id": mid, "method": method, "params": params or {}})
            if timeout is None:
                return await asyncio.shield(fut)
            try:
                return await asyncio.wait_for(asyncio.shield(fut), timeout)
            except asyncio.TimeoutError:
                raise RequestTimeoutError(f"No reply to '{method}' within {timeout} s: the request was cancelled.",
                                          code="E1006", suggestion="Give the call a longer timeout.") from None
        except BaseException:
            if self._pending.pop(mid, None) is not None and self._closed is None:
                try:
                    self._write({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": mid}})
                except AbxError:
                    pass
            raise
        finally:
            if on_note is not None:
                try:
                    self._listeners.remove(on_note)
                except ValueError:
                    pass

    async def next_event(self, exec_id: str) -> "tuple[str, Dict[str, Any]]":
        q = self._streams.get(exec_id)
        if q is None:
            raise make_error("E3002", f"Exec '{exec_id}' is not streamed on this connection.", "")
        ev = await q.get()
        if ev[0] == "$/closed":
            assert self._closed is not None
            raise self._closed
        if ev[0] == "exec/exit":
            self._streams.pop(exec_id, None)
        return ev

    async def next_change(self, watch_id: str) -> Dict[str, Any]:
        q = self._watches.get(watch_id)
        if q is None:
            raise make_error("E1004", f"Watch '{watch_id}' is not open on this connection.", "")
        p = await q.get()
        if "$closed" in p:
            assert self._closed is not None
            raise self._closed
        return p

    def drop_watch(self, watch_id: str) -> None:
        self._watches.pop(watch_id, None)

    async def close(self) -> None:
        if self._closed is None:
            self._closed = make_error("E1007", "The abx broker is not reachable: this connection was closed.",
                                      "Open a new connection.")
        try:
            self._writer.close()
        except (OSError, RuntimeError):
            pass
        if self._proc is not None:
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except asyncio.TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        for tk in self._tasks:
            tk.cancel()

    async def __aenter__(self) -> "AsyncConnection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


_defaults: Dict[str, "tuple[asyncio.AbstractEventLoop, AsyncConnection]"] = {}


async def default_connection(host: Optional[str] = None) -> AsyncConnection:
    """This event loop's shared connection for ``host`` (default ``ABX_HOST``)."""
    loop = asyncio.get_running_loop()
    key = host if host is not None else os.environ.get(_transport.HOST_ENV, "")
    got = _defaults.get(key)
    if got is not None and got[0] is loop and got[1]._closed is None:
        return got[1]
    c = await AsyncConnection.open(host)
    _defaults[key] = (loop, c)
    return c


async def _conn(connection: Optional[AsyncConnection], host: Optional[str]) -> AsyncConnection:
    return connection if connection is not None else await default_connection(host)


class AsyncExecStream:
    """As :class:`abx.ExecStream`, an async iterator: ``async for ev in stream``. The
    command ends with its handle: a cancelled read (Ctrl-C under ``asyncio.run``), leaving
    an ``async with`` block; ``detach()`` lets it run on (``AsyncSandbox.attach``)."""

    def __init__(self, conn: AsyncConnection, reply: Mapping[str, Any]) -> None:
        self._c = conn
        self.exec_id: str = reply["execId"]
        self.pid: Optional[int] = reply.get("pid")
        self.exit: Optional[t.ExecExit] = None
        self.attached: Optional[t.Record] = None
        self._detached = False

    async def __aenter__(self) -> "AsyncExecStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._end_quietly()

    def detach(self) -> str:
        self._detached = True
        return self.exec_id

    async def _end_quietly(self) -> None:
        if self.exit is not None or self._detached:
            return
        try:
            await asyncio.shield(self._c.call("exec/kill", t.p_exec_kill(self.exec_id, None, None), timeout=5))
        except BaseException:
            pass

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> Union[t.ExecOutput, t.ExecExit]:
        if self.exit is not None:
            raise StopAsyncIteration
        try:
            got = await self._c.next_event(self.exec_id)
        except (asyncio.CancelledError, KeyboardInterrupt):
            await self._end_quietly()
            raise
        ev = t.stream_event(*got)
        if isinstance(ev, t.ExecExit):
            self.exit = ev
        return ev

    async def write(self, data: t.Data, eof: bool = False) -> None:
        await self._c.call("exec/write", t.p_exec_write(self.exec_id, data, eof))

    async def close_stdin(self) -> None:
        await self._c.call("exec/write", t.p_exec_write(self.exec_id, None, True))

    async def resize(self, cols: int, rows: int) -> None:
        await self._c.call("exec/resize", t.p_exec_resize(self.exec_id, cols, rows))

    async def kill(self, signal: Optional[str] = None, escalate: Optional[bool] = None) -> None:
        await self._c.call("exec/kill", t.p_exec_kill(self.exec_id, signal, escalate))

    async def wait(self) -> t.ExecExit:
        async for _ in self:
            pass
        assert self.exit is not None
        return self.exit


class AsyncWatch:
    """As :class:`abx.Watch`: ``async for change in watch``; ``await watch.close()``."""

    def __init__(self, conn: AsyncConnection, watch_id: str) -> None:
        self._c = conn
        self.watch_id = watch_id
        self.closed = False

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> t.FileChange:
        if self.closed:
            raise StopAsyncIteration
        return t.FileChange(await self._c.next_change(self.watch_id))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._c.drop_watch(self.watch_id)
            await self._c.call("files/unwatch", {"watchId": self.watch_id})

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncFiles:
    """As :class:`abx.sandbox.Files`, awaited."""

    def __init__(self, sb: "AsyncSandbox") -> None:
        self._sb = sb

    async def _call(self, method: str, params: Dict[str, Any], **kw: Any) -> Any:
        return await self._sb._c.call(method, params, **kw)

    async def _read(self, path: str, binary: bool) -> bytes:
        out = bytearray()
        while True:
            r = await self._call("files/read", t.p_read(self._sb._route, path, len(out), None, binary))
            out += t.decode(r.get("data", ""), r.get("encoding"))
            if r.get("eof", True) or not r.get("data"):
                return bytes(out)

    async def read(self, path: str, *, binary: bool = False) -> Any:
        b = await self._read(path, binary)
        return b if binary else b.decode("utf-8", "replace")

    async def read_bytes(self, path: str) -> bytes:
        return await self._read(path, True)

    async def write(self, path: str, data: t.Data, *, mode: Optional[int] = None, append: bool = False) -> int:
        """Missing parent directories are made."""
        try:
            return await self._write(path, data, mode, append)
        except SandboxFileNotFoundError:
            parent = t.parent_dir(path)
            if not parent:
                raise
            await self.mkdir(parent, parents=True)
            return await self._write(path, data, mode, append)

    async def _write(self, path: str, data: t.Data, mode: Optional[int], append: bool) -> int:
        raw = data if isinstance(data, str) else bytes(data)
        if len(raw) <= t.CHUNK:
            r = await self._call("files/write", t.p_write(self._sb._route, path, raw, None, append, mode))
            return int(r["size"])
        b = raw.encode() if isinstance(raw, str) else raw
        size = 0
        for off in range(0, len(b), t.CHUNK):
            r = await self._call("files/write", t.p_write(self._sb._route, path, b[off:off + t.CHUNK],
                                                          None if off == 0 else off, append and off == 0, mode))
            size = int(r["size"])
        return size

    async def list(self, path: str = "", recursive: bool = False) -> List[t.Record]:
        p = {"sandbox": self._sb._route, **({"path": path} if path else {}),
             **({"recursive": True} if recursive else {})}
        return t.entries(await self._call("files/list", p))

    async def stat(self, path: str) -> t.Record:
        return t.Record(await self._call("files/stat", t.p_path(self._sb._route, path)))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except SandboxFileNotFoundError:
            return False

    async def mkdir(self, path: str, parents: bool = False) -> None:
        await self._call("files/mkdir", t.p_path(self._sb._route, path, parents=parents))

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._call("files/remove", t.p_path(self._sb._route, path, recursive=recursive))

    async def rename(self, src: str, dst: str) -> None:
        await self._call("files/rename", t.p_rename(self._sb._route, src, dst))

    async def upload(self, local_path: str, path: str,
                     on_progress: Optional[Callable[[int, Optional[int]], None]] = None) -> int:
        if self._sb._c.is_remote:
            with open(local_path, "rb") as f:
                return await self.write(path, f.read())
        from .sandbox import _progress

        r = await self._call("files/upload", t.p_transfer(self._sb._route, os.path.abspath(local_path), path),
                             on_note=_progress(on_progress))
        return int(r["size"])

    async def download(self, path: str, local_path: str,
                       on_progress: Optional[Callable[[int, Optional[int]], None]] = None) -> int:
        if self._sb._c.is_remote:
            data = await self.read_bytes(path)
            with open(local_path, "wb") as f:
                f.write(data)
            return len(data)
        from .sandbox import _progress

        r = await self._call("files/download", t.p_transfer(self._sb._route, os.path.abspath(local_path), path),
                             on_note=_progress(on_progress))
        return int(r["size"])

    async def watch(self, path: str = "", recursive: bool = False) -> AsyncWatch:
        p = {"sandbox": self._sb._route, "path": path or "/workspace", **({"recursive": True} if recursive else {})}
        r = await self._call("files/watch", p, kind=WATCH)
        return AsyncWatch(self._sb._c, r["watchId"])


class AsyncProcesses:
    def __init__(self, sb: "AsyncSandbox") -> None:
        self._sb = sb

    async def list(self) -> List[t.Record]:
        return t.processes(await self._sb._c.call("process/list", t.p_sandbox(self._sb._route)))

    async def kill(self, pid: int, signal: Optional[str] = None) -> None:
        await self._sb._c.call("process/kill", t.p_process_kill(self._sb._route, pid, signal))


class AsyncPorts:
    def __init__(self, sb: "AsyncSandbox") -> None:
        self._sb = sb

    async def url(self, port: int) -> t.Record:
        return t.Record(await self._sb._c.call("ports/url", t.p_port(self._sb._route, port)))


class AsyncSandbox:
    """As :class:`abx.Sandbox`, every call awaited: ``sb = await AsyncSandbox.create(...)``."""

    def __init__(self, info: Mapping[str, Any], connection: AsyncConnection) -> None:
        self._c = connection
        self._info = t.SandboxInfo(info)
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.ports = AsyncPorts(self)

    @classmethod
    async def create(cls, provider: Optional[str] = None, template: Optional[str] = None,
                     timeout: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                     network: Any = None, limits: Optional[Mapping[str, Any]] = None,
                     metadata: Optional[Mapping[str, str]] = None, mounts: Optional[List[Any]] = None, *,
                     host: Optional[str] = None, connection: Optional[AsyncConnection] = None) -> "AsyncSandbox":
        c = await _conn(connection, host)
        return cls(await c.call("sandbox/create", t.p_create(provider, template, timeout, env, network, limits,
                                                              metadata, mounts)), c)

    @classmethod
    async def connect(cls, sandbox_id: str, *, host: Optional[str] = None,
                      connection: Optional[AsyncConnection] = None) -> "AsyncSandbox":
        c = await _conn(connection, host)
        return cls(await c.call("sandbox/connect", t.p_sandbox(sandbox_id)), c)

    @classmethod
    async def list(cls, provider: Optional[str] = None, *, host: Optional[str] = None,
                   connection: Optional[AsyncConnection] = None) -> t.SandboxList:
        c = await _conn(connection, host)
        return t.sandbox_list(await c.call("sandbox/list", t.p_list(provider)))

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (``id``; E2B's name for it)."""
        return self._info.id

    @property
    def _route(self) -> str:
        return f"{self._info.provider}:{self._info.id}" if self._info.provider else self._info.id

    @property
    def provider(self) -> str:
        return self._info.provider

    @property
    def status(self) -> str:
        return self._info.status

    @property
    def last_info(self) -> t.SandboxInfo:
        return self._info

    @property
    def connection(self) -> AsyncConnection:
        return self._c

    async def info(self) -> t.SandboxInfo:
        self._info = t.SandboxInfo(await self._c.call("sandbox/info", t.p_sandbox(self._route)))
        return self._info

    async def refresh(self) -> "AsyncSandbox":
        await self.info()
        return self

    async def exec(self, cmd: t.Cmd, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   timeout: Optional[float] = None, stdin: Optional[t.Data] = None, *,
                   max_output: Optional[int] = None) -> t.ExecResult:
        return t.ExecResult(await self._c.call("exec/run", t.p_exec(self._route, cmd, env, cwd, timeout, stdin,
                                                                    max_output)))

    async def exec_stream(self, cmd: t.Cmd, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                          timeout: Optional[float] = None, stdin: Optional[t.Data] = None, *,
                          pty: Any = None) -> AsyncExecStream:
        r = await self._c.call("exec/start", t.p_exec(self._route, cmd, env, cwd, timeout, stdin, pty=pty,
                                                      stream=True), kind=STREAM)
        return AsyncExecStream(self._c, r)

    async def attach(self, exec_id: str) -> AsyncExecStream:
        """Take over a running streamed command by its exec id (``exec/attach``)."""
        r = await self._c.call("exec/attach", {"execId": exec_id}, kind=STREAM)
        s = AsyncExecStream(self._c, {"execId": r.get("execId", exec_id)})
        s.attached = t.Record(r)
        return s

    async def set_timeout(self, seconds: int) -> t.SandboxInfo:
        self._info = t.SandboxInfo(await self._c.call("sandbox/setTimeout", t.p_set_timeout(self._route, seconds)))
        return self._info

    async def pause(self) -> t.SandboxInfo:
        self._info = t.SandboxInfo(await self._c.call("sandbox/pause", t.p_sandbox(self._route)))
        return self._info

    async def resume(self) -> t.SandboxInfo:
        self._info = t.SandboxInfo(await self._c.call("sandbox/resume", t.p_sandbox(self._route)))
        return self._info

    async def kill(self) -> bool:
        return bool((await self._c.call("sandbox/kill", t.p_sandbox(self._route)) or {}).get("killed"))

    async def capabilities(self) -> t.Record:
        return t.Record(await self._c.call("sandbox/capabilities", t.p_sandbox(self._route)))

    async def system_info(self) -> t.Record:
        return t.Record(await self._c.call("sandbox/systemInfo", t.p_sandbox(self._route)))

    async def run_code(self, code: str, language: Optional[str] = None,
                       context: Optional[str] = None, timeout: Optional[float] = None,
                       env: Optional[Dict[str, str]] = None, *,
                       on_output: Optional[Callable[[t.CodeOutput], None]] = None) -> t.CodeResult:
        """As :meth:`abx.Sandbox.run_code` (``on_output`` is called on the event loop)."""
        rid, note = t.code_listener(on_output)
        return t.CodeResult(await self._c.call(
            "code/run", t.p_code(self._route, code, language, context, timeout, env, rid), on_note=note))

    async def set_network(self, network: Any) -> t.SandboxInfo:
        """Change the egress policy of the running sandbox (``{"allow": [...], "deny": [...]}``;
        ``network.vpc``): new connections follow it, open ones go on."""
        self._info = t.SandboxInfo(await self._c.call("sandbox/setNetwork", {"sandbox": self._route, "network": network}))
        return self._info

    async def diff(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None,
             patch: bool = False) -> List[t.Record]:
        """What the sandbox changed under its overlay mounts, against the host as it was at
        create: each ``{path, change, type, size, binary, mode?, symlink_target?, patch?}``
        (``patch=True``: a unified diff per text file)."""
        r = await self._c.call("sandbox/diff", t.p_changes(self._route, target, paths,
                                                        format="patch" if patch else None))
        return [t.Record(c) for c in (r or {}).get("changes", [])]

    async def apply(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None,
              dry_run: bool = False, force: bool = False) -> t.Record:
        """Write the sandbox's changes (all, or ``paths``) to the host, each file atomically:
        ``{applied, conflicts, skipped}``. A path the host changed since create is a conflict
        (left as it is) unless ``force``; the others are applied."""
        return t.Record(await self._c.call("sandbox/apply", t.p_changes(
            self._route, target, paths, dryRun=dry_run or None, force=force or None)))

    async def discard(self, paths: Optional[List[str]] = None, *, target: Optional[str] = None) -> List[str]:
        """Drop the sandbox's changes (all, or ``paths``): it sees the host's files again."""
        r = await self._c.call("sandbox/discard", t.p_changes(self._route, target, paths))
        return list((r or {}).get("discarded", []))

    async def log(self, since: Optional[int] = None, limit: Optional[int] = None) -> t.Record:
        """Every command run in the sandbox, with the client that asked: ``{entries, dropped,
        last}`` (pass ``last`` as ``since`` for what comes next)."""
        return t.Record(await self._c.call("sandbox/log", t.p_log(self._route, since, limit)))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, status={self.status!r})"


# -- providers, awaited ---------------------------------------------------------------------------

async def _plist(*, host: Optional[str] = None, connection: Optional[AsyncConnection] = None) -> List[t.Record]:
    c = await _conn(connection, host)
    return [t.Record(p) for p in (await c.call("provider/list") or {}).get("providers", [])]


async def _pinfo(id: str, *, host: Optional[str] = None, connection: Optional[AsyncConnection] = None) -> t.Record:
    return t.Record(await (await _conn(connection, host)).call("provider/info", t.p_id(id)))


async def _pinstall(source: str, *, subdir: Optional[str] = None, ref: Optional[str] = None,
                    sha256: Optional[str] = None, allow_unpinned: bool = False, allow_insecure_transport: bool = False,
                    yes: bool = False, confirm: Optional[Callable[[t.Record], bool]] = None, dry_run: bool = False,
                    replace: bool = False, host: Optional[str] = None,
                    connection: Optional[AsyncConnection] = None) -> t.Record:
    from .providers import install_source

    c = await _conn(connection, host)
    src = install_source(source, c.is_remote)

    def params(conf: bool, dry: bool) -> Dict[str, Any]:
        return t.p_install(src, subdir, ref, sha256, allow_unpinned, allow_insecure_transport, conf, dry, replace)

    if dry_run:
        return t.Record(await c.call("provider/install", params(False, True)))
    ok = yes
    if not ok and confirm is not None:
        plan = t.Record(await c.call("provider/install", params(False, True)))
        if not confirm(plan):
            raise make_error("E1009", "Aborted: nothing was installed.",
                             "Confirm the plan, or pass yes=True after reviewing.")
        ok = True
    return t.Record(await c.call("provider/install", params(ok, False)))


async def _puninstall(id: str, *, yes: bool = False, host: Optional[str] = None,
                      connection: Optional[AsyncConnection] = None) -> None:
    p = t.p_id(id)
    if yes:
        p["confirm"] = True
    await (await _conn(connection, host)).call("provider/uninstall", p)


async def _pdoctor(id: str, *, host: Optional[str] = None, connection: Optional[AsyncConnection] = None) -> t.Record:
    return t.Record(await (await _conn(connection, host)).call("provider/doctor", t.p_id(id)))


async def _ptest(id: str, filter: Optional[str] = None, *, concurrency: Optional[int] = None,
                 on_result: Optional[Callable[[t.Record], None]] = None, host: Optional[str] = None,
                 connection: Optional[AsyncConnection] = None) -> t.Record:
    def note(method: str, p: Dict[str, Any]) -> None:
        if method == "provider/testResult" and on_result is not None:
            on_result(t.Record(p))

    c = await _conn(connection, host)
    return t.Record(await c.call("provider/test", t.p_id(id, filter=filter, concurrency=concurrency), on_note=note))


providers = types.SimpleNamespace(list=_plist, info=_pinfo, install=_pinstall, uninstall=_puninstall,
                                  doctor=_pdoctor, test=_ptest)
"""``abx.aio.providers``: ``list, info, install, uninstall, doctor, test``, awaited (same
rules as :mod:`abx.providers`)."""

__all__ = ["AsyncConnection", "AsyncSandbox", "AsyncExecStream", "AsyncWatch", "AsyncFiles", "AsyncProcesses",
           "AsyncPorts", "providers", "default_connection"]
