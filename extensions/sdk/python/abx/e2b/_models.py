"""E2B's data classes and exceptions (``e2b`` 2.63.0, ``e2b-code-interpreter`` 2.11.5), with
the same names, fields and behaviour, filled from the broker's replies."""

from __future__ import annotations

import json as _json
from datetime import datetime
from enum import Enum
from typing import Any, Dict, Iterable, List, Mapping, Optional

from .. import errors as _e

HOME = "/home/user"
WORKSPACE = "/workspace"


# -- data classes ----------------------------------------------------------------------------------
# E2B's are dataclasses; ``dataclasses`` imports ``inspect`` (tens of ms at start-up), so these
# are a small equivalent: fields from the annotations (base classes first), defaults from the
# class, ``_Factory`` for mutable ones, ``_KW_ONLY`` names after the positional ones.

class _Factory:
    def __init__(self, make: Any) -> None:
        self.make = make


_MISSING = object()


class _Data:
    _fields: tuple = ()
    _kw_only: frozenset = frozenset()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        names: List[str] = []
        for k in reversed(cls.__mro__):
            if not issubclass(k, _Data):
                continue
            for n in k.__dict__.get("__annotations__", {}):
                if not n.startswith("_") and n not in names:
                    names.append(n)
        kwo = set()
        for k in cls.__mro__:
            kwo |= set(k.__dict__.get("_KW_ONLY", ()))
        cls._kw_only = frozenset(kwo)
        cls._fields = tuple([n for n in names if n not in kwo] + [n for n in names if n in kwo])

    def __init__(self, *args: Any, **kw: Any) -> None:
        pos = [n for n in self._fields if n not in self._kw_only]
        if len(args) > len(pos):
            raise TypeError(f"{type(self).__name__}() takes {len(pos)} positional arguments")
        vals = dict(zip(pos, args))
        for k, v in kw.items():
            if k not in self._fields or k in vals:
                raise TypeError(f"{type(self).__name__}() got an unexpected or repeated argument {k!r}")
            vals[k] = v
        for n in self._fields:
            if n not in vals:
                d = getattr(type(self), n, _MISSING)
                if d is _MISSING:
                    raise TypeError(f"{type(self).__name__}() missing argument {n!r}")
                vals[n] = d.make() if isinstance(d, _Factory) else d
            object.__setattr__(self, n, vals[n])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._fields)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self._fields)

    __hash__ = None  # type: ignore[assignment]


# -- paths: E2B's home is /home/user, the broker's /workspace ---------------------------------

def to_abx(path: str) -> str:
    """E2B path to broker path: ``/home/user[/x]`` is ``/workspace[/x]``; relative paths are
    relative to the home in both."""
    if path == HOME or path == HOME + "/":
        return WORKSPACE
    if path.startswith(HOME + "/"):
        return WORKSPACE + path[len(HOME):]
    return path


def to_e2b(path: str) -> str:
    if path == WORKSPACE:
        return HOME
    if path.startswith(WORKSPACE + "/"):
        return HOME + path[len(WORKSPACE):]
    return path


# -- exceptions -----------------------------------------------------------------------------------

class SandboxException(Exception):
    """Base of E2B's exceptions. Raised from an :class:`~abx.AbxError` it keeps it as
    ``__cause__`` and its ``code`` and ``suggestion``."""

    code: Optional[str] = None
    suggestion: str = ""
    #: E2B: the HTTP status of the API reply; abx has no HTTP: always None.
    status_code: Optional[int] = None

    def __init__(self, *args: Any, status_code: Optional[int] = None) -> None:
        super().__init__(*args)
        self.status_code = status_code


class TimeoutException(SandboxException):
    pass


class InvalidArgumentException(SandboxException):
    pass


class NotEnoughSpaceException(SandboxException):
    pass


class NotFoundException(SandboxException):
    pass


class FileNotFoundException(NotFoundException):
    pass


class SandboxNotFoundException(NotFoundException):
    pass


class AuthenticationException(Exception):
    pass


class TemplateException(SandboxException):
    pass


class RateLimitException(SandboxException):
    pass


class BuildException(Exception):
    pass


class FileUploadException(BuildException):
    pass


class GitAuthException(AuthenticationException):
    pass


class GitUpstreamException(SandboxException):
    pass


class SandboxNotRunningException(SandboxException):
    pass


class SandboxUnreachableException(SandboxException):
    pass


class GuestUnresponsiveException(SandboxException):
    pass


class ServiceBusyException(SandboxException):
    pass


class VolumeException(SandboxException):
    pass


class VolumeNotFoundException(VolumeException, NotFoundException):
    pass


class VolumePathNotFoundException(VolumeException, NotFoundException):
    pass


class SecretException(SandboxException):
    pass


class SecretNotFoundException(SecretException, NotFoundException):
    pass


class NotSupportedException(InvalidArgumentException):
    """An E2B member with no counterpart in abx: the message names the nearest abx call."""


def unsupported(member: str, nearest: str) -> NotSupportedException:
    return NotSupportedException(f"E2B's {member} has no counterpart in the abx broker. Nearest abx call: {nearest}.")


def convert(err: BaseException) -> BaseException:
    """An :class:`~abx.AbxError` as the E2B exception of its meaning (the original as cause)."""
    if not isinstance(err, _e.AbxError):
        return err
    msg = str(err)
    if isinstance(err, _e.SandboxFileNotFoundError):
        cls: type = FileNotFoundException
    elif isinstance(err, (_e.SandboxNotFoundError, _e.SandboxExpiredError)):
        cls = SandboxNotFoundException
    elif isinstance(err, _e.SandboxNotRunningError):
        cls = SandboxNotRunningException
    elif isinstance(err, _e.TemplateNotFoundError):
        cls = TemplateException
    elif isinstance(err, _e.ExecTimeoutError) or err.code == "E1006":
        cls = TimeoutException
    elif isinstance(err, (_e.InvalidParamsError, _e.UsageError, _e.InvalidTimeoutError,
                          _e.PathOutsideSandboxError)):
        cls = InvalidArgumentException
    elif err.code in ("E4012", "E4013"):
        cls = NotEnoughSpaceException
    elif isinstance(err, (_e.ExecNotFoundError, _e.ProcessNotFoundError)):
        cls = NotFoundException
    elif isinstance(err, _e.BusyError):
        cls = ServiceBusyException
    elif isinstance(err, _e.BrokerUnreachableError):
        cls = SandboxUnreachableException
    else:
        cls = SandboxException
    if err.code in ("E4014", "E4002"):
        msg += ("\n  (abx.e2b: E2B's home /home/user is the sandbox's /workspace, where relative paths go; /tmp is "
                "writable too)")
    out = cls(msg)
    if isinstance(out, SandboxException):
        out.code = err.code
        out.suggestion = err.suggestion
    out.__cause__ = err
    return out


# -- commands --------------------------------------------------------------------------------------

Stdout = str
Stderr = str
PtyOutput = bytes


class PtySize(_Data):
    rows: int
    cols: int


class CommandResult(_Data):
    """Command execution result."""

    stderr: Optional[str]
    stdout: Optional[str]
    exit_code: int
    error: Optional[str]


class CommandExitException(CommandResult, SandboxException):
    """Raised when a command exits with a non-zero exit code."""

    def __str__(self) -> str:
        if self.stderr is None:
            return f"Command exited with code {self.exit_code}"
        return f"Command exited with code {self.exit_code} and error:\n{self.stderr}"


class ProcessInfo(_Data):
    """A process of the sandbox (``commands.list()``)."""

    pid: int
    tag: Optional[str]
    cmd: str
    args: List[str]
    envs: Dict[str, str]
    cwd: Optional[str]


# -- files -------------------------------------------------------------------------------------------

class FileType(Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


def _ftype(s: Optional[str]) -> Optional[FileType]:
    return {"file": FileType.FILE, "dir": FileType.DIR, "directory": FileType.DIR,
            "symlink": FileType.SYMLINK}.get(s or "")


class WriteInfo(_Data):
    name: str
    type: Optional[FileType]
    path: str
    metadata: Optional[Dict[str, str]] = None
    _KW_ONLY = ("metadata",)

    @classmethod
    def from_dict(cls, payload: Dict) -> "WriteInfo":
        return cls(name=payload["name"], type=_ftype(payload.get("type")), path=payload["path"],
                   metadata=payload.get("metadata"))


def _perm(mode: int, t: Optional[FileType]) -> str:
    s = {FileType.DIR: "d", FileType.SYMLINK: "l"}.get(t, "-")  # type: ignore[arg-type]
    for i in range(9):
        s += "rwx"[i % 3] if mode & (1 << (8 - i)) else "-"
    return s


def _time(s: Optional[str]) -> datetime:
    if not s:
        return datetime.fromtimestamp(0)
    s = s.rstrip("Z")
    head, _, frac = s.partition(".")
    base = datetime.fromisoformat(head)
    if frac:
        base = base.replace(microsecond=int((frac + "000000")[:6]))
    from datetime import timezone

    return base.replace(tzinfo=timezone.utc)


class EntryInfo(WriteInfo):
    """A file system entry. ``owner``/``group``: the broker does not report them (empty)."""

    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    modified_time: datetime
    symlink_target: Optional[str] = None

    @classmethod
    def from_abx(cls, e: Mapping[str, Any]) -> "EntryInfo":
        t = _ftype(e.get("type"))
        m = e.get("mode") or 0
        mode = (int(m, 8) if isinstance(m, str) else int(m)) & 0o7777
        path = to_e2b(str(e.get("path", "")))
        name = e.get("name") or path.rstrip("/").rpartition("/")[2]
        return cls(name=name, type=t, path=path, size=int(e.get("size") or 0), mode=mode,
                   permissions=_perm(mode, t), owner="", group="", modified_time=_time(e.get("modifiedAt")),
                   symlink_target=None)


class FilesystemEventType(Enum):
    CHMOD = "chmod"
    CREATE = "create"
    REMOVE = "remove"
    RENAME = "rename"
    WRITE = "write"


class FilesystemEvent(_Data):
    name: str
    type: FilesystemEventType
    entry: Optional[EntryInfo] = None


KINDS = {"created": FilesystemEventType.CREATE, "modified": FilesystemEventType.WRITE,
         "removed": FilesystemEventType.REMOVE, "renamed": FilesystemEventType.RENAME}


# -- sandboxes ----------------------------------------------------------------------------------------

class SandboxState(str, Enum):
    RUNNING = "running"
    PAUSED = "paused"


class SandboxInfo(_Data):
    """``get_info()`` / ``list()``: what the broker knows of a sandbox. ``cpu_count``,
    ``memory_mb`` and ``disk_size_mb`` are the limits given at create (None: none given)."""

    sandbox_id: str
    template_id: str
    name: Optional[str]
    metadata: Dict[str, str]
    started_at: datetime
    end_at: datetime
    state: SandboxState
    cpu_count: Optional[int] = None
    memory_mb: Optional[int] = None
    disk_size_mb: Optional[int] = None
    envd_version: Optional[str] = None
    sandbox_domain: Optional[str] = None
    allow_internet_access: Optional[bool] = None
    network: Optional[Any] = None
    lifecycle: Optional[Any] = None
    volume_mounts: List[Dict[str, str]] = _Factory(list)  # type: ignore[assignment]
    envd_unresponsive_at_pause: Optional[bool] = None
    provider: Optional[str] = None

    @classmethod
    def from_abx(cls, r: Mapping[str, Any]) -> "SandboxInfo":
        st = r.get("status") or "running"
        return cls(sandbox_id=str(r.get("id")), template_id=str(r.get("template") or "base"),
                   name=r.get("template") or "base", metadata=dict(r.get("metadata") or {}),
                   started_at=_time(r.get("startedAt")), end_at=_time(r.get("expiresAt")),
                   state=SandboxState.PAUSED if st == "paused" else SandboxState.RUNNING,
                   sandbox_domain=None, provider=r.get("provider"),
                   allow_internet_access=None if r.get("network") is None else r.get("network") != "none",
                   network=r.get("network"), lifecycle={"on_timeout": "kill", "auto_resume": False},
                   volume_mounts=[{"path": m.get("target", ""), "name": m.get("source", "")}
                                  for m in (r.get("mounts") or [])])


class SandboxQuery(_Data):
    metadata: Optional[Dict[str, str]] = None
    state: Optional[List[SandboxState]] = None
    started_after: Optional[datetime] = None
    template: Optional[str] = None


# -- code interpreter ---------------------------------------------------------------------------------

class OutputMessage(_Data):
    line: str
    timestamp: int
    error: bool = False

    def __str__(self) -> str:
        return self.line


class ExecutionError:
    """An error of a cell: ``name`` (the exception type), ``value`` (its message), ``traceback``."""

    name: str
    value: str
    traceback: str

    def __init__(self, name: str, value: str, traceback: str, **kwargs: Any) -> None:
        self.name = name
        self.value = value
        self.traceback = traceback

    def to_json(self) -> str:
        return _json.dumps({"name": self.name, "value": self.value, "traceback": self.traceback})

    def __repr__(self) -> str:
        return f"ExecutionError(name={self.name!r}, value={self.value!r})"


class MIMEType(str):
    pass


_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
         "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
         "application/json": "json", "application/javascript": "javascript"}


class Result:
    """One result of a cell (a display or the cell's value), each MIME type an attribute:
    ``text`` (text/plain), ``html``, ``markdown``, ``svg``, ``png`` (base64), ``jpeg``
    (base64), ``pdf``, ``latex``, ``json``, ``javascript``, ``data``; other types in
    ``extra``. ``is_main_result``: the cell's value (its last expression); ``chart``: None
    (abx does not extract chart data)."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[dict] = None
    javascript: Optional[str] = None
    data: Optional[dict] = None
    chart: Optional[Any] = None
    is_main_result: bool = False
    extra: Optional[dict] = None

    def __init__(self, text: Optional[str] = None, html: Optional[str] = None, markdown: Optional[str] = None,
                 svg: Optional[str] = None, png: Optional[str] = None, jpeg: Optional[str] = None,
                 pdf: Optional[str] = None, latex: Optional[str] = None, json: Optional[dict] = None,
                 javascript: Optional[str] = None, data: Optional[dict] = None, chart: Optional[dict] = None,
                 is_main_result: bool = False, extra: Optional[dict] = None, **kwargs: Any) -> None:
        self.text, self.html, self.markdown, self.svg = text, html, markdown, svg
        self.png, self.jpeg, self.pdf, self.latex = png, jpeg, pdf, latex
        self.json, self.javascript, self.data = json, javascript, data
        self.chart = None
        self.is_main_result = is_main_result
        self.extra = extra

    @classmethod
    def from_bundle(cls, bundle: Mapping[str, Any], is_main_result: bool = False) -> "Result":
        kw: Dict[str, Any] = {}
        extra: Dict[str, Any] = {}
        for k, v in bundle.items():
            name = _MIME.get(k)
            if name is not None:
                kw[name] = v
            else:
                extra[k] = v
        return cls(is_main_result=is_main_result, extra=extra or None, **kw)

    def __getitem__(self, item: str) -> Any:
        return getattr(self, item)

    def formats(self) -> Iterable[str]:
        out = [n for n in ("html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data")
               if getattr(self, n)]
        if self.chart:
            out.append("chart")
        out.extend((self.extra or {}).keys())
        return out

    def __str__(self) -> str:
        return self.text or ""

    def __repr__(self) -> str:
        return f"Result({self.text})" if self.text else f"Result(Formats: {', '.join(self.formats())})"

    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg

    def _repr_png_(self) -> Optional[str]:
        return self.png

    def _repr_jpeg_(self) -> Optional[str]:
        return self.jpeg

    def _repr_pdf_(self) -> Optional[str]:
        return self.pdf

    def _repr_latex_(self) -> Optional[str]:
        return self.latex

    def _repr_json_(self) -> Optional[dict]:
        return self.json

    def _repr_javascript_(self) -> Optional[str]:
        return self.javascript


class Logs(_Data):
    stdout: List[str] = _Factory(list)  # type: ignore[assignment]
    stderr: List[str] = _Factory(list)  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Logs(stdout: {self.stdout}, stderr: {self.stderr})"

    def to_json(self) -> str:
        return _json.dumps({"stdout": self.stdout, "stderr": self.stderr})


class Execution(_Data):
    """The result of ``run_code``: ``results``, ``logs``, ``error``, ``execution_count``;
    ``text``: the main result's text."""

    results: List[Result] = _Factory(list)  # type: ignore[assignment]
    logs: Logs = _Factory(Logs)  # type: ignore[assignment]
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    def __repr__(self) -> str:
        return f"Execution(Results: {self.results}, Logs: {self.logs}, Error: {self.error})"

    @property
    def text(self) -> Optional[str]:
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def to_json(self) -> str:
        return _json.dumps({
            "results": [{k: getattr(r, k) for k in ("text", *r.formats()) if hasattr(r, k)} for r in self.results],
            "logs": {"stdout": self.logs.stdout, "stderr": self.logs.stderr},
            "error": None if self.error is None else {"name": self.error.name, "value": self.error.value,
                                                      "traceback": self.error.traceback},
        })


class Context:
    """A code context: ``id``, ``language``, ``cwd``."""

    id: str
    language: str
    cwd: str

    def __init__(self, context_id: str, language: str, cwd: str, **kwargs: Any) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd

    @classmethod
    def from_json(cls, data: Dict[str, str]) -> "Context":
        return cls(context_id=data["id"], language=data["language"], cwd=to_e2b(data["cwd"]))

    def __repr__(self) -> str:
        return f"Context(id={self.id!r}, language={self.language!r}, cwd={self.cwd!r})"
