"""``abx.e2b`` against E2B's real SDKs (``e2b`` 2.63.0 and ``e2b-code-interpreter`` 2.11.5,
pinned in scripts/test): every public member of their classes is ours too, and every method
takes the same parameter names in the same order. What has no counterpart is listed here
(``REFUSED``) and each is checked to raise ``NotSupportedException`` naming an abx call."""

from __future__ import annotations

import inspect

import pytest

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")

import abx.e2b as A  # noqa: E402
import abx.e2b.code_interpreter as AC  # noqa: E402
from abx.e2b._async import _ClassOrInstanceAsync  # noqa: E402
from abx.e2b._sync import _ClassOrInstance  # noqa: E402


def test_versions_mirrored():
    from importlib.metadata import version

    assert version("e2b") == A.E2B_VERSION == "2.63.0"
    assert version("e2b-code-interpreter") == A.E2B_CODE_INTERPRETER_VERSION == "2.11.5"


def _pairs():
    from e2b.sandbox_async.commands.command import Commands as AsyncCommands
    from e2b.sandbox_async.filesystem.filesystem import Filesystem as AsyncFilesystem
    from e2b.sandbox_sync.commands.command import Commands
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem

    return [
        (e2b.Sandbox, A.Sandbox), (e2b.AsyncSandbox, A.AsyncSandbox), (ci.Sandbox, AC.Sandbox),
        (ci.AsyncSandbox, AC.AsyncSandbox), (Commands, A.Commands), (AsyncCommands, A.AsyncCommands),
        (Filesystem, A.Filesystem), (AsyncFilesystem, A.AsyncFilesystem), (e2b.CommandHandle, A.CommandHandle),
        (e2b.AsyncCommandHandle, A.AsyncCommandHandle), (e2b.AsyncCommandInputHandle, A.AsyncCommandInputHandle),
        (e2b.WatchHandle, A.WatchHandle), (e2b.AsyncWatchHandle, A.AsyncWatchHandle),
        (e2b.SandboxPaginator, A.SandboxPaginator), (e2b.AsyncSandboxPaginator, A.AsyncSandboxPaginator),
        (e2b.CommandResult, A.CommandResult), (e2b.CommandExitException, A.CommandExitException),
        (e2b.EntryInfo, A.EntryInfo), (e2b.WriteInfo, A.WriteInfo), (e2b.SandboxInfo, A.SandboxInfo),
        (e2b.FilesystemEvent, A.FilesystemEvent), (e2b.ProcessInfo, A.ProcessInfo), (e2b.SandboxQuery, A.SandboxQuery),
        (ci.Execution, AC.Execution), (ci.Result, AC.Result), (ci.Logs, AC.Logs),
        (ci.ExecutionError, AC.ExecutionError), (ci.Context, AC.Context), (ci.OutputMessage, AC.OutputMessage),
    ]


def _public(cls):
    """Public names: attributes, methods, and the fields a class declares (dataclass or annotated)."""
    names = {n for n in dir(cls) if not n.startswith("_")}
    for k in cls.__mro__:
        if k.__module__.split(".")[0] in ("e2b", "e2b_code_interpreter", "abx"):
            names |= {n for n in getattr(k, "__annotations__", {}) if not n.startswith("_")}
    return names


def _fn(cls, name):
    """The function behind a member (E2B's class_method_variant: the instance variant)."""
    try:
        v = inspect.getattr_static(cls, name)
    except AttributeError:
        return None  # a field without a class-level default
    if isinstance(v, (classmethod, staticmethod)):
        v = v.__func__
    if isinstance(v, _ClassOrInstance):
        return v._inst_fn
    if isinstance(v, _ClassOrInstanceAsync):
        return _fn(cls._sync_cls, v.name)
    if type(v).__name__ == "class_method_variant":
        return v.method
    return v if callable(v) and not isinstance(v, type) else None


def _params(f):
    try:
        ps = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in ps if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in ("self", "cls")]


@pytest.mark.parametrize("theirs,ours", _pairs(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_members_and_parameters(theirs, ours):
    missing = sorted(_public(theirs) - _public(ours))
    assert missing == [], f"{ours.__qualname__} lacks E2B's {missing}"
    differ = {}
    for name in sorted(_public(theirs)):
        f, g = _fn(theirs, name), _fn(ours, name)
        if f is None or g is None:
            continue
        a, b = _params(f), _params(g)
        if a is not None and b is not None and a != b:
            differ[name] = (a, b)
    assert differ == {}, differ


def test_class_variants_take_the_sandbox_id():
    """``Sandbox.kill(sandbox_id)`` etc.: E2B's class variants and ours take the same params."""
    for theirs, ours in ((e2b.Sandbox, A.Sandbox), (ci.Sandbox, AC.Sandbox)):
        for name in ("kill", "connect", "set_timeout", "get_info", "pause", "get_metrics", "update_network"):
            v = inspect.getattr_static(theirs, name)
            cls_fn = getattr(theirs, v.class_method_name)
            mine = inspect.getattr_static(ours, name)._cls_fn
            mine = getattr(mine, "__func__", mine)
            a = _params(cls_fn.__func__ if hasattr(cls_fn, "__func__") else cls_fn)
            assert a is not None and a[:1] == ["sandbox_id"], (name, a)
            assert _params(mine) == a, (name, a, _params(mine))


#: Module names of E2B that are its own internals (submodules), not API: not mirrored.
SUBMODULES = {"api", "client", "connection_config", "envd", "exceptions", "io_utils", "paginator", "retry", "sandbox",
              "sandbox_async", "sandbox_domains", "sandbox_sync", "secret", "template", "template_async",
              "template_sync", "volume", "charts", "code_interpreter_async", "code_interpreter_sync", "constants",
              "models"}


def test_module_names():
    theirs = {n for n in dir(e2b) if not n.startswith("_")} | {n for n in dir(ci) if not n.startswith("_")}
    missing = sorted(n for n in theirs - SUBMODULES if not hasattr(AC, n))
    assert missing == []
    refused = sorted(n for n in A._NEAREST if n in theirs)
    assert len(refused) == len(A._NEAREST), sorted(set(A._NEAREST) - theirs)  # no stub for a name E2B lacks


#: Members with no counterpart in abx: each raises NotSupportedException naming an abx call.
REFUSED = ["pty", "git", "envd_api_url", "envd_direct_url", "get_metrics", "create_snapshot", "fork",
           "list_snapshots", "download_url", "upload_url", "get_mcp_url", "get_mcp_token", "delete_snapshot"]


def test_refused_members_name_the_nearest_abx_call(home):
    sb = AC.Sandbox.create()
    try:
        for name in REFUSED:
            with pytest.raises(A.NotSupportedException, match="Nearest abx call: ") as e:
                v = getattr(sb, name)
                if name in ("pty", "git"):
                    v.create()
                elif callable(v):
                    v("x") if name in ("download_url", "delete_snapshot") else v()
            assert "abx" in str(e.value)
        for kw, val in (("mcp", {}), ("volume_mounts", {"/x": "v"}), ("idempotency_key", "k"), ("iam", {}),
                        ("lifecycle", {"on_timeout": "pause"})):
            with pytest.raises(A.NotSupportedException):
                AC.Sandbox.create(**{kw: val})
        with pytest.raises(A.NotSupportedException, match="template"):
            A.Template.build("x")
        with pytest.raises(A.InvalidArgumentException, match="typescript"):
            sb.run_code("1", language="typescript")
        with pytest.raises(A.InvalidArgumentException, match="metadata"):
            sb.files.write("m.txt", "x", metadata={"a": "b"})
    finally:
        sb.kill()
