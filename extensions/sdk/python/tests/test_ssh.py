"""The SDK (sync and asyncio) and the CLI reaching a broker "on another machine" through a
real sshd on a loopback port (tests/sshd.py), and the three ssh failures as typed errors."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

import abx
from conftest import ABX
from sshd import Sshd, free_port, missing

if missing():
    print(f"SKIPPED test_ssh: {missing()}")
    pytest.skip(missing(), allow_module_level=True)

BINARY_BYTES = b"a\x00b\xff\xfez"


@pytest.fixture(scope="module")
def sshd(home):
    d = Path(tempfile.mkdtemp(prefix="abx-sshd-"))
    s = Sshd(d)
    old = {k: os.environ.get(k) for k in ("ABX_SSH_CONFIG", "ABX_REMOTE_BIN")}
    os.environ["ABX_SSH_CONFIG"] = s.config
    os.environ["ABX_REMOTE_BIN"] = str(ABX)
    yield s
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    s.stop(str(ABX))


def test_sdk_over_ssh(sshd, tmp_path):
    with abx.Connection(sshd.url) as c:
        assert c.is_remote
        sb = abx.Sandbox.create(provider="local", connection=c)
        try:
            r = sb.exec("printf 'a\\000b\\377\\376z'; echo err >&2; exit 3")
            assert (r.exit_code, r.stdout_bytes, r.stderr) == (3, BINARY_BYTES, "err\n")
            events = list(sb.exec_stream("echo 1; echo 2"))
            assert isinstance(events[-1], abx.ExecExit) and sum(isinstance(e, abx.ExecExit) for e in events) == 1
            sb.files.write("b.bin", BINARY_BYTES)
            assert sb.files.read_bytes("b.bin") == BINARY_BYTES
            # upload/download carry this machine's file over the connection
            src = tmp_path / "up"
            src.write_bytes(BINARY_BYTES * 1000)
            assert sb.files.upload(str(src), "up") == len(BINARY_BYTES) * 1000
            assert sb.files.download("up", str(tmp_path / "down")) == len(BINARY_BYTES) * 1000
            assert (tmp_path / "down").read_bytes() == src.read_bytes()
            assert sb.id in [s.id for s in abx.Sandbox.list(connection=c)]
            # the broker reached is the one over there (its own ABX_HOME), not this machine's
            assert sb.id not in [s.id for s in abx.Sandbox.list()]
            assert sshd.remote_home.joinpath("run", "broker.sock").exists()
            with pytest.raises(abx.SandboxNotFoundError):
                abx.Sandbox.connect("sb-nope", connection=c)
        finally:
            assert sb.kill()
    # host= alone (the shared connection for that host)
    sb = abx.Sandbox.create(host=sshd.url)
    assert sb.connection.is_remote and sb.exec("echo hi").stdout == "hi\n"
    assert sb.kill()


def test_sdk_reads_abx_host(sshd, monkeypatch):
    monkeypatch.setenv("ABX_HOST", sshd.url)
    c = abx.Connection()
    assert c.is_remote and isinstance(abx.Sandbox.list(connection=c), list)
    c.close()


def test_async_over_ssh(sshd):
    async def main():
        c = await abx.AsyncConnection.open(sshd.url)
        sb = await abx.AsyncSandbox.create(connection=c)
        r = await sb.exec("printf 'a\\000b\\377\\376z'")
        assert r.stdout_bytes == BINARY_BYTES
        st = await sb.exec_stream("echo x; exit 4")
        evs = [e async for e in st]
        assert evs[-1].exit_code == 4
        assert await sb.kill()
        await c.close()

    asyncio.run(main())


def test_ssh_errors_are_typed(sshd, monkeypatch):
    nothing = f"ssh://{sshd.user}@127.0.0.1:{free_port()}"
    with pytest.raises(abx.HostUnreachableError) as e:
        abx.Connection(nothing)
    assert e.value.code == "E1014" and "Connection refused" in e.value.message and e.value.suggestion
    assert isinstance(e.value, abx.BrokerUnreachableError)

    monkeypatch.setenv("ABX_SSH_CONFIG", sshd.wrong_config)
    with pytest.raises(abx.HostAuthError) as e:
        abx.Connection(sshd.url)
    assert e.value.code == "E1015" and "Permission denied" in e.value.message
    monkeypatch.setenv("ABX_SSH_CONFIG", sshd.config)

    monkeypatch.setenv("ABX_REMOTE_BIN", "/nonexistent/abx")
    with pytest.raises(abx.RemoteAbxNotFoundError) as e:
        abx.Connection(sshd.url)
    assert e.value.code == "E1016" and "/nonexistent/abx" in e.value.message and "ABX_REMOTE_BIN" in e.value.suggestion

    async def aio():
        with pytest.raises(abx.RemoteAbxNotFoundError):
            await abx.AsyncConnection.open(sshd.url)

    asyncio.run(aio())

    with pytest.raises(abx.UsageError):
        abx.Connection("tcp://box")


def test_cli_over_ssh_matches_the_sdk(sshd):
    env = {**os.environ, "ABX_HOST": sshd.url}
    out = subprocess.run([str(ABX), "-j", "create"], env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    sid = json.loads(out.stdout)["id"]
    assert sid in [s.id for s in abx.Sandbox.list(host=sshd.url)]
    ex = subprocess.run([str(ABX), "exec", sid, "echo via-cli; exit 5"], env=env, capture_output=True, timeout=60)
    assert (ex.returncode, ex.stdout) == (5, b"via-cli\n")
    assert abx.Sandbox.connect(sid, host=sshd.url).kill()
