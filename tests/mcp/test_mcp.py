"""`abx mcp` driven by the official MCP Python SDK (`mcp` from PyPI) over stdio.

Every test runs the real `abx` binary (ABX_BIN, default target/debug/abx) with a private
ABX_HOME, so the daemon it starts is its own; the daemon is stopped at the end with
`abx broker stop`. Both protocol eras are covered:

- "modern": the SDK's default `mode="auto"` probes `server/discover` and, answered, speaks
  the stateless 2026-07-28 revision (`_meta` on every request, `resultType` on results);
- "legacy": `mode="legacy"` forces the `initialize` handshake (2025-11-25).

Raw JSON lines cover what the SDK cannot be made to send (old handshake versions, a version
the server does not speak, unknown methods).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

ROOT = Path(__file__).resolve().parents[2]
ABX = Path(os.environ.get("ABX_BIN") or ROOT / "target" / "debug" / "abx").resolve()

# The eras, as the SDK's connect modes.
MODES = {"modern": "auto", "legacy": "legacy"}
EXPECTED_VERSION = {"modern": "2026-07-28", "legacy": "2025-11-25"}
TOOLS = {
    "sandbox_create",
    "sandbox_list",
    "sandbox_info",
    "sandbox_kill",
    "sandbox_set_timeout",
    "exec",
    "run_code",
    "files_read",
    "files_write",
    "files_list",
    "ports_url",
    "provider_list",
    "sandbox_diff",
    "sandbox_apply",
    "sandbox_discard",
    "sandbox_log",
    "sandbox_set_network",
    "code_context_create",
    "code_context_list",
    "code_context_restart",
    "code_context_remove",
}


@pytest.fixture(scope="module")
def home():
    assert ABX.exists(), f"{ABX} is missing: build it first (cargo build --workspace --bins) or set ABX_BIN"
    d = tempfile.mkdtemp(prefix="abx-mcp-")
    yield d
    subprocess.run([str(ABX), "broker", "stop"], env={**os.environ, "ABX_HOME": d}, capture_output=True, timeout=30)
    shutil.rmtree(d, ignore_errors=True)


def server(home: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(ABX), args=["mcp"], env={"ABX_HOME": home})


def text(result) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def procs_with(marker: str) -> list[int]:
    """Pids whose command line contains `marker` (what `ps` would show)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            out.append(int(p.name))
    return out


def run(fn, *args):
    return anyio.run(fn, *args)


@pytest.mark.parametrize("era", MODES)
def test_code_contexts_and_limits(home, era):
    """Issue 45, item 10: run_code's `context` comes from a tool (code_context_*), and
    sandbox_create takes `limits`."""

    async def main():
        async with Client(server(home), mode=MODES[era]) as client:
            created = await client.call_tool("sandbox_create", {"limits": {"memory": "64M", "pids": 64}})
            assert not created.is_error, text(created)
            sb = created.structured_content["id"]
            # The memory limit holds: 300 MB is more than the sandbox may have.
            r = await client.call_tool(
                "exec", {"sandbox": sb, "command": "python3 -c 'x = bytearray(300 << 20); print(len(x))'"}
            )
            assert not r.is_error and r.structured_content["exitCode"] == 137, text(r)
            bad = await client.call_tool("sandbox_create", {"limits": {"memory": "lots"}})
            assert bad.is_error and "[E1004]" in text(bad), text(bad)

            c = await client.call_tool("code_context_create", {"sandbox": sb, "language": "python", "cwd": "/tmp"})
            assert not c.is_error, text(c)
            ctx = c.structured_content["id"]
            assert c.structured_content["language"] == "python" and c.structured_content["cwd"] == "/tmp"
            r = await client.call_tool("run_code", {"sandbox": sb, "context": ctx, "code": "import os\nv = 41\nos.getcwd()"})
            assert not r.is_error and r.structured_content["results"][0]["text/plain"] == "'/tmp'", text(r)
            assert r.structured_content["context"] == ctx
            r = await client.call_tool("run_code", {"sandbox": sb, "context": ctx, "code": "v + 1"})
            assert r.structured_content["results"][0]["text/plain"] == "42", text(r)
            # The default context is another interpreter.
            r = await client.call_tool("run_code", {"sandbox": sb, "code": "'v' in globals()"})
            assert r.structured_content["results"][0]["text/plain"] == "False", text(r)
            listed = await client.call_tool("code_context_list", {"sandbox": sb})
            assert not listed.is_error, text(listed)
            ids = {x["id"]: x for x in listed.structured_content["contexts"]}
            assert ctx in ids and ids[ctx]["cwd"] == "/tmp" and ids[ctx]["executionCount"] == 2, ids

            r = await client.call_tool("code_context_restart", {"sandbox": sb, "context": ctx})
            assert not r.is_error and r.structured_content["id"] == ctx, text(r)
            r = await client.call_tool("run_code", {"sandbox": sb, "context": ctx, "code": "'v' in globals()"})
            assert r.structured_content["results"][0]["text/plain"] == "False", text(r)

            r = await client.call_tool("code_context_remove", {"sandbox": sb, "context": ctx})
            assert not r.is_error, text(r)
            listed = await client.call_tool("code_context_list", {"sandbox": sb})
            assert ctx not in {x["id"] for x in listed.structured_content["contexts"]}
            r = await client.call_tool("run_code", {"sandbox": sb, "context": ctx, "code": "1"})
            assert r.is_error, text(r)
            await client.call_tool("sandbox_kill", {"sandbox": sb})

    run(main)


@pytest.mark.parametrize("era", MODES)
def test_tools_end_to_end(home, era):
    async def main():
        async with Client(server(home), mode=MODES[era]) as client:
            assert client.protocol_version == EXPECTED_VERSION[era]
            assert client.server_capabilities.tools is not None

            tools = await client.list_tools()
            names = {t.name for t in tools.tools}
            assert names == TOOLS
            exec_tool = next(t for t in tools.tools if t.name == "exec")
            assert exec_tool.input_schema["required"] == ["sandbox", "command"]
            assert exec_tool.output_schema is not None

            providers = await client.call_tool("provider_list", {})
            assert not providers.is_error
            assert any(p["id"] == "local" for p in providers.structured_content["providers"])

            created = await client.call_tool("sandbox_create", {"timeout": 600, "metadata": {"era": era}})
            assert not created.is_error, text(created)
            sb = created.structured_content["id"]
            assert created.structured_content["status"] == "running"

            listed = await client.call_tool("sandbox_list", {})
            assert sb in {s["id"] for s in listed.structured_content["sandboxes"]}

            # exec, with its output streamed as progress.
            seen: list[str] = []
            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)
                if message:
                    seen.append(message)

            r = await client.call_tool(
                "exec",
                {"sandbox": sb, "command": "echo hello-$X; echo oops >&2; exit 3", "env": {"X": era}},
                progress_callback=on_progress,
            )
            assert not r.is_error, text(r)
            assert r.structured_content["exitCode"] == 3
            assert r.structured_content["stdout"] == f"hello-{era}\n"
            assert r.structured_content["stderr"] == "oops\n"
            assert r.structured_content["timedOut"] is False
            assert "Exit code: 3" in text(r) and f"hello-{era}" in text(r) and "oops" in text(r)
            assert f"hello-{era}\n" in "".join(seen), seen
            assert progress == sorted(progress) and len(set(progress)) == len(progress)

            # A timeout kills the command and says so.
            r = await client.call_tool("exec", {"sandbox": sb, "command": "sleep 30", "timeout": 0.5})
            assert not r.is_error and r.structured_content["timedOut"] is True

            # run_code: state kept between calls, an image as image content, an error as isError.
            r = await client.call_tool("run_code", {"sandbox": sb, "code": f"era = {era!r}\nprint('hi')\nlen(era)"})
            assert not r.is_error, text(r)
            assert r.structured_content["results"][0]["text/plain"] == str(len(era))
            assert "hi" in text(r)
            r = await client.call_tool("run_code", {"sandbox": sb, "code": "era.upper()"})
            assert r.structured_content["results"][0]["text/plain"] == repr(era.upper()), text(r)
            png = "class P:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n'\nP()"
            r = await client.call_tool("run_code", {"sandbox": sb, "code": png})
            images = [c for c in r.content if c.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png" and images[0].data == "iVBORw0KGgo="
            r = await client.call_tool("run_code", {"sandbox": sb, "code": "raise KeyError('nope')"})
            assert r.is_error and "KeyError: 'nope'" in text(r) and "Traceback" in text(r)

            # Files: write (parents created), read back, list.
            body = f"line 1 ({era})\nünïcode ✓\n"
            w = await client.call_tool("files_write", {"sandbox": sb, "path": "notes/a.txt", "content": body})
            assert not w.is_error, text(w)
            assert w.structured_content["size"] == len(body.encode())
            rd = await client.call_tool("files_read", {"sandbox": sb, "path": "/workspace/notes/a.txt"})
            assert not rd.is_error, text(rd)
            assert rd.structured_content["content"] == body
            assert rd.structured_content["encoding"] == "utf-8"
            assert text(rd) == body
            ls = await client.call_tool("files_list", {"sandbox": sb, "path": "notes"})
            assert [e["name"] for e in ls.structured_content["entries"]] == ["a.txt"]
            r = await client.call_tool("exec", {"sandbox": sb, "command": "cat notes/a.txt"})
            assert r.structured_content["stdout"] == body

            # Failures are results with isError and the E-code, not protocol errors.
            e = await client.call_tool("files_read", {"sandbox": sb, "path": "missing.txt"})
            assert e.is_error and "[E4001]" in text(e), text(e)
            # files/* see what exec sees (issue 43): the sandbox's own /etc/passwd.
            e = await client.call_tool("files_read", {"sandbox": sb, "path": "/etc/passwd"})
            assert not e.is_error and "root:" in text(e), text(e)
            e = await client.call_tool("sandbox_info", {"sandbox": "no-such-sandbox"})
            assert e.is_error and text(e).startswith("[E2009] Sandbox 'no-such-sandbox' not found."), text(e)
            assert "Suggestion:" in text(e)
            e = await client.call_tool("exec", {"sandbox": sb})
            assert e.is_error and "[E1004]" in text(e) and "command" in text(e), text(e)

            info = await client.call_tool("sandbox_set_timeout", {"sandbox": sb, "timeout": 900})
            assert not info.is_error and info.structured_content["id"] == sb
            url = await client.call_tool("ports_url", {"sandbox": sb, "port": 8080})
            assert not url.is_error and "8080" in url.structured_content["url"]

            k = await client.call_tool("sandbox_kill", {"sandbox": sb})
            assert not k.is_error and k.structured_content == {"killed": True}
            k = await client.call_tool("sandbox_kill", {"sandbox": sb})
            assert k.structured_content == {"killed": False}
            gone = await client.call_tool("sandbox_info", {"sandbox": sb})
            assert gone.is_error and "[E2009]" in text(gone)

    run(main)


@pytest.mark.parametrize("era", MODES)
def test_workspace_tools_and_the_log_names_the_agent(home, era, tmp_path):
    """Issue 43: the workspace tools and their annotations, sandbox_log naming the MCP client
    (`<name> via abx mcp`), and, where the provider mounts, a change reviewed then applied."""
    agent = f"pytest-agent-{era}"

    async def main():
        info = Implementation(name=agent, version="1")
        async with Client(server(home), mode=MODES[era], client_info=info) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            apply, discard = tools["sandbox_apply"], tools["sandbox_discard"]
            assert apply.annotations.destructive_hint is True
            assert apply.annotations.read_only_hint is False
            assert "this changes the user's files" in apply.description
            assert "ask" in apply.description
            assert discard.annotations.destructive_hint is True
            for name in ["sandbox_diff", "sandbox_log"]:
                assert tools[name].annotations.read_only_hint is True, name
                assert tools[name].annotations.destructive_hint is False, name
                assert tools[name].output_schema is not None, name
            assert set(tools["sandbox_log"].output_schema["properties"]) >= {"entries", "dropped", "last"}
            mounts = tools["sandbox_create"].input_schema["properties"]["mounts"]
            assert mounts["type"] == "array" and mounts["items"]["required"] == ["source"]

            created = await client.call_tool("sandbox_create", {"timeout": 600})
            assert not created.is_error, text(created)
            sb = created.structured_content["id"]
            r = await client.call_tool("exec", {"sandbox": sb, "command": "echo logged; exit 4", "cwd": "/tmp"})
            assert r.structured_content["exitCode"] == 4, text(r)
            log = await client.call_tool("sandbox_log", {"sandbox": sb})
            assert not log.is_error, text(log)
            entries = log.structured_content["entries"]
            assert len(entries) == 1, entries
            e = entries[0]
            assert e["client"] == f"{agent} via abx mcp", e
            assert e["argv"] == ["sh", "-c", "echo logged; exit 4"], e
            assert e["cwd"] == "/tmp" and e["exitCode"] == 4 and e["seq"] == 1, e
            assert log.structured_content["last"] == 1
            later = await client.call_tool("sandbox_log", {"sandbox": sb, "since": 1})
            assert later.structured_content["entries"] == []
            await client.call_tool("sandbox_kill", {"sandbox": sb})
            gone = await client.call_tool("sandbox_log", {"sandbox": sb})
            assert gone.is_error and "[E2009]" in text(gone), text(gone)

            # A project mounted (overlay), changed in the sandbox, reviewed, applied.
            proj = tmp_path / "proj"
            proj.mkdir()
            (proj / "a.txt").write_text("host\n")
            created = await client.call_tool(
                "sandbox_create", {"timeout": 600, "mounts": [{"source": str(proj)}]}
            )
            if created.is_error:
                # The provider does not mount (yet): said with an E-code, nothing else.
                assert "[E" in text(created), text(created)
                pytest.skip(f"no mounts here: {text(created)}")
            sb = created.structured_content["id"]
            r = await client.call_tool(
                "exec", {"sandbox": sb, "command": "echo sandbox > /workspace/a.txt; echo new > /workspace/b.txt"}
            )
            assert r.structured_content["exitCode"] == 0, text(r)
            assert (proj / "a.txt").read_text() == "host\n" and not (proj / "b.txt").exists()
            d = await client.call_tool("sandbox_diff", {"sandbox": sb, "format": "patch"})
            assert not d.is_error, text(d)
            changes = {c["path"]: c for c in d.structured_content["changes"]}
            assert changes["/workspace/a.txt"]["change"] == "modified", changes
            assert changes["/workspace/b.txt"]["change"] == "added", changes
            assert "+sandbox" in changes["/workspace/a.txt"]["patch"]
            dry = await client.call_tool("sandbox_apply", {"sandbox": sb, "dryRun": True})
            assert sorted(dry.structured_content["applied"]) == ["/workspace/a.txt", "/workspace/b.txt"]
            assert (proj / "a.txt").read_text() == "host\n"
            done = await client.call_tool("sandbox_apply", {"sandbox": sb, "paths": ["/workspace/b.txt"]})
            assert done.structured_content["applied"] == ["/workspace/b.txt"], text(done)
            assert (proj / "b.txt").read_text() == "new\n"
            dropped = await client.call_tool("sandbox_discard", {"sandbox": sb})
            assert "/workspace/a.txt" in dropped.structured_content["discarded"], text(dropped)
            d = await client.call_tool("sandbox_diff", {"sandbox": sb})
            assert d.structured_content["changes"] == [], text(d)
            assert (proj / "a.txt").read_text() == "host\n"
            await client.call_tool("sandbox_kill", {"sandbox": sb})

    run(main)


@pytest.mark.parametrize("era", MODES)
def test_cancel_kills_the_exec_and_others_run_meanwhile(home, era):
    marker = "987.25" if era == "modern" else "987.75"

    async def main():
        async with Client(server(home), mode=MODES[era]) as client:
            sb = (await client.call_tool("sandbox_create", {})).structured_content["id"]
            started = anyio.Event()
            outcome: list = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                if message and "started" in message:
                    started.set()

            async def long_exec() -> None:
                r = await client.call_tool(
                    "exec",
                    {"sandbox": sb, "command": f"echo started; sleep {marker}; echo never"},
                    progress_callback=on_progress,
                )
                outcome.append(r)

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_exec)
                with anyio.fail_after(20):
                    await started.wait()
                assert procs_with(f"sleep {marker}"), "the exec should be running"
                # The exec in progress blocks nothing: listing and other calls answer now.
                with anyio.fail_after(5):
                    assert len((await client.list_tools()).tools) == len(TOOLS)
                    r = await client.call_tool("exec", {"sandbox": sb, "command": "echo meanwhile"})
                    assert r.structured_content["stdout"] == "meanwhile\n"
                # Cancel: the SDK sends notifications/cancelled; the server kills the exec.
                tg.cancel_scope.cancel()
            assert outcome == [], "a cancelled call gets no result"

            deadline = time.monotonic() + 10
            while procs_with(f"sleep {marker}") and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            assert not procs_with(f"sleep {marker}"), "the cancelled exec must be killed"

            # The server is fine afterwards.
            r = await client.call_tool("exec", {"sandbox": sb, "command": "echo still-here"})
            assert r.structured_content["stdout"] == "still-here\n"
            await client.call_tool("sandbox_kill", {"sandbox": sb})

    run(main)


class Raw:
    """`abx mcp` spoken to with raw JSON lines."""

    def __init__(self, home: str):
        self.p = subprocess.Popen(
            [str(ABX), "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "ABX_HOME": home},
        )

    def send(self, msg: dict) -> None:
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def recv(self) -> dict:
        line = self.p.stdout.readline()
        assert line, "abx mcp closed stdout"
        return json.loads(line)

    def request(self, id, method, params=None) -> dict:
        msg = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        while True:
            m = self.recv()
            if m.get("id") == id:
                return m

    def close(self) -> None:
        self.p.stdin.close()
        assert self.p.wait(timeout=10) == 0
        self.p.stdout.close()
        self.p.stderr.close()


def modern_meta(version="2026-07-28"):
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    }


def test_raw_handshake_versions_and_stateless_details(home):
    for asked, answered in [
        ("2024-11-05", "2024-11-05"),
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),  # rmcp asks this in initialize
        ("1999-01-01", "2025-11-25"),
    ]:
        raw = Raw(home)
        r = raw.request(1, "initialize", {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}})
        assert r["result"]["protocolVersion"] == answered, (asked, r)
        assert r["result"]["serverInfo"]["name"] == "abx"
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert raw.request(2, "ping")["result"] == {}
        tools = raw.request(3, "tools/list")["result"]["tools"]
        assert {t["name"] for t in tools} == TOOLS
        # outputSchema exists from 2025-06-18 on; annotations from 2025-03-26 on.
        assert all(("outputSchema" in t) == (answered >= "2025-06-18") for t in tools)
        assert all(("annotations" in t) == (answered >= "2025-03-26") for t in tools)
        assert "resultType" not in raw.request(4, "tools/list")["result"]
        raw.close()

    raw = Raw(home)
    d = raw.request(1, "server/discover", {"_meta": modern_meta()})["result"]
    assert d["supportedVersions"][0] == "2026-07-28" and "2025-11-25" in d["supportedVersions"]
    assert d["resultType"] == "complete" and d["capabilities"]["tools"] == {"listChanged": False}
    assert isinstance(d["ttlMs"], int) and d["cacheScope"] in ("private", "public")
    assert d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "abx"
    t = raw.request(2, "tools/list", {"_meta": modern_meta()})["result"]
    assert t["resultType"] == "complete" and "ttlMs" in t and "cacheScope" in t
    e = raw.request(3, "tools/list", {"_meta": modern_meta("2030-01-01")})["error"]
    assert e["code"] == -32022 and e["data"]["requested"] == "2030-01-01"
    assert "2026-07-28" in e["data"]["supported"]
    # Unknown methods: -32601 at once; an unknown tool is a protocol error too.
    t0 = time.monotonic()
    assert raw.request(4, "no/such/method", {"_meta": modern_meta()})["error"]["code"] == -32601
    assert time.monotonic() - t0 < 2
    assert raw.request(5, "tools/call", {"name": "nope", "arguments": {}, "_meta": modern_meta()})["error"]["code"] == -32602
    # A failing tool is a result, with resultType in this era.
    r = raw.request(6, "tools/call", {"name": "sandbox_info", "arguments": {"sandbox": "zz"}, "_meta": modern_meta()})["result"]
    assert r["isError"] is True and r["resultType"] == "complete"
    assert r["content"][0]["text"].startswith("[E2009]")
    raw.close()


@pytest.mark.parametrize("era", MODES)
def test_network_policy_create_and_set_network(home, era):
    """sandbox_create takes a policy; sandbox_set_network replaces it and tells the agent to
    ask the user first (open-world, not read-only); a mode cannot be switched to."""

    async def main():
        async with Client(server(home), mode=MODES[era]) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            t = tools["sandbox_set_network"]
            assert "ASK THE USER FIRST" in t.description
            assert t.annotations.read_only_hint is False and t.annotations.open_world_hint is True
            assert tools["sandbox_create"].annotations.open_world_hint is False
            assert "network" in tools["sandbox_create"].input_schema["properties"]
            created = await client.call_tool("sandbox_create", {"network": {"allow": ["pypi.example"]}})
            assert not created.is_error, text(created)
            sb = created.structured_content["id"]
            assert created.structured_content["network"]["allow"] == ["pypi.example"]
            assert created.structured_content["network"]["blocked"] == []
            r = await client.call_tool(
                "sandbox_set_network", {"sandbox": sb, "network": {"allow": ["pypi.example", "files.example"], "deny": ["bad.example"]}}
            )
            assert not r.is_error, text(r)
            assert r.structured_content["network"]["allow"] == ["pypi.example", "files.example"]
            assert r.structured_content["network"]["deny"] == ["bad.example"]
            # The 403 a command gets names the way to allow a host.
            out = await client.call_tool("exec", {"sandbox": sb, "command": "curl -s http://other.example/"})
            assert "other.example" in text(out), text(out)
            info = await client.call_tool("sandbox_info", {"sandbox": sb})
            assert any(b["host"] == "other.example" for b in info.structured_content["network"]["blocked"])
            bad = await client.call_tool("sandbox_set_network", {"sandbox": sb, "network": {"allow": ["127.0.0.1"]}})
            assert bad.is_error and "[E1004]" in text(bad), text(bad)
            await client.call_tool("sandbox_kill", {"sandbox": sb})

    run(main)


def test_an_agent_reaches_the_daemon_of_the_users_shell(monkeypatch, tmp_path):
    """Issue 41: docs/mcp.md promises that an agent's sandboxes are the ones `abx list` shows.
    The MCP SDK launches `abx mcp` with only HOME, LOGNAME, PATH, SHELL, TERM and USER (its
    `get_default_environment`: no XDG_RUNTIME_DIR); it must reach the daemon that the user's
    shell (which has XDG_RUNTIME_DIR) started, on the same data, and start no other."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    for d in (home, xdg):
        d.mkdir(mode=0o700)
    shell = {"HOME": str(home), "PATH": os.environ["PATH"], "XDG_RUNTIME_DIR": str(xdg)}

    def abx(*args, env=shell):
        p = subprocess.run([str(ABX), "-j", *args], env=env, capture_output=True, timeout=120)
        assert p.returncode == 0, (args, p.stdout, p.stderr)
        return json.loads(p.stdout)

    abx("broker", "start")
    try:
        pid = abx("broker", "status")["pid"]
        sb = abx("create")["id"]
        # What the SDK will pass on: this process's HOME, and no XDG_RUNTIME_DIR or ABX_HOME.
        monkeypatch.setenv("HOME", str(home))
        for var in ("XDG_RUNTIME_DIR", "ABX_HOME", "XDG_DATA_HOME"):
            monkeypatch.delenv(var, raising=False)

        async def main():
            async with Client(StdioServerParameters(command=str(ABX), args=["mcp"])) as client:
                listed = await client.call_tool("sandbox_list", {})
                assert not listed.is_error, text(listed)
                assert sb in {s["id"] for s in listed.structured_content["sandboxes"]}
                created = await client.call_tool("sandbox_create", {"metadata": {"by": "agent"}})
                assert not created.is_error, text(created)
                return created.structured_content["id"]

        mine = run(main)
        # The shell sees the agent's sandbox, through the daemon it started.
        ids = {s["id"] for s in abx("list")["sandboxes"]}
        assert {sb, mine} <= ids
        assert abx("broker", "status")["pid"] == pid
        no_xdg = {k: v for k, v in shell.items() if k != "XDG_RUNTIME_DIR"}
        assert abx("broker", "status", env=no_xdg)["pid"] == pid
        for s in (sb, mine):
            abx("kill", s, "--yes")
    finally:
        subprocess.run([str(ABX), "broker", "stop"], env=shell, capture_output=True, timeout=60)
        key = subprocess.run(
            ["sh", "-c", 'printf %s "$1" | sha256sum | cut -c1-16', "sh", str(home / ".local/share/abx")],
            capture_output=True, text=True,
        ).stdout.strip()
        shutil.rmtree(f"/tmp/abx-{os.geteuid()}/{key}", ignore_errors=True)
