"""E2B's ``AsyncSandbox`` (``e2b`` and ``e2b-code-interpreter``): the same members, awaited.
Each call runs the synchronous implementation in a worker thread (``asyncio.to_thread``);
callbacks may be plain functions or coroutine functions (run on the caller's loop)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Dict, List, Optional, Union

from ._code import Notes, Sandbox as _SyncCode, code_params, finish, run_id
from ._models import (
    CommandResult, Context, EntryInfo, Execution, ExecutionError, OutputMessage, Result, SandboxInfo, SandboxQuery,
    WriteInfo,
)
from ._sync import _TEMP, CommandHandle, Sandbox as _Sync, SandboxPaginator, WatchHandle, call


def _bridge(cb: Optional[Callable[..., Any]], loop: asyncio.AbstractEventLoop) -> Optional[Callable[..., Any]]:
    """A callback for a worker thread: a coroutine function runs on ``loop`` (waited for)."""
    if cb is None:
        return None
    if not inspect.iscoroutinefunction(cb):
        return cb

    def run(*a: Any) -> None:
        asyncio.run_coroutine_threadsafe(cb(*a), loop).result()

    return run


class _ClassOrInstanceAsync:
    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        sync_cls = owner._sync_cls
        name = self.name
        if obj is None:
            async def cls_variant(*a: Any, **kw: Any) -> Any:
                r = await asyncio.to_thread(getattr(sync_cls, name), *a, **kw)
                return owner._wrap_sync(r) if isinstance(r, _Sync) else r
            cls_variant.__name__ = name
            return cls_variant

        async def inst_variant(*a: Any, **kw: Any) -> Any:
            r = await asyncio.to_thread(getattr(obj._s, name), *a, **kw)
            return obj if r is obj._s else r
        inst_variant.__name__ = name
        inst_variant.__wrapped__ = getattr(sync_cls, name)  # type: ignore[attr-defined]
        return inst_variant


class AsyncCommandHandle:
    """A background command: output flows to the callbacks as it comes; ``await wait()``,
    ``await kill()``; ``stdout``, ``stderr``, ``exit_code``, ``error`` so far."""

    def __init__(self, h: CommandHandle, on_stdout: Any, on_stderr: Any, on_exit: Any = None) -> None:
        self._h = h
        loop = asyncio.get_running_loop()
        out, err = _bridge(on_stdout, loop), _bridge(on_stderr, loop)
        self._task = asyncio.ensure_future(asyncio.to_thread(self._drain, out, err))

    def _drain(self, out: Any, err: Any) -> Any:
        try:
            return self._h.wait(on_stdout=out, on_stderr=err)
        except BaseException as e:  # kept for wait()
            return e

    @property
    def pid(self) -> int:
        return self._h.pid

    @property
    def stdout(self) -> str:
        return "".join(self._h._out)

    @property
    def stderr(self) -> str:
        return "".join(self._h._err)

    @property
    def exit_code(self) -> Optional[int]:
        ex = self._h.stream.exit
        return None if ex is None else ex.exit_code

    @property
    def error(self) -> Optional[str]:
        r = self._h._result
        return None if r is None else r.error

    async def wait(self) -> CommandResult:
        r = await asyncio.shield(self._task)
        if isinstance(r, BaseException):
            raise r
        return r

    async def kill(self) -> bool:
        return await asyncio.to_thread(self._h.kill)

    async def send_stdin(self, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._h.send_stdin, data)

    async def close_stdin(self, request_timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._h.close_stdin)

    async def disconnect(self) -> None:
        self._h.disconnect()


class AsyncCommands:
    def __init__(self, sb: "AsyncSandbox") -> None:
        self._c = sb._s.commands

    async def run(self, cmd: str, background: Optional[bool] = None, envs: Optional[Dict[str, str]] = None,
                  user: Optional[str] = None, cwd: Optional[str] = None, on_stdout: Any = None, on_stderr: Any = None,
                  stdin: Optional[bool] = None, timeout: Optional[float] = 60, request_timeout: Optional[float] = None,
                  *, retain_output: bool = True) -> Any:
        loop = asyncio.get_running_loop()
        if background:
            h = await asyncio.to_thread(self._c.run, cmd, True, envs, user, cwd, None, None, stdin, timeout,
                                        retain_output=retain_output)
            return AsyncCommandHandle(h, on_stdout, on_stderr)
        return await asyncio.to_thread(self._c.run, cmd, False, envs, user, cwd, _bridge(on_stdout, loop),
                                       _bridge(on_stderr, loop), stdin, timeout, retain_output=retain_output)

    async def list(self, request_timeout: Optional[float] = None) -> List[Any]:
        return await asyncio.to_thread(self._c.list)

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self._c.kill, pid)

    async def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._c.send_stdin, pid, data)

    async def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._c.close_stdin, pid)

    def stream_input(self, pid: int, *, timeout: Optional[float] = 60.0) -> "AsyncCommandInputHandle":
        """An ordered input handle to the command's stdin (``send``, ``close``, ``async with``)."""
        return AsyncCommandInputHandle(self, pid)

    async def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None,
                      on_stdout: Any = None, on_stderr: Any = None, *, retain_output: bool = True) -> AsyncCommandHandle:
        h = await asyncio.to_thread(self._c.connect, pid, retain_output=retain_output)
        return AsyncCommandHandle(h, on_stdout, on_stderr)


class AsyncCommandInputHandle:
    """``commands.stream_input(pid)``: ``await send(data)`` in order, ``await close()``
    closes stdin (also on leaving ``async with``)."""

    def __init__(self, commands: "AsyncCommands", pid: int) -> None:
        self._c, self._pid = commands, pid
        self._closed = False

    async def send(self, data: Union[str, bytes]) -> None:
        await self._c.send_stdin(self._pid, data)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._c.close_stdin(self._pid)

    async def __aenter__(self) -> "AsyncCommandInputHandle":
        return self

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        await self.close()


class AsyncWatchHandle:
    """``files.watch_dir(path, on_event)``: events go to ``on_event`` as they come; ``await stop()``."""

    def __init__(self, w: WatchHandle, on_event: Any, on_exit: Any) -> None:
        self._w = w
        self._on_event, self._on_exit = on_event, on_exit
        self._stopped = False
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        err: Optional[Exception] = None
        try:
            while not self._stopped:
                c = await asyncio.to_thread(call, self._w._w.next, 0.2)
                if c is None or _TEMP.search(str(c.path)):
                    continue
                r = self._on_event(self._w._event(c))
                if inspect.isawaitable(r):
                    await r
        except Exception as e:  # noqa: BLE001 (given to on_exit, as E2B does)
            err = e if not self._stopped else None
        if self._on_exit is not None:
            r = self._on_exit(err)
            if inspect.isawaitable(r):
                await r

    async def stop(self) -> None:
        self._stopped = True
        await asyncio.to_thread(self._w.stop)
        await self._task


class AsyncFilesystem:
    def __init__(self, sb: "AsyncSandbox") -> None:
        self._f = sb._s.files

    async def read(self, path: str, format: str = "text", user: Optional[str] = None,
                   request_timeout: Optional[float] = None, gzip: bool = False,
                   stream_idle_timeout: Optional[float] = None) -> Any:
        r = await asyncio.to_thread(self._f.read, path, format, user)
        if format == "stream":
            chunks = await asyncio.to_thread(list, r)

            async def gen() -> Any:
                for c in chunks:
                    yield c
            return gen()
        return r

    async def write(self, path: str, data: Any, user: Optional[str] = None, request_timeout: Optional[float] = None,
                    gzip: bool = False, use_octet_stream: Optional[bool] = None,
                    metadata: Optional[Dict[str, str]] = None) -> WriteInfo:
        if hasattr(data, "__aiter__"):
            data = b"".join([bytes(c) async for c in data])
        return await asyncio.to_thread(self._f.write, path, data, user, None, gzip, use_octet_stream, metadata)

    async def write_files(self, files: List[Any], user: Optional[str] = None, request_timeout: Optional[float] = None,
                          gzip: bool = False, use_octet_stream: Optional[bool] = None,
                          metadata: Optional[Dict[str, str]] = None) -> List[WriteInfo]:
        return [await self.write(f["path"], f["data"], user, metadata=metadata) for f in files]

    async def list(self, path: str, depth: Optional[int] = 1, user: Optional[str] = None,
                   request_timeout: Optional[float] = None) -> List[EntryInfo]:
        return await asyncio.to_thread(self._f.list, path, depth, user)

    async def exists(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self._f.exists, path, user)

    async def get_info(self, path: str, user: Optional[str] = None,
                       request_timeout: Optional[float] = None) -> EntryInfo:
        return await asyncio.to_thread(self._f.get_info, path, user)

    async def make_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self._f.make_dir, path, user)

    async def remove(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> None:
        await asyncio.to_thread(self._f.remove, path, user)

    async def rename(self, old_path: str, new_path: str, user: Optional[str] = None,
                     request_timeout: Optional[float] = None) -> EntryInfo:
        return await asyncio.to_thread(self._f.rename, old_path, new_path, user)

    async def watch_dir(self, path: str, on_event: Callable[..., Any], on_exit: Any = None,
                        user: Optional[str] = None, request_timeout: Optional[float] = None,
                        timeout: Optional[float] = 60, recursive: bool = False, include_entry: bool = False,
                        allow_network_mounts: bool = False) -> AsyncWatchHandle:
        w = await asyncio.to_thread(self._f.watch_dir, path, user, None, recursive, include_entry,
                                    allow_network_mounts)
        return AsyncWatchHandle(w, on_event, on_exit)


class AsyncSandboxPaginator:
    def __init__(self, p: SandboxPaginator) -> None:
        self._p = p

    @property
    def has_next(self) -> bool:
        return self._p.has_next

    @property
    def next_token(self) -> Optional[str]:
        return self._p.next_token

    async def next_items(self) -> List[SandboxInfo]:
        return await asyncio.to_thread(self._p.next_items)


class AsyncSandbox:
    """E2B's ``AsyncSandbox`` (``e2b`` 2.63.0): ``await AsyncSandbox.create()``, then the
    members of :class:`abx.e2b.Sandbox`, awaited."""

    _sync_cls: Any = _Sync
    default_template = _Sync.default_template
    default_mcp_template = _Sync.default_mcp_template
    default_sandbox_timeout = _Sync.default_sandbox_timeout
    mcp_port = _Sync.mcp_port

    def __init__(self, **opts: Any) -> None:
        raise TypeError("Use 'await AsyncSandbox.create()' (E2B's AsyncSandbox has no public constructor).")

    @classmethod
    def _wrap_sync(cls, s: Any) -> Any:
        self = cls.__new__(cls)
        self._s = s
        self._commands = AsyncCommands(self)
        self._files = AsyncFilesystem(self)
        return self

    @classmethod
    async def create(cls, template: Optional[str] = None, timeout: Optional[int] = None,
                     metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
                     secure: Optional[bool] = None, allow_internet_access: Optional[bool] = None, mcp: Any = None,
                     network: Any = None, iam: Any = None, lifecycle: Any = None, volume_mounts: Any = None,
                     logger: Any = None, idempotency_key: Optional[str] = None, **opts: Any) -> Any:
        s = await asyncio.to_thread(cls._sync_cls.create, template, timeout, metadata, envs, secure,
                                    allow_internet_access, mcp, network, iam, lifecycle, volume_mounts, logger,
                                    idempotency_key, **opts)
        return cls._wrap_sync(s)

    @classmethod
    async def list(cls, query: Optional[SandboxQuery] = None, limit: Optional[int] = None,
                   next_token: Optional[str] = None, order: Optional[str] = None, **opts: Any) -> AsyncSandboxPaginator:
        return AsyncSandboxPaginator(cls._sync_cls.list(query, limit, next_token, order, **opts))

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, **opts: Any) -> bool:
        return cls._sync_cls.delete_snapshot(snapshot_id, **opts)

    connect = _ClassOrInstanceAsync("connect")
    kill = _ClassOrInstanceAsync("kill")
    set_timeout = _ClassOrInstanceAsync("set_timeout")
    get_info = _ClassOrInstanceAsync("get_info")
    pause = _ClassOrInstanceAsync("pause")
    beta_pause = _ClassOrInstanceAsync("beta_pause")
    get_metrics = _ClassOrInstanceAsync("get_metrics")
    update_network = _ClassOrInstanceAsync("update_network")
    create_snapshot = _ClassOrInstanceAsync("create_snapshot")
    fork = _ClassOrInstanceAsync("fork")
    list_snapshots = _ClassOrInstanceAsync("list_snapshots")

    @property
    def abx(self) -> Any:
        """The native (sync) :class:`abx.Sandbox` under it."""
        return self._s.abx

    @property
    def sandbox_id(self) -> str:
        return self._s.sandbox_id

    @property
    def files(self) -> AsyncFilesystem:
        return self._files

    @property
    def commands(self) -> AsyncCommands:
        return self._commands

    @property
    def pty(self) -> Any:
        return self._s.pty

    @property
    def git(self) -> Any:
        return self._s.git

    @property
    def sandbox_domain(self) -> Optional[str]:
        return self._s.sandbox_domain

    @property
    def envd_api_url(self) -> str:
        return self._s.envd_api_url

    @property
    def envd_direct_url(self) -> str:
        return self._s.envd_direct_url

    @property
    def traffic_access_token(self) -> Optional[str]:
        return self._s.traffic_access_token

    @property
    def connection_config(self) -> Any:
        return self._s.connection_config

    async def is_running(self, request_timeout: Optional[float] = None) -> bool:
        return await asyncio.to_thread(self._s.is_running)

    def get_host(self, port: int) -> str:
        return self._s.get_host(port)

    def download_url(self, path: str, user: Optional[str] = None, use_signature_expiration: Optional[int] = None) -> str:
        return self._s.download_url(path, user, use_signature_expiration)

    def upload_url(self, path: Optional[str] = None, user: Optional[str] = None,
                   use_signature_expiration: Optional[int] = None) -> str:
        return self._s.upload_url(path, user, use_signature_expiration)

    async def get_mcp_url(self) -> str:
        return self._s.get_mcp_url()

    async def get_mcp_token(self) -> Optional[str]:
        return self._s.get_mcp_token()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        await self.kill()

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r})"


class AsyncCodeSandbox(AsyncSandbox):
    """E2B code interpreter's ``AsyncSandbox``: ``await run_code(...)`` and contexts."""

    _sync_cls: Any = _SyncCode
    default_template = _SyncCode.default_template

    async def run_code(self, code: str, language: Optional[str] = None, context: Optional[Context] = None,
                       on_stdout: Optional[Callable[[OutputMessage], Any]] = None,
                       on_stderr: Optional[Callable[[OutputMessage], Any]] = None,
                       on_result: Optional[Callable[[Result], Any]] = None,
                       on_error: Optional[Callable[[ExecutionError], Any]] = None,
                       envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                       request_timeout: Optional[float] = None) -> Execution:
        loop = asyncio.get_running_loop()
        rid = run_id()
        p = code_params(self._s, code, language, context, envs, timeout, rid)
        lang = p.get("language") or (context.language if isinstance(context, Context) else "python")

        def invoke(cb: Any, arg: Any) -> None:
            r = cb(arg)
            if inspect.isawaitable(r):
                asyncio.run_coroutine_threadsafe(_await(r), loop).result()

        notes = Notes(rid, on_stdout, on_stderr, on_result, on_error, invoke)
        def run() -> Any:
            try:
                return call(self._s.abx.connection.call, "code/run", p, on_note=notes, timeout=request_timeout)
            finally:
                notes.close()

        r = await asyncio.to_thread(run)
        return finish(code, lang, r or {}, timeout, notes)

    async def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                                  request_timeout: Optional[float] = None) -> Context:
        return await asyncio.to_thread(self._s.create_code_context, cwd, language, request_timeout)

    async def list_code_contexts(self) -> List[Context]:
        return await asyncio.to_thread(self._s.list_code_contexts)

    async def restart_code_context(self, context: Union[Context, str]) -> None:
        await asyncio.to_thread(self._s.restart_code_context, context)

    async def remove_code_context(self, context: Union[Context, str]) -> None:
        await asyncio.to_thread(self._s.remove_code_context, context)


async def _await(r: Any) -> Any:
    return await r
