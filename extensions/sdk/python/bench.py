"""Bench of the Python SDK (docs/performance.md, "Python SDK"). Not a test: figures printed.

1. ``sb.exec("true")`` round trip through the SDK against the same ``exec/run`` sent through
   ``abx rpc`` (one long-lived bridge process, driven from Python over its stdin/stdout):
   ratio SDK / rpc, bar <= 1.5x.
2. ``Sandbox.list()`` in a fresh interpreter (``python -c "import abx; abx.Sandbox.list()"``,
   warm daemon) against ``python -c pass``: the start-up cost the SDK adds.

Its own ABX_HOME and daemon (started by the SDK, so it inherits this process's CPU
affinity): run it as is and under ``taskset -c 0`` for the pinned figures (DESIGN §13).

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
        for _ in range(200):
            sb.exec("true")
        sdk = []
        for _ in range(N):
            t0 = time.perf_counter()
            sb.exec("true")
            sdk.append(time.perf_counter() - t0)

        rpc = subprocess.Popen([os.environ["ABX_BIN"], "rpc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               bufsize=0)
        assert rpc.stdin and rpc.stdout
        out = rpc.stdout
        params = {"sandbox": f"local:{sb.id}", "command": "true"}
        times = []
        buf = b""
        for i in range(200 + N):
            body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "exec/run", "params": params},
                              separators=(",", ":")).encode() + b"\n"
            t0 = time.perf_counter()
            rpc.stdin.write(body)
            while b"\n" not in buf:
                buf += out.read1(65536) if hasattr(out, "read1") else os.read(out.fileno(), 65536)
            line, buf = buf.split(b"\n", 1)
            r = json.loads(line)
            dt = time.perf_counter() - t0
            assert r["id"] == i and r["result"]["exitCode"] == 0, r
            if i >= 200:
                times.append(dt)
        rpc.stdin.close()
        rpc.wait(timeout=30)
        s_sdk, s_rpc = stats(sdk), stats(times)
        print(f"exec('true') via SDK       {fmt(s_sdk)}")
        print(f"exec/run via abx rpc       {fmt(s_rpc)}")
        print(f"ratio SDK / abx rpc        p50 {s_sdk['p50'] / s_rpc['p50']:.2f}x  mean "
              f"{s_sdk['mean'] / s_rpc['mean']:.2f}x  (bar <= 1.5x)")

        env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONDONTWRITEBYTECODE": "1"}
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
