"""Result types and the params of every call, shared by the sync and the asyncio API.

The param builders (``p_*``) are the one place where SDK arguments become wire names (the
camelCase names of docs/openrpc.json; ``tests/test_drift.py`` checks them): both APIs call
them, so the two cannot drift apart.
"""

from __future__ import annotations

import base64
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

Cmd = Union[str, Sequence[str]]
Data = Union[str, bytes, bytearray, memoryview]

#: Largest chunk of one files/read or files/write (the broker's files/read limit).
CHUNK = 4 * 1024 * 1024


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _known(schema: Optional[str]) -> frozenset:
    from ._fields import FIELDS

    if schema is not None:
        return frozenset(FIELDS.get(schema, ()))
    return frozenset(f for fs in FIELDS.values() for f in fs)


class Record:
    """A reply object with attribute access: ``r.expires_at`` reads ``expiresAt``; a field of
    its type that the reply left out reads as ``None``; a name that is no field of its type
    (docs/openrpc.json) raises AttributeError, so a typo never reads as ``None``.
    ``r["expiresAt"]`` and :meth:`to_dict` give the raw form."""

    __slots__ = ("_d",)
    #: The broker type (a schema of docs/openrpc.json); None: any broker type's field.
    _schema: Optional[str] = None
    _known_cache: Dict[Any, frozenset] = {}

    def __init__(self, d: Optional[Mapping[str, Any]] = None) -> None:
        object.__setattr__(self, "_d", dict(d or {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        d = object.__getattribute__(self, "_d")
        if name in d:
            return d[name]
        camel = _camel(name)
        if camel in d:
            return d[camel]
        schema = type(self)._schema
        known = Record._known_cache.get(schema)
        if known is None:
            known = Record._known_cache[schema] = _known(schema)
        if camel in known or name in known:
            return None
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (it has: {', '.join(sorted(d)) or 'none'})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._d.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and other._d == self._d

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._d!r})"


class SandboxInfo(Record):
    """A sandbox: ``id, provider, status, template, url, region, timeout, started_at,
    expires_at, metadata`` (times RFC 3339 UTC)."""

    __slots__ = ()
    _schema = "Sandbox"


class SandboxList(List[SandboxInfo]):
    """The sandboxes of ``Sandbox.list()``; ``.errors``: the providers that could not answer
    (``[{provider, code, message, suggestion}]``), empty when all did."""

    errors: List[Record]

    def __init__(self, items: Sequence[SandboxInfo] = (), errors: Sequence[Record] = ()) -> None:
        super().__init__(items)
        self.errors = list(errors)


def sandbox_list(r: Any) -> SandboxList:
    r = r or {}
    return SandboxList([SandboxInfo(s) for s in r.get("sandboxes", [])], [Record(e) for e in r.get("errors", [])])


def decode(data: str, encoding: Optional[str]) -> bytes:
    """Wire data to bytes: base64 when ``encoding`` says so, else UTF-8 text."""
    if encoding == "base64":
        return base64.b64decode(data)
    return data.encode("utf-8")


class ExecResult:
    """The result of ``exec``: ``exit_code``, ``stdout``/``stderr`` (str, invalid UTF-8
    replaced), ``stdout_bytes``/``stderr_bytes`` (exact), ``timed_out``, ``duration_ms``,
    ``truncated``, ``signal``, ``oom_killed``."""

    def __init__(self, r: Mapping[str, Any]) -> None:
        enc = r.get("encoding")
        self.raw = dict(r)
        self.exit_code: Optional[int] = r.get("exitCode")
        self.stdout_bytes = decode(r.get("stdout", ""), enc)
        self.stderr_bytes = decode(r.get("stderr", ""), enc)
        self.timed_out: bool = bool(r.get("timedOut", False))
        self.duration_ms: Optional[int] = r.get("durationMs")
        self.truncated: bool = bool(r.get("truncated", False))
        self.signal: Optional[str] = r.get("signal")
        self.oom_killed: bool = bool(r.get("oomKilled", False))

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def __iter__(self) -> Iterator[Any]:
        """``code, out, err = sb.exec(...)``."""
        return iter((self.exit_code, self.stdout, self.stderr))

    def __repr__(self) -> str:
        return f"ExecResult(exit_code={self.exit_code!r}, stdout={self.stdout!r}, stderr={self.stderr!r})"


class ExecOutput:
    """A piece of a stream's output: ``stream`` (``stdout``, ``stderr`` or ``pty``) and
    ``data`` (bytes, exact); ``text`` decodes it."""

    __slots__ = ("stream", "data")

    def __init__(self, stream: str, data: bytes) -> None:
        self.stream = stream
        self.data = data

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"ExecOutput({self.stream!r}, {self.data!r})"


class ExecExit:
    """The end of a stream (always its last event): ``exit_code``, ``signal``,
    ``timed_out``, ``oom_killed``."""

    __slots__ = ("exit_code", "signal", "timed_out", "oom_killed")

    def __init__(self, p: Mapping[str, Any]) -> None:
        self.exit_code: Optional[int] = p.get("exitCode")
        self.signal: Optional[str] = p.get("signal")
        self.timed_out = bool(p.get("timedOut", False))
        self.oom_killed = bool(p.get("oomKilled", False))

    def __repr__(self) -> str:
        return f"ExecExit(exit_code={self.exit_code!r}, signal={self.signal!r}, timed_out={self.timed_out!r})"


def stream_event(method: str, p: Mapping[str, Any]) -> Union[ExecOutput, ExecExit]:
    if method == "exec/exit":
        return ExecExit(p)
    return ExecOutput(str(p.get("stream", "stdout")), decode(p.get("data", ""), p.get("encoding")))


class CodeResult(Record):
    """``run_code``: ``results`` (MIME bundles), ``stdout``, ``stderr``, ``error``
    (``{name, value, traceback}`` or None), ``execution_count``, ``context``, ``timed_out``,
    ``restarted``, ``truncated``."""

    __slots__ = ()
    _schema = "CodeResult"


class CodeOutput(Record):
    """A ``code/output`` notification (``run_code(on_output=)``): ``type`` (stdout, stderr,
    result, error, restarted), ``text``, ``result``, ``error``, ``context``, ``run_id``."""

    __slots__ = ()
    _schema = "CodeOutput"


class FileChange(Record):
    """A ``files/changed`` event: ``watch_id, sandbox, path, kind`` (created, modified,
    removed, renamed)."""

    __slots__ = ()
    _schema = "FilesChanged"


def parent_dir(path: str) -> str:
    """The parent of a sandbox path ("" when it has none to make)."""
    head = path.rstrip("/").rpartition("/")[0]
    return head if head not in ("", "/workspace", "/tmp") else ""


def _drop_none(**kw: Any) -> Dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def encode_data(data: Data) -> Dict[str, Any]:
    """``{data, encoding?}``: text as is, bytes as base64."""
    if isinstance(data, str):
        return {"data": data}
    return {"data": base64.b64encode(bytes(data)).decode("ascii"), "encoding": "base64"}


def _cmd(cmd: Cmd) -> Dict[str, Any]:
    if isinstance(cmd, str):
        return {"command": cmd}
    return {"argv": list(cmd)}


def _pty(pty: Any) -> Optional[Dict[str, int]]:
    if pty is None or pty is False:
        return None
    if pty is True:
        return {"cols": 80, "rows": 24}
    if isinstance(pty, Mapping):
        return {"cols": int(pty["cols"]), "rows": int(pty["rows"])}
    cols, rows = pty
    return {"cols": int(cols), "rows": int(rows)}


# -- params, one builder per method ------------------------------------------------------------

def p_create(provider: Optional[str], template: Optional[str], timeout: Optional[int], env: Optional[Mapping[str, str]],
             network: Any, limits: Optional[Mapping[str, Any]],
             metadata: Optional[Mapping[str, str]], mounts: Any = None) -> Dict[str, Any]:
    return _drop_none(provider=provider, template=template, timeout=timeout,
                      env=dict(env) if env is not None else None, network=network,
                      limits=dict(limits) if limits is not None else None,
                      metadata=dict(metadata) if metadata is not None else None,
                      mounts=p_mounts(mounts))


def p_mounts(mounts: Any) -> Optional[List[Dict[str, Any]]]:
    """``mounts`` as the broker takes them: each a ``{source, target?, mode?}`` mapping, or a
    string ``SRC[:TARGET][:MODE]`` as the CLI's ``--mount`` (a relative ``SRC`` is made absolute
    from the current directory; it names a directory of the broker's machine)."""
    if mounts is None:
        return None
    out: List[Dict[str, Any]] = []
    for m in mounts:
        if isinstance(m, str):
            parts = m.split(":")
            mode = None
            if len(parts) > 1 and parts[-1] in ("ro", "rw", "overlay"):
                mode = parts.pop()
            src = parts[0]
            target = ":".join(parts[1:]) or None
            m = {"source": src, "target": target, "mode": mode}
        else:
            m = dict(m)
        src = m.get("source")
        if isinstance(src, str) and not src.startswith("/"):
            import os

            m["source"] = os.path.abspath(src)
        out.append({k: v for k, v in m.items() if v is not None})
    return out


def p_changes(sandbox: str, target: Optional[str], paths: Optional[Sequence[str]], **kw: Any) -> Dict[str, Any]:
    return _drop_none(sandbox=sandbox, target=target, paths=list(paths) if paths is not None else None, **kw)


def p_log(sandbox: str, since: Optional[int], limit: Optional[int]) -> Dict[str, Any]:
    return _drop_none(sandbox=sandbox, since=since, limit=limit)


def p_sandbox(sandbox: str) -> Dict[str, Any]:
    return {"sandbox": sandbox}


def p_list(provider: Optional[str]) -> Dict[str, Any]:
    return _drop_none(provider=provider)


def p_set_timeout(sandbox: str, timeout: int) -> Dict[str, Any]:
    return {"sandbox": sandbox, "timeout": timeout}


def p_exec(sandbox: str, cmd: Cmd, env: Optional[Mapping[str, str]], cwd: Optional[str], timeout: Optional[float],
           stdin: Optional[Data], max_output: Optional[int] = None, pty: Any = None,
           stream: bool = False) -> Dict[str, Any]:
    p: Dict[str, Any] = {"sandbox": sandbox, **_cmd(cmd)}
    p.update(_drop_none(cwd=cwd, env=dict(env) if env is not None else None, timeout=timeout))
    if stdin is not None:
        d = encode_data(stdin)
        p["stdin"] = d["data"]
        if "encoding" in d:
            p["stdinEncoding"] = d["encoding"]
    if stream:
        pt = _pty(pty)
        if pt is not None:
            p["pty"] = pt
    elif max_output is not None:
        p["maxOutput"] = max_output
    return p


def p_exec_write(exec_id: str, data: Optional[Data], eof: bool) -> Dict[str, Any]:
    p: Dict[str, Any] = {"execId": exec_id}
    if data is not None:
        p.update(encode_data(data))
    else:
        p["data"] = ""
    if eof:
        p["eof"] = True
    return p


def p_exec_kill(exec_id: str, signal: Optional[str], escalate: Optional[bool]) -> Dict[str, Any]:
    return {"execId": exec_id, **_drop_none(signal=signal, escalate=escalate)}


def p_exec_resize(exec_id: str, cols: int, rows: int) -> Dict[str, Any]:
    return {"execId": exec_id, "cols": cols, "rows": rows}


def p_read(sandbox: str, path: str, offset: int, length: Optional[int], binary: bool) -> Dict[str, Any]:
    p = {"sandbox": sandbox, "path": path, "offset": offset, **_drop_none(length=length)}
    if binary:
        p["encoding"] = "base64"
    return p


def p_write(sandbox: str, path: str, data: Data, offset: Optional[int], append: bool,
            mode: Optional[int]) -> Dict[str, Any]:
    p = {"sandbox": sandbox, "path": path, **encode_data(data), **_drop_none(offset=offset, mode=mode)}
    if append:
        p["append"] = True
    return p


def p_path(sandbox: str, path: str, **flags: Optional[bool]) -> Dict[str, Any]:
    return {"sandbox": sandbox, "path": path, **{k: v for k, v in flags.items() if v}}


def p_rename(sandbox: str, src: str, dst: str) -> Dict[str, Any]:
    return {"sandbox": sandbox, "from": src, "to": dst}


def p_transfer(sandbox: str, local_path: str, path: str) -> Dict[str, Any]:
    return {"sandbox": sandbox, "localPath": local_path, "path": path}


def p_process_kill(sandbox: str, pid: int, signal: Optional[str]) -> Dict[str, Any]:
    return {"sandbox": sandbox, "pid": pid, **_drop_none(signal=signal)}


def p_port(sandbox: str, port: int) -> Dict[str, Any]:
    return {"sandbox": sandbox, "port": port}


def p_code(sandbox: str, code: str, language: Optional[str], context: Optional[str] = None,
           timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
           run_id: Optional[str] = None) -> Dict[str, Any]:
    return {"sandbox": sandbox, "code": code,
            **_drop_none(language=language, context=context, timeout=timeout,
                         env=dict(env) if env is not None else None, runId=run_id)}


_RUNS = [0]


def code_listener(on_output: Any) -> "tuple[Optional[str], Any]":
    """A run id and a ``code/output`` listener calling ``on_output(CodeOutput)`` for that run
    (None, None without a callback)."""
    if on_output is None:
        return None, None
    import os

    _RUNS[0] += 1
    rid = f"sdk-{os.getpid()}-{_RUNS[0]}"

    def note(method: str, p: Dict[str, Any]) -> None:
        if method == "code/output" and p.get("runId") == rid:
            on_output(CodeOutput(p))

    return rid, note


def p_install(source: str, subdir: Optional[str], ref: Optional[str], sha256: Optional[str], allow_unpinned: bool,
              allow_insecure_transport: bool, confirm: bool, dry_run: bool, replace: bool) -> Dict[str, Any]:
    p = {"source": source, **_drop_none(subdir=subdir, ref=ref, sha256=sha256)}
    for k, v in (("allowUnpinned", allow_unpinned), ("allowInsecureTransport", allow_insecure_transport),
                 ("confirm", confirm), ("dryRun", dry_run), ("replace", replace)):
        if v:
            p[k] = True
    return p


def p_id(id: str, **extra: Any) -> Dict[str, Any]:
    return {"id": id, **_drop_none(**extra)}


def entries(r: Any) -> List[Record]:
    return [Record(e) for e in (r or {}).get("entries", [])]


def processes(r: Any) -> List[Record]:
    return [Record(p) for p in (r or {}).get("processes", [])]
