"""E2B's synchronous ``Sandbox``, ``Commands``, ``CommandHandle``, ``Filesystem`` and
``WatchHandle`` (``e2b`` 2.63.0) on the abx broker."""

from __future__ import annotations

import itertools
import re
import threading
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Tuple, Union

from .. import _types as t
from ..errors import AbxError, SandboxNotFoundError
from ..sandbox import ExecStream, Sandbox as _Native, Watch

if TYPE_CHECKING:
    import logging
from ._models import (
    KINDS, CommandExitException, CommandResult, EntryInfo, FilesystemEvent, InvalidArgumentException,
    NotFoundException, ProcessInfo, SandboxException, SandboxInfo, SandboxQuery, SandboxState, TimeoutException,
    WriteInfo, convert, to_abx, to_e2b, unsupported,
)

#: E2B's template names that mean "the provider's default sandbox" on abx.
DEFAULT_TEMPLATES = ("base", "code-interpreter-v1", "code-interpreter", "code-interpreter-beta")
#: ApiParams of E2B that name E2B's cloud (no meaning for a broker).
CLOUD_PARAMS = ("api_key", "access_token", "domain", "api_url", "sandbox_url", "debug", "headers", "proxy",
                "http_version", "sandbox_domain")
_UIDS: Dict[str, int] = {}


class _ClassOrInstance:
    """E2B's ``class_method_variant``: ``Sandbox.kill(sandbox_id)`` and ``sandbox.kill()``."""

    def __init__(self, cls_fn: Callable[..., Any], inst_fn: Callable[..., Any]) -> None:
        self._cls_fn, self._inst_fn = cls_fn, inst_fn
        self.__doc__ = inst_fn.__doc__
        self.__wrapped__ = inst_fn

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        if obj is None:
            return self._cls_fn.__get__(owner, owner)
        return self._inst_fn.__get__(obj, owner)


def honour_request_timeout(cls: Any) -> Any:
    """Class decorator: every method with E2B's ``request_timeout`` (a parameter, or in
    ``**opts``, E2B's ApiParams) bounds the broker calls it makes by it
    (``request_timeout_scope``), as E2B bounds its HTTP requests; ``commands.run`` is left
    out, as E2B leaves it out (its ``timeout`` bounds it)."""
    for name, v in list(vars(cls).items()):
        if name == "run" or name.startswith("__"):
            continue
        if isinstance(v, classmethod):
            f = _with_request_timeout(v.__func__)
            if f is not v.__func__:
                setattr(cls, name, classmethod(f))
        elif isinstance(v, _ClassOrInstance):
            cf = v._cls_fn.__func__ if isinstance(v._cls_fn, classmethod) else v._cls_fn
            wrapped = _with_request_timeout(cf)
            v._cls_fn = classmethod(wrapped) if isinstance(v._cls_fn, classmethod) else wrapped
            v._inst_fn = _with_request_timeout(v._inst_fn)
        elif callable(v) and hasattr(v, "__code__"):
            setattr(cls, name, _with_request_timeout(v))
    return cls


def _with_request_timeout(f: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    from .._conn import request_timeout_scope

    code = f.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    if "request_timeout" not in names and not code.co_flags & 0x08:  # no param, no **opts
        return f
    idx = names.index("request_timeout") if "request_timeout" in names[:code.co_argcount] else None

    @functools.wraps(f)
    def wrapper(*a: Any, **kw: Any) -> Any:
        rt = kw.get("request_timeout")
        if rt is None and idx is not None and len(a) > idx:
            rt = a[idx]
        with request_timeout_scope(rt):
            return f(*a, **kw)

    return wrapper


def call(f: Callable[..., Any], *a: Any, **kw: Any) -> Any:
    """Run ``f``; an :class:`~abx.AbxError` comes out as its E2B exception."""
    try:
        return f(*a, **kw)
    except AbxError as e:
        raise convert(e) from e


def api_opts(opts: Mapping[str, Any]) -> Dict[str, Any]:
    """E2B's ``**opts`` (ApiParams): ``host`` / ``connection`` / ``provider`` /
    ``request_timeout`` are honoured; E2B's cloud parameters are refused."""
    out: Dict[str, Any] = {}
    for k, v in opts.items():
        if k in ("host", "connection", "provider"):
            out[k] = v
        elif k == "request_timeout":
            continue  # honoured: the methods bound their broker calls by it (honour_request_timeout)
        elif k in CLOUD_PARAMS:
            if v is None:
                continue
            raise InvalidArgumentException(
                f"E2B's {k}= names E2B's cloud; abx drives sandboxes through the abx broker: drop it, and pass "
                f"host='ssh://user@machine' (or ABX_HOST) for a broker on another machine, provider= for another "
                f"provider.")
        else:
            raise InvalidArgumentException(f"Unknown option {k!r} (E2B's ApiParams or abx's host/provider/connection).")
    return out


def check_user(sb: "Sandbox", user: Optional[str]) -> None:
    """E2B's ``user``: ``"user"`` (the default) is the sandbox's own user; ``"root"`` is
    accepted where the sandbox's commands do run as root, else a clear error."""
    if user is None or user == "user":
        return
    if user == "root":
        uid = _UIDS.get(sb.sandbox_id)
        if uid is None:
            r = call(sb._abx.exec, "id -u")
            uid = _UIDS[sb.sandbox_id] = int((r.stdout or "-1").strip() or -1)
        if uid == 0:
            return
        raise InvalidArgumentException(
            "user='root': the sandbox's commands run as one user (uid %d here), not root; abx sandboxes have no "
            "user switch. Drop user=, or install what needs root into the sandbox's own directories "
            "(pip install --target /home/user/.site; abx.Sandbox.create(template=IMAGE) for a root file system)."
            % uid)
    raise InvalidArgumentException(f"user={user!r}: abx sandboxes have one user; use user='user' (the default).")


def _env_cwd(sb: "Sandbox", envs: Optional[Mapping[str, str]],
             cwd: Optional[str]) -> Tuple[Optional[Dict[str, str]], Optional[str]]:
    """E2B's default variables of commands (``E2B_SANDBOX``, ``E2B_SANDBOX_ID``), then ``envs``."""
    env = {"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": sb.sandbox_id, **(dict(envs) if envs else {})}
    return env, (to_abx(cwd) if cwd else None)


def _timeout(timeout: Optional[float]) -> Optional[float]:
    """E2B's command timeout: seconds; 0 is no limit."""
    if timeout is None or timeout == 0:
        return None
    return float(timeout)


def _exit_or_raise(stdout: Optional[str], stderr: Optional[str], ex: Any, cmd_timeout: Optional[float]) -> CommandResult:
    if ex.timed_out:
        raise TimeoutException(
            f"Command did not finish within its timeout ({cmd_timeout} s) and was killed: pass timeout= (seconds, "
            f"0 for no limit) to commands.run.")
    code = ex.exit_code if ex.exit_code is not None else (128 + 9 if ex.signal else -1)
    error = None if code == 0 else (f"signal: {ex.signal}" if ex.signal else f"exit status {code}")
    if code != 0:
        raise CommandExitException(stderr=stderr, stdout=stdout, exit_code=code, error=error)
    return CommandResult(stderr=stderr, stdout=stdout, exit_code=code, error=error)


@honour_request_timeout
class CommandHandle:
    """A command started with ``commands.run(..., background=True)`` (or ``connect``):
    ``pid``, ``wait()``, ``kill()``, ``send_stdin()``, ``close_stdin()``, ``disconnect()``;
    iterating it gives ``(stdout, stderr, pty)`` tuples as output comes. The abx stream
    (``exec_id``, ``stream``) is there too."""

    def __init__(self, stream: ExecStream, pid: int, on_stdout: Optional[Callable[[str], None]] = None,
                 on_stderr: Optional[Callable[[str], None]] = None, retain_output: bool = True,
                 cmd_timeout: Optional[float] = None) -> None:
        self.stream = stream
        self.exec_id = stream.exec_id
        self._pid = pid
        self._on_stdout, self._on_stderr = on_stdout, on_stderr
        self._retain = retain_output
        self._out: List[str] = []
        self._err: List[str] = []
        self._result: Optional[CommandResult] = None
        self._timeout = cmd_timeout
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self._pid

    def __iter__(self) -> Iterator[Tuple[Optional[str], Optional[str], Optional[bytes]]]:
        while True:
            ev = call(self.stream.next)
            if ev is None or isinstance(ev, t.ExecExit):
                return
            item = self._take(ev, None, None, None)
            if item is not None:
                yield item

    def _take(self, ev: t.ExecOutput, on_pty: Any, on_stdout: Any, on_stderr: Any) -> Optional[Tuple[Any, Any, Any]]:
        if ev.stream == "pty":
            if on_pty:
                on_pty(ev.data)
            return None, None, ev.data
        text = ev.text
        if ev.stream == "stderr":
            if self._retain:
                self._err.append(text)
            for cb in (self._on_stderr, on_stderr):
                if cb:
                    cb(text)
            return None, text, None
        if self._retain:
            self._out.append(text)
        for cb in (self._on_stdout, on_stdout):
            if cb:
                cb(text)
        return text, None, None

    def wait(self, on_pty: Optional[Callable[[bytes], None]] = None, on_stdout: Optional[Callable[[str], None]] = None,
             on_stderr: Optional[Callable[[str], None]] = None) -> CommandResult:
        """Wait for the end; raises :class:`CommandExitException` on a non-zero exit."""
        with self._lock:
            if self._result is None:
                while True:
                    ev = call(self.stream.next)
                    if ev is None:
                        break
                    if isinstance(ev, t.ExecOutput):
                        self._take(ev, on_pty, on_stdout, on_stderr)
            ex = self.stream.exit
            assert ex is not None
            out = "".join(self._out) if self._retain else None
            err = "".join(self._err) if self._retain else None
            self._result = CommandResult(stderr=err, stdout=out, exit_code=ex.exit_code or 0, error=None)
            return _exit_or_raise(out, err, ex, self._timeout)

    def kill(self) -> bool:
        """Kill the command (SIGKILL to its tree): True when it was running."""
        if self.stream.exit is not None:
            return False
        try:
            call(self.stream.kill)
        except NotFoundException:
            return False
        return True

    def send_stdin(self, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        call(self.stream.write, data)

    def close_stdin(self, request_timeout: Optional[float] = None) -> None:
        call(self.stream.close_stdin)

    def disconnect(self) -> None:
        """Stop receiving its output; the command keeps running (``commands.connect(pid)``)."""
        self.stream.detach()


@honour_request_timeout
class Commands:
    """``sandbox.commands``: ``run``, ``list``, ``kill``, ``send_stdin``, ``close_stdin``,
    ``stream_input``, ``connect``."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb
        self._execs: Dict[int, str] = {}
        self._fake_pids = itertools.count(1 << 22)

    def _start(self, cmd: str, envs: Optional[Dict[str, str]], user: Optional[str], cwd: Optional[str],
               timeout: Optional[float], stdin: Optional[bool]) -> Tuple[ExecStream, int]:
        check_user(self._sb, user)
        env, wd = _env_cwd(self._sb, envs, cwd)
        s = call(self._sb._abx.exec_stream, cmd, env=env, cwd=wd, timeout=_timeout(timeout))
        if not stdin:
            call(s.close_stdin)  # E2B: without stdin=True the command's stdin is closed
        pid = s.pid if s.pid is not None else next(self._fake_pids)
        self._execs[pid] = s.exec_id
        return s, pid

    def run(self, cmd: str, background: Optional[bool] = None, envs: Optional[Dict[str, str]] = None,
            user: Optional[str] = None, cwd: Optional[str] = None, on_stdout: Optional[Callable[[str], None]] = None,
            on_stderr: Optional[Callable[[str], None]] = None, stdin: Optional[bool] = None,
            timeout: Optional[float] = 60, request_timeout: Optional[float] = None, *,
            retain_output: bool = True) -> Any:
        """Run ``cmd`` (``sh -c``); foreground: a :class:`CommandResult` (a non-zero exit raises
        :class:`CommandExitException`, the timeout :class:`TimeoutException`); ``background=True``:
        a :class:`CommandHandle`. ``timeout`` s (default 60; 0: none). ``cwd`` default: the home."""
        if background:
            s, pid = self._start(cmd, envs, user, cwd, timeout, stdin)
            # E2B: a background command runs on after this client (its exit, Ctrl-C): the
            # handle still reads it, but does not end it; kill() / commands.kill(pid) do.
            s.detach()
            return CommandHandle(s, pid, on_stdout, on_stderr, retain_output, _timeout(timeout))
        if on_stdout is None and on_stderr is None and not stdin:
            check_user(self._sb, user)
            env, wd = _env_cwd(self._sb, envs, cwd)
            r = call(self._sb._abx.exec, cmd, env=env, cwd=wd, timeout=_timeout(timeout))
            out = r.stdout if retain_output else None
            err = r.stderr if retain_output else None
            return _exit_or_raise(out, err, r, _timeout(timeout))
        s, pid = self._start(cmd, envs, user, cwd, timeout, stdin)
        with s:
            return CommandHandle(s, pid, on_stdout, on_stderr, retain_output, _timeout(timeout)).wait()

    def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The sandbox's processes (``tag``, ``envs`` and ``cwd`` are not reported by abx)."""
        procs = call(self._sb._abx.processes.list)
        out = []
        for p in procs:
            argv = (p.command or "").split()
            out.append(ProcessInfo(pid=int(p.pid), tag=None, cmd=argv[0] if argv else "", args=argv[1:], envs={},
                                   cwd=None))
        return out

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kill a command (its tree) by pid: True when it was found."""
        ex = self._execs.get(pid)
        try:
            if ex is not None:
                call(self._sb._abx.connection.call, "exec/kill", t.p_exec_kill(ex, None, None))
                return True
            # Another client's command: the process and its descendants (its tree, as an
            # exec's kill), children first.
            procs = call(self._sb._abx.processes.list)
            kids: Dict[int, List[int]] = {}
            for p in procs:
                kids.setdefault(int(p.ppid or 0), []).append(int(p.pid))
            order: List[int] = []
            todo = [pid]
            while todo:
                q = todo.pop()
                order.append(q)
                todo.extend(kids.get(q, []))
            if pid not in {int(p.pid) for p in procs}:
                return False
            for q in reversed(order):
                try:
                    call(self._sb._abx.processes.kill, q, "KILL")
                except NotFoundException:
                    pass
        except NotFoundException:
            return False
        return True

    def _exec_id(self, pid: int) -> str:
        ex = self._execs.get(pid)
        if ex is None:
            raise NotFoundException(
                f"Process {pid} was not started by this client: abx reaches a command's stdin and stream by its exec "
                f"id (abx.Sandbox.attach(exec_id)); commands.kill(pid) and commands.list() work for any process.")
        return ex

    def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        call(self._sb._abx.connection.call, "exec/write", t.p_exec_write(self._exec_id(pid), data, False))

    def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        call(self._sb._abx.connection.call, "exec/write", t.p_exec_write(self._exec_id(pid), None, True))

    def stream_input(self, pid: int, data: Iterable[Union[str, bytes]], *, timeout: Optional[float] = 60.0) -> None:
        for chunk in data:
            self.send_stdin(pid, chunk)

    def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None, *,
                retain_output: bool = True) -> CommandHandle:
        """Re-attach to a running command (``exec/attach``): what it wrote meanwhile is replayed."""
        s = call(self._sb._abx.attach, self._exec_id(pid))
        return CommandHandle(s, pid, retain_output=retain_output)


#: The broker's own temporary files of atomic writes (``#<n>`` beside the file): not E2B events.
_TEMP = re.compile(r"(^|/)#[0-9]+$")


@honour_request_timeout
class WatchHandle:
    """``files.watch_dir``: ``get_new_events()`` returns what changed since the last call;
    ``stop()`` ends the watch."""

    def __init__(self, w: Watch, root: str, sb: "Sandbox", include_entry: bool) -> None:
        self._w = w
        self._root = root.rstrip("/")
        self._sb = sb
        self._entry = include_entry

    def _event(self, c: t.FileChange) -> FilesystemEvent:
        path = str(c.path)
        name = path[len(self._root) + 1:] if path.startswith(self._root + "/") else path
        entry = None
        if self._entry:
            try:
                entry = self._sb.files.get_info(to_e2b(path))
            except NotFoundException:
                entry = None
        return FilesystemEvent(name=name, type=KINDS.get(str(c.kind), KINDS["modified"]), entry=entry)

    def get_new_events(self, request_timeout: Optional[float] = None) -> List[FilesystemEvent]:
        out = []
        while True:
            c = call(self._w.next, 0.05)
            if c is None:
                return out
            if not _TEMP.search(str(c.path)):
                out.append(self._event(c))

    def stop(self, request_timeout: Optional[float] = None) -> None:
        call(self._w.close)


@honour_request_timeout
class Filesystem:
    """``sandbox.files``: ``read``, ``write``, ``write_files``, ``list``, ``exists``,
    ``get_info``, ``make_dir``, ``remove``, ``rename``, ``watch_dir``. ``/home/user`` is the
    sandbox's ``/workspace``; relative paths are under it."""

    def __init__(self, sb: "Sandbox") -> None:
        self._sb = sb

    @property
    def _f(self) -> Any:
        return self._sb._abx.files

    def read(self, path: str, format: Literal["text", "bytes", "stream"] = "text", user: Optional[str] = None,
             request_timeout: Optional[float] = None, gzip: bool = False,
             stream_idle_timeout: Optional[float] = None) -> Any:
        """``format="text"``: str; ``"bytes"``: bytearray; ``"stream"``: an iterator of bytes chunks."""
        check_user(self._sb, user)
        p = to_abx(path)
        if format == "text":
            return call(self._f.read, p)
        if format == "bytes":
            return bytearray(call(self._f.read_bytes, p))
        if format == "stream":
            return self._stream(p)
        raise InvalidArgumentException(f"format={format!r}: 'text', 'bytes' or 'stream'.")

    def _stream(self, p: str) -> Iterator[bytes]:
        c = self._sb._abx.connection
        off = 0
        first = call(c.call, "files/read", t.p_read(self._sb._abx._route, p, 0, None, True))
        r = first
        while True:
            data = t.decode(r.get("data", ""), r.get("encoding"))
            if data:
                yield data
            off += len(data)
            if r.get("eof", True) or not data:
                return
            r = call(c.call, "files/read", t.p_read(self._sb._abx._route, p, off, None, True))

    def write(self, path: str, data: Union[str, bytes, IO, Iterable[bytes]], user: Optional[str] = None,
              request_timeout: Optional[float] = None, gzip: bool = False, use_octet_stream: Optional[bool] = None,
              metadata: Optional[Dict[str, str]] = None) -> WriteInfo:
        """Write a file (parents are made); ``data``: str, bytes, a file object or an
        iterable of bytes."""
        check_user(self._sb, user)
        if metadata:
            raise InvalidArgumentException("files.write(metadata=): abx files carry no metadata; keep it beside the "
                                           "file (files.write(path + '.json', ...)).")
        p = to_abx(path)
        call(self._f.write, p, _bytes(data))
        name = p.rstrip("/").rpartition("/")[2]
        return WriteInfo(name=name, type=_models_file(), path=to_e2b(_abs(p)))

    def write_files(self, files: List[Mapping[str, Any]], user: Optional[str] = None,
                    request_timeout: Optional[float] = None, gzip: bool = False,
                    use_octet_stream: Optional[bool] = None,
                    metadata: Optional[Dict[str, str]] = None) -> List[WriteInfo]:
        """Write several files (``[{"path": ..., "data": ...}]``)."""
        return [self.write(f["path"], f["data"], user=user, metadata=metadata) for f in files]

    def list(self, path: str, depth: Optional[int] = 1, user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """The entries of a directory, down to ``depth`` levels (1: its own entries)."""
        check_user(self._sb, user)
        if depth is not None and depth < 1:
            raise InvalidArgumentException("depth should be at least one")
        p = to_abx(path)
        recursive = depth is None or depth > 1
        entries = call(self._f.list, p, recursive)
        root = _abs(p).rstrip("/")
        out = []
        for e in entries:
            rel = str(e.path)[len(root) + 1:] if str(e.path).startswith(root + "/") else str(e.name)
            if depth is not None and rel.count("/") + 1 > depth:
                continue
            out.append(EntryInfo.from_abx(e.to_dict()))
        return out

    def exists(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        check_user(self._sb, user)
        return bool(call(self._f.exists, to_abx(path)))

    def get_info(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        check_user(self._sb, user)
        return EntryInfo.from_abx(call(self._f.stat, to_abx(path)).to_dict())

    def make_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        """Make a directory (and its parents): False when it was already there."""
        check_user(self._sb, user)
        p = to_abx(path)
        if call(self._f.exists, p):
            return False
        call(self._f.mkdir, p, True)
        return True

    def remove(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> None:
        check_user(self._sb, user)
        call(self._f.remove, to_abx(path), True)

    def rename(self, old_path: str, new_path: str, user: Optional[str] = None,
               request_timeout: Optional[float] = None) -> EntryInfo:
        check_user(self._sb, user)
        call(self._f.rename, to_abx(old_path), to_abx(new_path))
        return self.get_info(new_path)

    def watch_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None,
                  recursive: bool = False, include_entry: bool = False,
                  allow_network_mounts: bool = False) -> WatchHandle:
        check_user(self._sb, user)
        p = _abs(to_abx(path))
        if allow_network_mounts:
            raise InvalidArgumentException("watch_dir(allow_network_mounts=True): abx watches /workspace and /tmp, "
                                           "not mounts; poll files.list there.")
        w = call(self._f.watch, p, recursive)
        return WatchHandle(w, p, self._sb, include_entry)


def _models_file() -> Any:
    from ._models import FileType

    return FileType.FILE


def _abs(p: str) -> str:
    return p if p.startswith("/") else "/workspace/" + p


def _bytes(data: Any) -> Union[str, bytes]:
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        d = data.read()
        return d if isinstance(d, (str, bytes)) else bytes(d)
    return b"".join(bytes(c) for c in data)


class _Unsupported:
    """A part of E2B with no counterpart: any member raises an error naming the nearest abx call."""

    def __init__(self, what: str, nearest: str) -> None:
        self._what, self._nearest = what, nearest

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise unsupported(f"{self._what}.{name}", self._nearest)


def _network(allow_internet_access: Optional[bool], network: Optional[Mapping[str, Any]]) -> Any:
    if network:
        allow = network.get("allow_out")
        deny = network.get("deny_out")
        other = set(network) - {"allow_out", "deny_out"}
        if other or callable(allow) or callable(deny):
            raise InvalidArgumentException(
                f"network= options {sorted(other) or 'with callables'} have no counterpart; abx takes allow/deny host "
                f"lists: abx.Sandbox.create(network={{'allow': [...], 'deny': [...]}}).")
        pol: Dict[str, Any] = {}
        if allow:
            pol["allow"] = list(allow)
        if deny:
            if "0.0.0.0/0" in deny and not allow:
                return "none"
            pol["deny"] = list(deny)
        return pol or ("internet" if allow_internet_access is not False else "none")
    if allow_internet_access is None:
        return None
    return "internet" if allow_internet_access else "none"


@honour_request_timeout
class Sandbox:
    """E2B's ``Sandbox`` (``e2b`` 2.63.0) on the abx broker: ``Sandbox.create()`` makes one on
    the default provider (``local`` unless ``ABX_PROVIDER`` says otherwise; ``provider=`` and
    ``host=`` choose). The native :class:`abx.Sandbox` is ``sandbox.abx``."""

    default_template = "base"
    default_mcp_template = "mcp-gateway"
    default_sandbox_timeout = 300
    mcp_port = 50005

    def __init__(self, template: Optional[str] = None, timeout: Optional[int] = None,
                 metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
                 **opts: Any) -> None:
        """Deprecated in E2B: use ``Sandbox.create()``. Creates a sandbox, as E2B's does."""
        other = type(self).create(template=template, timeout=timeout, metadata=metadata, envs=envs, **opts)
        self._adopt(other._abx)

    def _adopt(self, native: _Native) -> None:
        self._abx = native
        self._commands = Commands(self)
        self._filesystem = Filesystem(self)

    @classmethod
    def _wrap(cls, native: _Native) -> Any:
        self = cls.__new__(cls)
        self._adopt(native)
        return self

    # -- properties ---------------------------------------------------------------------------

    @property
    def abx(self) -> _Native:
        """The native :class:`abx.Sandbox` under it."""
        return self._abx

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (``provider:id`` reaches it whatever the default provider)."""
        return self._abx.id

    @property
    def files(self) -> Filesystem:
        return self._filesystem

    @property
    def commands(self) -> Commands:
        return self._commands

    @property
    def pty(self) -> Any:
        return _Unsupported("sandbox.pty", "sandbox.abx.exec_stream(cmd, pty=(cols, rows)) (write, resize, kill)")

    @property
    def git(self) -> Any:
        return _Unsupported("sandbox.git", "sandbox.commands.run('git ...')")

    @property
    def sandbox_domain(self) -> Optional[str]:
        """None: abx sandboxes are reached through the broker, not a domain (``get_host``)."""
        return None

    @property
    def envd_api_url(self) -> str:
        raise unsupported("Sandbox.envd_api_url", "the broker's socket: abx.resolve_socket()")

    @property
    def envd_direct_url(self) -> str:
        raise unsupported("Sandbox.envd_direct_url", "the broker's socket: abx.resolve_socket()")

    @property
    def traffic_access_token(self) -> Optional[str]:
        """None: ``get_host``'s address needs no token (its ``headers``: ``sandbox.abx.ports.url``)."""
        return None

    @property
    def connection_config(self) -> Any:
        return self._abx.connection

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def create(cls, template: Optional[str] = None, timeout: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
               secure: Optional[bool] = None, allow_internet_access: Optional[bool] = None, mcp: Any = None,
               network: Any = None, iam: Any = None, lifecycle: Any = None, volume_mounts: Any = None,
               logger: Optional[logging.Logger] = None, idempotency_key: Optional[str] = None, **opts: Any) -> Any:
        """Create a sandbox. ``template``: ``base`` / ``code-interpreter-v1`` (or None) is the
        provider's default sandbox; another name is the provider's template (``local``: an
        OCI image, ``abx template``). ``timeout``: seconds of life (default 300)."""
        o = api_opts(opts)
        if mcp is not None:
            raise unsupported("Sandbox.create(mcp=)", "abx mcp (the broker's own MCP server, docs/mcp.md)")
        if iam is not None:
            raise unsupported("Sandbox.create(iam=)", "abx secrets: abx.Sandbox.create(env=...) with the values")
        if volume_mounts:
            raise unsupported("Sandbox.create(volume_mounts=)",
                              "abx.Sandbox.create(mounts=['/host/dir:/workspace/x:ro']) (host directories)")
        if idempotency_key is not None:
            raise unsupported("Sandbox.create(idempotency_key=)", "Sandbox.list(query=SandboxQuery(metadata=...)) "
                              "then Sandbox.connect(id)")
        if lifecycle:
            ot = lifecycle.get("on_timeout") if isinstance(lifecycle, Mapping) else None
            action = ot.get("action") if isinstance(ot, Mapping) else ot
            if action not in (None, "kill") or lifecycle.get("auto_resume"):
                raise unsupported("Sandbox.create(lifecycle=) other than on_timeout='kill'",
                                  "sandbox.pause() / sandbox.abx.resume() by hand")
        tpl = None if (template is None or template in DEFAULT_TEMPLATES) else template
        native = call(_Native.create, provider=o.get("provider"), template=tpl,
                      timeout=timeout if timeout is not None else cls.default_sandbox_timeout, env=envs,
                      network=_network(allow_internet_access, network), metadata=metadata, host=o.get("host"),
                      connection=o.get("connection"))
        if logger is not None:
            logger.info("created sandbox %s (%s)", native.id, native.provider)
        return cls._wrap(native)

    @classmethod
    def _cls_connect(cls, sandbox_id: str, timeout: Optional[int] = None, logger: Optional[logging.Logger] = None, *,
                     on_resume: str = "restore", **opts: Any) -> Any:
        o = api_opts(opts)
        if on_resume not in ("restore", "reboot"):
            raise InvalidArgumentException("on_resume: 'restore' or 'reboot'")
        native = call(_Native.connect, sandbox_id, host=o.get("host"), connection=o.get("connection"))
        sb = cls._wrap(native)
        sb._on_connect(timeout)
        return sb

    def _inst_connect(self, timeout: Optional[int] = None, *, on_resume: str = "restore", **opts: Any) -> Any:
        api_opts(opts)
        self._on_connect(timeout)
        return self

    def _on_connect(self, timeout: Optional[int]) -> None:
        info = call(self._abx.info)
        if info.status == "paused":
            call(self._abx.resume)
        if timeout is not None:
            # E2B: a running sandbox's timeout only grows on connect.
            left = _left(info)
            if left is None or timeout > left:
                call(self._abx.set_timeout, int(timeout))

    connect = _ClassOrInstance(_cls_connect, _inst_connect)

    @classmethod
    def _cls_kill(cls, sandbox_id: str, **opts: Any) -> bool:
        o = api_opts(opts)
        try:
            native = _Native.connect(sandbox_id, host=o.get("host"), connection=o.get("connection"))
        except SandboxNotFoundError:
            return False
        return bool(call(native.kill))

    def _inst_kill(self, **opts: Any) -> bool:
        """Kill the sandbox: True when it was killed, False when it was not found."""
        api_opts(opts)
        return bool(call(self._abx.kill))

    kill = _ClassOrInstance(_cls_kill, _inst_kill)

    @classmethod
    def _cls_set_timeout(cls, sandbox_id: str, timeout: int, **opts: Any) -> None:
        o = api_opts(opts)
        native = call(_Native.connect, sandbox_id, host=o.get("host"), connection=o.get("connection"))
        call(native.set_timeout, int(timeout))

    def _inst_set_timeout(self, timeout: int, **opts: Any) -> None:
        """End the sandbox's life ``timeout`` seconds from now."""
        api_opts(opts)
        call(self._abx.set_timeout, int(timeout))

    set_timeout = _ClassOrInstance(_cls_set_timeout, _inst_set_timeout)

    @classmethod
    def _cls_get_info(cls, sandbox_id: str, **opts: Any) -> SandboxInfo:
        o = api_opts(opts)
        native = call(_Native.connect, sandbox_id, host=o.get("host"), connection=o.get("connection"))
        return SandboxInfo.from_abx(native.last_info.to_dict())

    def _inst_get_info(self, **opts: Any) -> SandboxInfo:
        api_opts(opts)
        return SandboxInfo.from_abx(call(self._abx.info).to_dict())

    get_info = _ClassOrInstance(_cls_get_info, _inst_get_info)

    @classmethod
    def _cls_pause(cls, sandbox_id: str, keep_memory: Optional[bool] = None, *, mode: Optional[str] = None,
                   strict: bool = False, **opts: Any) -> bool:
        o = api_opts(opts)
        native = call(_Native.connect, sandbox_id, host=o.get("host"), connection=o.get("connection"))
        return cls._wrap(native)._inst_pause(keep_memory, mode=mode, strict=strict)

    def _inst_pause(self, keep_memory: Optional[bool] = None, *, mode: Optional[str] = None, strict: bool = False,
                    **opts: Any) -> bool:
        """Pause (``sandbox/pause``: its processes stop, memory and files kept): False when it
        was already paused (``strict=True``: raises then)."""
        api_opts(opts)
        if keep_memory is False or mode not in (None, "full"):
            raise unsupported("pause(keep_memory=False / mode='filesystem')",
                              "sandbox.pause() (abx keeps memory and files), or sandbox.kill()")
        if self._abx.info().status == "paused":
            if strict:
                raise SandboxException(f"Sandbox {self.sandbox_id} is already paused.")
            return False
        call(self._abx.pause)
        return True

    pause = _ClassOrInstance(_cls_pause, _inst_pause)

    def _inst_beta_pause(self, keep_memory: Optional[bool] = None, *, mode: Optional[str] = None,
                         **opts: Any) -> bool:
        return self._inst_pause(keep_memory, mode=mode, **opts)

    beta_pause = _ClassOrInstance(_cls_pause, _inst_beta_pause)

    @classmethod
    def _cls_get_metrics(cls, sandbox_id: str, start: Any = None, end: Any = None, **opts: Any) -> Any:
        raise unsupported("Sandbox.get_metrics", "sandbox.abx.system_info() and sandbox.commands.run('cat "
                          "/sys/fs/cgroup/memory.current')")

    def _inst_get_metrics(self, start: Any = None, end: Any = None, **opts: Any) -> Any:
        return self._cls_get_metrics(self.sandbox_id, start, end)

    get_metrics = _ClassOrInstance(_cls_get_metrics, _inst_get_metrics)

    @classmethod
    def _cls_update_network(cls, sandbox_id: str, network: Any, **opts: Any) -> None:
        o = api_opts(opts)
        native = call(_Native.connect, sandbox_id, host=o.get("host"), connection=o.get("connection"))
        cls._wrap(native)._inst_update_network(network)

    def _inst_update_network(self, network: Any, **opts: Any) -> None:
        api_opts(opts)
        call(self._abx.set_network, _network(None, network) or "none")

    update_network = _ClassOrInstance(_cls_update_network, _inst_update_network)

    @classmethod
    def _cls_create_snapshot(cls, sandbox_id: str, name: Optional[str] = None, *, mode: Optional[str] = None,
                             **opts: Any) -> Any:
        raise unsupported("Sandbox.create_snapshot", "sandbox.pause() (the sandbox keeps its state), or "
                          "sandbox.abx.diff() / apply() for a mounted directory's changes")

    def _inst_create_snapshot(self, name: Optional[str] = None, *, mode: Optional[str] = None, **opts: Any) -> Any:
        return self._cls_create_snapshot(self.sandbox_id, name, mode=mode)

    create_snapshot = _ClassOrInstance(_cls_create_snapshot, _inst_create_snapshot)

    @classmethod
    def _cls_fork(cls, sandbox_id: str, timeout: Optional[int] = None, count: Optional[int] = None,
                  logger: Optional[logging.Logger] = None, **opts: Any) -> Any:
        raise unsupported("Sandbox.fork", "Sandbox.create() with the same template and files.write of the files")

    def _inst_fork(self, timeout: Optional[int] = None, count: Optional[int] = None, **opts: Any) -> Any:
        return self._cls_fork(self.sandbox_id, timeout, count)

    fork = _ClassOrInstance(_cls_fork, _inst_fork)

    @classmethod
    def _cls_list_snapshots(cls, sandbox_id: Optional[str] = None, limit: Optional[int] = None,
                            next_token: Optional[str] = None, name: Optional[str] = None, **opts: Any) -> Any:
        raise unsupported("Sandbox.list_snapshots", "Sandbox.list() (paused sandboxes keep their state)")

    def _inst_list_snapshots(self, limit: Optional[int] = None, next_token: Optional[str] = None,
                             name: Optional[str] = None, **opts: Any) -> Any:
        return self._cls_list_snapshots(self.sandbox_id, limit, next_token, name)

    list_snapshots = _ClassOrInstance(_cls_list_snapshots, _inst_list_snapshots)

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, **opts: Any) -> bool:
        raise unsupported("Sandbox.delete_snapshot", "Sandbox.kill(sandbox_id)")

    @classmethod
    def list(cls, query: Optional[SandboxQuery] = None, limit: Optional[int] = None,
             next_token: Optional[str] = None, order: Optional[str] = None, **opts: Any) -> "SandboxPaginator":
        """The sandboxes (every provider's), filtered by ``query`` (metadata, state): a
        paginator (``has_next``, ``next_items()``)."""
        o = api_opts(opts)
        return SandboxPaginator(query, limit, next_token, order, o)

    def is_running(self, request_timeout: Optional[float] = None) -> bool:
        try:
            return self._abx.info().status == "running"
        except (SandboxNotFoundError, AbxError) as e:
            if isinstance(e, SandboxNotFoundError) or getattr(e, "code", "") in ("E2009", "E2002", "E2003"):
                return False
            raise convert(e) from e

    def get_host(self, port: int) -> str:
        """``host:port`` at which this machine reaches ``port`` of the sandbox (abx forwards
        it: ``local`` answers ``127.0.0.1:PORT``, plain HTTP). E2B's is a domain for https."""
        u = call(self._abx.ports.url, port)
        url = str(u.url)
        return url.split("://", 1)[-1].rstrip("/")

    def download_url(self, path: str, user: Optional[str] = None, use_signature_expiration: Optional[int] = None) -> str:
        raise unsupported("Sandbox.download_url", "sandbox.abx.files.download(path, local_path)")

    def upload_url(self, path: Optional[str] = None, user: Optional[str] = None,
                   use_signature_expiration: Optional[int] = None) -> str:
        raise unsupported("Sandbox.upload_url", "sandbox.abx.files.upload(local_path, path)")

    def get_mcp_url(self) -> str:
        raise unsupported("Sandbox.get_mcp_url", "abx mcp (the broker's own MCP server, docs/mcp.md)")

    def get_mcp_token(self) -> Optional[str]:
        raise unsupported("Sandbox.get_mcp_token", "abx mcp (the broker's own MCP server, docs/mcp.md)")

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.kill()

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r})"


def _left(info: t.SandboxInfo) -> Optional[float]:
    from datetime import datetime, timezone

    from ._models import _time

    if not info.expires_at:
        return None
    return (_time(info.expires_at) - datetime.now(timezone.utc)).total_seconds()


@honour_request_timeout
class SandboxPaginator:
    """``Sandbox.list()``: ``has_next``, ``next_token``, ``next_items()``. abx lists every
    sandbox at once: one page (``limit`` cuts it)."""

    def __init__(self, query: Optional[SandboxQuery], limit: Optional[int], next_token: Optional[str],
                 order: Optional[str], opts: Mapping[str, Any]) -> None:
        self.query, self.limit, self.order = query, limit, order
        self._next_token = next_token
        self._opts = opts
        self._has_next = True

    @property
    def has_next(self) -> bool:
        return self._has_next

    @property
    def next_token(self) -> Optional[str]:
        """None: abx answers with every sandbox at once."""
        return None if not self._has_next else self._next_token

    def next_items(self) -> List[SandboxInfo]:
        if not self._has_next:
            raise SandboxException("No more items to fetch")
        self._has_next = False
        sbs = call(_Native.list, self._opts.get("provider"), host=self._opts.get("host"),
                   connection=self._opts.get("connection"))
        out = [SandboxInfo.from_abx(s.to_dict()) for s in sbs]
        q = self.query
        if q is not None:
            if q.metadata:
                out = [s for s in out if all(s.metadata.get(k) == v for k, v in q.metadata.items())]
            if q.state:
                states = {SandboxState(s) for s in q.state}
                out = [s for s in out if s.state in states]
            if q.started_after is not None:
                after = q.started_after if q.started_after.tzinfo else q.started_after.astimezone()
                out = [s for s in out if s.started_at > after]
            if q.template is not None:
                out = [s for s in out if s.template_id == q.template or
                       (q.template in DEFAULT_TEMPLATES and s.template_id == "base")]
        out.sort(key=lambda s: s.started_at, reverse=self.order != "asc")
        return out[: self.limit] if self.limit else out


__all__ = ["Sandbox", "Commands", "CommandHandle", "Filesystem", "WatchHandle", "SandboxPaginator"]
