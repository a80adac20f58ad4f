"""The seed's sdk_run.py flow through the abx SDK: create, refresh, exec, a 300 KB binary
round trip, unicode text, list, a missing file, processes, ports, set_timeout, pause, resume,
run_code, files.watch, connect, list, a bogus provider, kill.

    python examples/sdk_run.py [provider]      # default: the default provider (local)
"""

from __future__ import annotations

import os
import sys

import abx
from abx import Sandbox


def err(e: abx.AbxError):
    return (type(e).__name__, e.code, str(e)[:140])


def main() -> int:
    provider = sys.argv[1] if len(sys.argv) > 1 else None
    sb = Sandbox.create(provider=provider, timeout=300)
    print("create:", (sb.id, sb.provider, sb.status))
    info = sb.info()
    print("refresh_info:", (info.status, info.template, info.region, info.timeout))
    print("capabilities:", sb.capabilities().capabilities)
    r = sb.exec("echo hello-sdk; echo err >&2; exit 4")
    print("exec:", (r.exit_code, r.stdout, r.stderr))
    blob = os.urandom(300 * 1024)
    sb.files.write("b.bin", blob)
    print("files roundtrip equal:", sb.files.read_bytes("b.bin") == blob)
    sb.files.write("t.txt", "héllo\n")
    print("files.read:", repr(sb.files.read("t.txt")))
    print("files.list:", sorted(e.name for e in sb.files.list()))
    print("files.exists missing:", sb.files.exists("nope"))
    try:
        sb.files.read("/workspace/nope")
    except abx.SandboxFileNotFoundError as e:
        print("files.read missing ->:", err(e))
    print("processes:", [p.pid for p in sb.processes.list()])
    u = sb.ports.url(9000)
    print("ports.url(9000):", (u.url, u.headers))
    print("set_timeout:", sb.set_timeout(600).timeout)
    print("paused status:", sb.pause().status)
    print("resumed status:", sb.resume().status)
    print("exec after resume:", repr(sb.exec("echo alive").stdout))
    try:
        print("run_code:", sb.run_code("1 + 1", language="python").results)
    except abx.FeatureNotSupportedError as e:
        print("run_code ->:", err(e))
    try:
        with sb.files.watch("/workspace") as w:
            sb.files.write("w.txt", "x")
            change = w.next(timeout=10)
            while change is not None and not change.path.endswith("/w.txt"):  # skip the atomic write's temp file
                change = w.next(timeout=10)
            print("files.watch:", change and (change.path, change.kind))
    except abx.FeatureNotSupportedError as e:
        print("files.watch ->:", err(e))
    again = Sandbox.connect(sb.id)
    print("connect:", (again.id, again.status))
    print("list contains:", sb.id in [s.id for s in Sandbox.list()])
    try:
        Sandbox.create(provider="nope")
    except abx.ProviderNotInstalledError as e:
        print("create bogus provider ->:", err(e))
    print("killed:", sb.kill())
    print("list after kill:", [s.id for s in Sandbox.list() if s.id == sb.id])
    return 0


if __name__ == "__main__":
    sys.exit(main())
