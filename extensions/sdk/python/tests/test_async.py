"""The asyncio API against the real broker: the same surface, stream order with one exit,
bytes exact, errors per code, task cancellation reaching the broker, concurrent calls on one
connection and two connections at once."""

from __future__ import annotations

import asyncio
import os

import pytest

import abx
from abx import AsyncSandbox
from abx.aio import AsyncConnection

BINARY = "printf 'a\\000b\\377\\376z'"
BINARY_BYTES = b"a\x00b\xff\xfez"


def run(coro):
    return asyncio.run(coro)


async def deadline(what, cond, timeout=20.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_lifecycle_exec_files(home, tmp_path):
    async def main():
        async with await AsyncConnection.open() as c:
            sb = await AsyncSandbox.create(provider="local", timeout=100, metadata={"a": "b"}, connection=c)
            assert sb.status == "running" and (await sb.info()).metadata == {"a": "b"}
            assert await sb.refresh() is sb
            assert (await AsyncSandbox.connect(sb.id, connection=c)).id == sb.id
            assert sb.id in [s.id for s in await AsyncSandbox.list(connection=c)]
            r = await sb.exec(f"{BINARY}; {BINARY} >&2; exit 3", env={"X": "1"}, cwd="/workspace")
            assert (r.exit_code, r.stdout_bytes, r.stderr_bytes) == (3, BINARY_BYTES, BINARY_BYTES)
            assert (await sb.exec("cat", stdin=BINARY_BYTES)).stdout_bytes == BINARY_BYTES
            f = sb.files
            blob = os.urandom(200_000)
            await f.mkdir("d/e", parents=True)
            assert await f.write("d/e/b.bin", blob) == len(blob)
            assert await f.read_bytes("d/e/b.bin") == blob
            await f.write("t.txt", "héllo")
            assert await f.read("t.txt") == "héllo" and await f.exists("t.txt") and not await f.exists("n")
            assert (await f.stat("t.txt")).size == 6
            assert sorted(e.name for e in await f.list()) == ["d", "t.txt"]
            await f.rename("t.txt", "u.txt")
            await f.remove("d", recursive=True)
            assert [e.name for e in await f.list()] == ["u.txt"]
            src = tmp_path / "up"
            src.write_bytes(blob)
            assert await f.upload(str(src), "up") == len(blob)
            assert await f.download("up", str(tmp_path / "down")) == len(blob)
            assert (tmp_path / "down").read_bytes() == blob
            async with await f.watch("/workspace") as w:
                await f.write("w.txt", "1")
                change = await asyncio.wait_for(w.__anext__(), 20)
                assert change.path.startswith("/workspace/") and change.kind
            procs = await sb.processes.list()
            assert isinstance(procs, list)
            assert (await sb.ports.url(9000)).url.endswith(":9000")
            assert (await sb.set_timeout(500)).timeout == 500
            assert (await sb.pause()).status == "paused"
            assert (await sb.resume()).status == "running"
            assert (await sb.capabilities()).features and (await sb.system_info()).os
            # local declares code.interpret: the default context keeps its state (py-local's E8004 below).
            assert (await sb.run_code("y = 6")).error is None
            assert (await sb.run_code("y * 7")).results[0]["text/plain"] == "42"
            assert await sb.kill() is True and await sb.kill() is False

    run(main())


def test_stream_order_one_exit_last_and_stdin(sb):
    async def main():
        s = await AsyncSandbox.connect(sb.id)
        st = await s.exec_stream("for i in 1 2 3; do echo o$i; echo e$i >&2; done; " + BINARY + "; exit 5")
        events = [e async for e in st]
        assert isinstance(events[-1], abx.ExecExit) and events[-1].exit_code == 5
        assert sum(isinstance(e, abx.ExecExit) for e in events) == 1
        out = b"".join(e.data for e in events if isinstance(e, abx.ExecOutput) and e.stream == "stdout")
        assert out == b"o1\no2\no3\n" + BINARY_BYTES
        cat = await s.exec_stream("cat")
        await cat.write(BINARY_BYTES, eof=True)
        got = b"".join([e.data async for e in cat if isinstance(e, abx.ExecOutput)])
        assert got == BINARY_BYTES
        slow = await s.exec_stream("sleep 60")
        await slow.kill()
        ex = await asyncio.wait_for(slow.wait(), 30)
        assert ex.signal == "SIGKILL"
        p = await s.exec_stream("stty size", pty=(90, 20))
        text = b"".join([e.data async for e in p if isinstance(e, abx.ExecOutput)])
        assert b"20 90" in text

    run(main())


def test_errors(sb):
    async def main():
        with pytest.raises(abx.SandboxNotFoundError) as e:
            await AsyncSandbox.connect("sb-nope")
        assert e.value.code == "E2009" and e.value.suggestion
        s = await AsyncSandbox.connect(sb.id)
        with pytest.raises(abx.SandboxFileNotFoundError):
            await s.files.read("nope")
        with pytest.raises(abx.ProviderNotInstalledError):
            await AsyncSandbox.create(provider="nope")

    run(main())


def test_task_cancel_and_timeout_reach_the_broker(sb):
    async def sleepers(s):
        return [p for p in await s.processes.list() if "sleep 88" in (p.command or "")]

    async def main():
        s = await AsyncSandbox.connect(sb.id)
        task = asyncio.ensure_future(s.exec("sleep 88"))
        await deadline("sleep 88 to run", lambda: _truthy(sleepers(s)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await deadline("the cancelled exec/run to be killed", lambda: _falsy(sleepers(s)))
        with pytest.raises(abx.RequestTimeoutError):
            await s.connection.call("exec/run", {"sandbox": s._route, "command": "sleep 88"}, timeout=0.5)
        await deadline("the timed-out exec/run to be killed", lambda: _falsy(sleepers(s)))
        assert (await s.exec("echo ok")).stdout == "ok\n"
        c = await AsyncConnection.open(request_timeout=0.5)
        s2 = await AsyncSandbox.connect(sb.id, connection=c)
        with pytest.raises(abx.RequestTimeoutError):
            await s2.exec("sleep 88")
        await deadline("the request_timeout exec/run to be killed", lambda: _falsy(sleepers(s)))
        await c.close()

    run(main())


async def _truthy(aw):
    return bool(await aw)


async def _falsy(aw):
    return not await aw


def test_concurrent_calls_and_two_connections(sb):
    async def main():
        a, b = await AsyncConnection.open(), await AsyncConnection.open()
        sa = await AsyncSandbox.connect(sb.id, connection=a)
        sb2 = await AsyncSandbox.connect(sb.id, connection=b)

        async def stream(s, name):
            st = await s.exec_stream(f"for i in $(seq 1 100); do echo {name}$i; done")
            return b"".join([e.data async for e in st if isinstance(e, abx.ExecOutput)])

        outs = await asyncio.gather(stream(sa, "a"), stream(sb2, "b"), stream(sa, "c"),
                                    *[sa.exec(f"echo {i}") for i in range(10)])
        for out, n in zip(outs[:3], "abc"):
            assert out == "".join(f"{n}{i}\n" for i in range(1, 101)).encode()
        assert [r.stdout for r in outs[3:]] == [f"{i}\n" for i in range(10)]
        await a.close()
        with pytest.raises(abx.BrokerUnreachableError):
            await sa.exec("true")
        assert (await sb2.exec("echo still")).stdout == "still\n"  # the other client is unaffected
        await b.close()

    run(main())


def test_providers_async(py_local):
    async def main():
        ids = [p.id for p in await abx.aio.providers.list()]
        assert "local" in ids and py_local in ids
        assert (await abx.aio.providers.info(py_local)).id == py_local
        assert (await abx.aio.providers.doctor(py_local)).ok
        seen = []
        r = await abx.aio.providers.test(py_local, filter="lifecycle", on_result=seen.append)
        assert r.failed == 0 and len(seen) == len(r.results)
        s = await AsyncSandbox.create(provider=py_local)
        assert (await s.exec("echo hi")).stdout == "hi\n"
        with pytest.raises(abx.FeatureNotSupportedError):
            await s.run_code("1")
        assert await s.kill()

    run(main())
