"""The SDK against docs/openrpc.json (generated from the protocol crate's types): every method
the SDK calls exists there, with those param names. It drives every public call of both APIs
on a recording connection (no broker), with every optional argument given, and also checks
every method name written in the SDK's source, so a call no test reaches still cannot name a
method or param the broker does not have."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import abx
from abx import _types as t
from abx.aio import AsyncConnection, AsyncSandbox
from abx.sandbox import ExecStream, Watch
from conftest import ROOT

SPEC = json.loads((ROOT / "docs" / "openrpc.json").read_text())
PARAMS = {m["name"]: {p["name"] for p in m.get("params", [])} for m in SPEC["methods"]}
SDK = Path(abx.__file__).resolve().parent

SANDBOX = {"id": "sb-1", "provider": "local", "status": "running"}


def reply(method, params):
    if method in ("sandbox/create", "sandbox/info", "sandbox/connect", "sandbox/setTimeout", "sandbox/pause",
                  "sandbox/resume"):
        return dict(SANDBOX)
    return {"execId": "e-1", "pid": 1, "watchId": "w-1", "size": 1, "data": "", "eof": True, "killed": True,
            "exitCode": 0, "stdout": "", "stderr": "", "url": "u", "headers": {}, "sandboxes": [], "entries": [],
            "processes": [], "providers": [], "id": "p", "ok": True, "checks": [], "results": []}


class Recorder:
    is_remote = False

    def __init__(self):
        self.calls = []

    def call(self, method, params=None, **kw):
        self.calls.append((method, dict(params or {})))
        return reply(method, params)

    def next_event(self, exec_id, timeout=None):
        return ("exec/exit", {"execId": exec_id, "exitCode": 0})

    def next_change(self, watch_id, timeout=None):
        return {"watchId": watch_id, "path": "/workspace/x", "kind": "created"}

    def drop_watch(self, watch_id):
        pass


class AsyncRecorder(Recorder):
    async def call(self, method, params=None, **kw):  # type: ignore[override]
        return Recorder.call(self, method, params)

    async def next_event(self, exec_id):  # type: ignore[override]
        return ("exec/exit", {"execId": exec_id, "exitCode": 0})


def drive_sync(rec, tmp_path):
    sb = abx.Sandbox.create(provider="local", template="base", timeout=60, env={"A": "1"}, network="none",
                            limits={"pids": 8}, metadata={"k": "v"}, mounts=[".:/workspace/p:ro"], connection=rec)
    abx.Sandbox.connect("sb-1", connection=rec)
    abx.Sandbox.list(provider="local", connection=rec)
    sb.info()
    sb.refresh()
    sb.exec("true", env={"A": "1"}, cwd="/workspace", timeout=5, stdin=b"\xff", max_output=10)
    sb.exec(["true"], stdin="text")
    s = sb.exec_stream("cat", env={"A": "1"}, cwd="/workspace", timeout=5, stdin=b"\xff", pty=(80, 24))
    assert isinstance(s, ExecStream)
    s.write(b"\xff", eof=True)
    s.write("x")
    s.close_stdin()
    s.resize(100, 30)
    s.kill("INT", escalate=False)
    s.wait()
    sb.set_timeout(10)
    sb.pause()
    sb.resume()
    sb.capabilities()
    sb.system_info()
    sb.run_code("1", language="python")
    sb.diff(["/workspace/a"], target="/workspace", patch=True)
    sb.apply(["/workspace/a"], target="/workspace", dry_run=True, force=True)
    sb.discard(["/workspace/a"], target="/workspace")
    sb.log(since=1, limit=10)
    sb.set_network({"allow": ["pypi.example"]})
    f = sb.files
    f.read("a")
    f.read_bytes("a")
    f.write("a", b"\x00", mode=0o644, append=True)
    f.write("a", b"\x00" * (t.CHUNK + 1))
    f.list("d", recursive=True)
    f.stat("a")
    f.exists("a")
    f.mkdir("d", parents=True)
    f.remove("d", recursive=True)
    f.rename("a", "b")
    src = tmp_path / "src"
    src.write_bytes(b"x")
    f.upload(str(src), "a")
    f.download("a", str(tmp_path / "dst"))
    w = f.watch("/workspace", recursive=True)
    assert isinstance(w, Watch)
    w.next()
    w.close()
    sb.processes.list()
    sb.processes.kill(1, "TERM")
    sb.ports.url(80)
    sb.kill()
    P = abx.providers
    P.list(connection=rec)
    P.info("p", connection=rec)
    P.install(str(src), subdir="s", ref="r", sha256="0" * 64, allow_unpinned=True, allow_insecure_transport=True,
              yes=True, replace=True, connection=rec)
    P.install("https://x/y.git", dry_run=True, connection=rec)
    P.install("https://x/y.git", confirm=lambda plan: True, connection=rec)
    P.uninstall("p", yes=True, connection=rec)
    P.update("p", ref="r", check=True, connection=rec)
    P.doctor("p", connection=rec)
    P.test("p", "lifecycle", concurrency=2, connection=rec)
    P.configure("p", {"k": "v"}, connection=rec)
    P.set_default("p", connection=rec)


async def drive_async(rec, tmp_path):
    sb = await AsyncSandbox.create(provider="local", template="base", timeout=60, env={"A": "1"}, network="none",
                                   limits={"pids": 8}, metadata={"k": "v"},
                                   mounts=[{"source": "/tmp", "mode": "overlay"}], connection=rec)
    await AsyncSandbox.connect("sb-1", connection=rec)
    await AsyncSandbox.list(provider="local", connection=rec)
    await sb.info()
    await sb.exec("true", env={"A": "1"}, cwd="/w", timeout=5, stdin=b"\xff", max_output=10)
    s = await sb.exec_stream("cat", env={"A": "1"}, cwd="/w", timeout=5, stdin="x", pty=True)
    await s.write(b"x", eof=True)
    await s.close_stdin()
    await s.resize(1, 2)
    await s.kill("TERM", escalate=True)
    await s.wait()
    for m in (sb.pause, sb.resume, sb.capabilities, sb.system_info, sb.kill):
        await m()
    await sb.set_timeout(5)
    await sb.run_code("1", language="python")
    await sb.diff(["/workspace/a"], target="/workspace", patch=True)
    await sb.apply(["/workspace/a"], target="/workspace", dry_run=True, force=True)
    await sb.discard(["/workspace/a"], target="/workspace")
    await sb.log(since=1, limit=10)
    await sb.set_network({"allow": ["pypi.example"], "deny": ["x.pypi.example"]})
    f = sb.files
    await f.read("a")
    await f.write("a", b"x", mode=0o600, append=True)
    await f.list("d", recursive=True)
    await f.exists("a")
    await f.mkdir("d", parents=True)
    await f.remove("d", recursive=True)
    await f.rename("a", "b")
    src = tmp_path / "asrc"
    src.write_bytes(b"x")
    await f.upload(str(src), "a")
    await f.download("a", str(tmp_path / "adst"))
    w = await f.watch("/workspace", recursive=True)
    await w.close()
    await sb.processes.list()
    await sb.processes.kill(1, "KILL")
    await sb.ports.url(1)
    P = abx.aio.providers
    await P.list(connection=rec)
    await P.info("p", connection=rec)
    await P.install(str(src), subdir="s", ref="r", sha256="0", allow_unpinned=True, allow_insecure_transport=True,
                    yes=True, replace=True, connection=rec)
    await P.install("https://x/y.git", confirm=lambda plan: True, connection=rec)
    await P.uninstall("p", yes=True, connection=rec)
    await P.doctor("p", connection=rec)
    await P.test("p", "x", concurrency=1, connection=rec)


def check(calls):
    bad = []
    for method, params in calls:
        if method not in PARAMS:
            bad.append(f"{method}: not a method of docs/openrpc.json")
            continue
        extra = set(params) - PARAMS[method]
        if extra:
            bad.append(f"{method}: params {sorted(extra)} not in docs/openrpc.json ({sorted(PARAMS[method])})")
    assert not bad, "\n".join(bad)


def test_sync_calls_match_openrpc(tmp_path):
    rec = Recorder()
    drive_sync(rec, tmp_path)
    check(rec.calls)
    assert len({m for m, _ in rec.calls}) >= 35


def test_async_calls_match_openrpc(tmp_path):
    rec = AsyncRecorder()
    asyncio.run(drive_async(rec, tmp_path))
    check(rec.calls)


def test_every_method_named_in_the_source_exists():
    names = set()
    for f in SDK.rglob("*.py"):  # abx.e2b too
        names |= set(re.findall(r'"((?:broker|provider|sandbox|exec|process|files|ports|code|commands|templates)'
                                r'/[A-Za-z]+|\$/cancelRequest)"', f.read_text()))
    assert "exec/run" in names and "$/cancelRequest" in names
    missing = sorted(n for n in names if n not in PARAMS and n not in ("exec/output", "exec/exit", "files/changed",
                                                                        "files/progress", "provider/testResult",
                                                                        "code/output"))
    assert not missing, f"methods the SDK names that docs/openrpc.json lacks: {missing}"
    notes = {n["name"] for n in SPEC.get("x-notifications", [])}
    for n in ("exec/output", "exec/exit", "files/changed", "files/progress", "provider/testResult", "code/output"):
        assert n in notes, f"notification {n} is not in docs/openrpc.json"


def test_a_renamed_param_is_caught():
    # the check itself can fail: a param the broker does not have is reported
    try:
        check([("exec/run", {"sandbox": "x", "commandLine": "true"})])
    except AssertionError as e:
        assert "commandLine" in str(e)
    else:
        raise AssertionError("drift not detected")


def test_e2b_code_params_match_openrpc():
    """abx.e2b builds code/* params itself (run ids for its callbacks): they are the broker's."""
    from abx.e2b._code import Sandbox as CodeSandbox, code_params

    class Fake:
        pass

    sb = Fake()
    sb._abx = Fake()
    sb._abx._route = "local:sb-1"
    check([("code/run", code_params(sb, "1", "python", None, {"A": "1"}, 5, "e2b-1-1")),
           ("code/run", code_params(sb, "1", None, "ctx-1", None, None, "e2b-1-2")),
           ("code/createContext", {"sandbox": "x", "language": "python", "cwd": "/workspace"}),
           ("code/restartContext", {"sandbox": "x", "context": "c"}),
           ("code/removeContext", {"sandbox": "x", "context": "c"}),
           ("code/listContexts", {"sandbox": "x"}),
           ("exec/attach", {"execId": "e"})])
    assert CodeSandbox.run_code
