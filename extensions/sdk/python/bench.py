"""Bench of the Python SDK (docs/performance.md, "Python SDK"). Not a test: figures printed.

1. ``sb.exec("true")`` round trip through the SDK against the same ``exec/run`` sent through
   ``abx rpc`` (one long-lived bridge process, driven from Python over its stdin/stdout):
   ratio SDK / rpc, bar <= 1.5x.
2. ``Sandbox.list()`` in a fresh interpreter (``python -c "import abx; abx.Sandbox.list()"``,
   warm daemon) against ``python -c pass``: the start-up cost the SDK adds.

Its own ABX_HOME and daemon (started by the SDK, so it inherits this process's CPU
affinity): run it as is and under ``taskset -c 0`` for the pinned figures (docs/design.md#bars).

    ABX_BIN=target/debug/abx python extensions/sdk/python/bench.py      # ABX_BENCH_N=2000
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ROOT = HERE.parents[2]
os.environ.setdefault("ABX_BIN", str(ROOT / "target" / "release" / "abx"))
N = int(os.environ.get("ABX_BENCH_N", "2000"))
STARTS = int(os.environ.get("ABX_BENCH_STARTS", "30"))


def stats(xs):
    xs = sorted(xs)
    return {"p50": xs[len(xs) // 2] * 1e6, "p99": xs[int(len(xs) * 0.99)] * 1e6, "mean": statistics.mean(xs) * 1e6}


def fmt(s):
    return f"p50 {s['p50']:8.1f} us  p99 {s['p99']:8.1f} us  mean {s['mean']:8.1f} us"


def main() -> None:
    home = tempfile.mkdtemp(prefix="abx-sdk-bench-")
    os.environ["ABX_HOME"] = home
    import abx

    try:
        sb = abx.Sandbox.create(provider="local")
        rpc = subprocess.Popen([os.environ["ABX_BIN"], "rpc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               bufsize=0)
        assert rpc.stdin and rpc.stdout
        out = rpc.stdout
        params = {"sandbox": f"local:{sb.id}", "command": "true"}
        buf = b""
        next_id = 0

        def via_rpc():
            nonlocal buf, next_id
            next_id += 1
            body = json.dumps({"jsonrpc": "2.0", "id": next_id, "method": "exec/run", "params": params},
                              separators=(",", ":")).encode() + b"\n"
            t0 = time.perf_counter()
            rpc.stdin.write(body)
            while b"\n" not in buf:
                buf += os.read(out.fileno(), 65536)
            line, buf = buf.split(b"\n", 1)
            dt = time.perf_counter() - t0
            r = json.loads(line)
            assert r["id"] == next_id and r["result"]["exitCode"] == 0, r
            return dt

        def via_sdk():
            t0 = time.perf_counter()
            sb.exec("true")
            return time.perf_counter() - t0

        ping_body = {"jsonrpc": "2.0", "method": "broker/ping", "params": {}}

        def ping_rpc():
            nonlocal buf, next_id
            next_id += 1
            body = json.dumps({**ping_body, "id": next_id}, separators=(",", ":")).encode() + b"\n"
            t0 = time.perf_counter()
            rpc.stdin.write(body)
            while b"\n" not in buf:
                buf += os.read(out.fileno(), 65536)
            line, buf = buf.split(b"\n", 1)
            dt = time.perf_counter() - t0
            assert json.loads(line)["id"] == next_id
            return dt

        def ping_sdk():
            t0 = time.perf_counter()
            sb.connection.call("broker/ping")
            return time.perf_counter() - t0

        for _ in range(500):
            ping_sdk()
            ping_rpc()
        psdk, prpc = [], []
        for _ in range(4):
            psdk += [ping_sdk() for _ in range(N // 4)]
            prpc += [ping_rpc() for _ in range(N // 4)]
        for _ in range(200):
            via_sdk()
            via_rpc()
        sdk, times = [], []
        for _ in range(4):  # interleaved rounds: both paths see the same machine
            sdk += [via_sdk() for _ in range(N // 4)]
            times += [via_rpc() for _ in range(N // 4)]
        rpc.stdin.close()
        rpc.wait(timeout=30)
        s_sdk, s_rpc = stats(sdk), stats(times)
        p_sdk, p_rpc = stats(psdk), stats(prpc)
        print(f"broker/ping via SDK        {fmt(p_sdk)}")
        print(f"broker/ping via abx rpc    {fmt(p_rpc)}")
        print(f"ratio SDK / abx rpc        p50 {p_sdk['p50'] / p_rpc['p50']:.2f}x  (noted, no bar)")
        print(f"exec('true') via SDK       {fmt(s_sdk)}")
        print(f"exec/run via abx rpc       {fmt(s_rpc)}")
        print(f"ratio SDK / abx rpc        p50 {s_sdk['p50'] / s_rpc['p50']:.2f}x  mean "
              f"{s_sdk['mean'] / s_rpc['mean']:.2f}x  (bar <= 1.5x)")

        # Byte-compiled, as an installed package is (pip compiles on install).
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE / "abx")], check=True)
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        py = sys.executable

        def starts(code):
            xs = []
            for _ in range(STARTS):
                t0 = time.perf_counter()
                subprocess.run([py, "-c", code], env=env, check=True)
                xs.append(time.perf_counter() - t0)
            return stats(xs)

        starts("pass")
        base = starts("pass")
        lst = starts("import abx; abx.Sandbox.list()")
        print(f"python -c pass             p50 {base['p50'] / 1e3:7.1f} ms  mean {base['mean'] / 1e3:7.1f} ms")
        print(f"Sandbox.list() fresh       p50 {lst['p50'] / 1e3:7.1f} ms  mean {lst['mean'] / 1e3:7.1f} ms  "
              f"(adds {(lst['p50'] - base['p50']) / 1e3:.1f} ms, {lst['p50'] / base['p50']:.2f}x)")
        sb.kill()
    finally:
        subprocess.run([os.environ["ABX_BIN"], "broker", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
