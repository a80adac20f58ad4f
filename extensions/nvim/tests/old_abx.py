#!/usr/bin/env python3
"""An abx as it was before `sandbox/subscribe`, made from the real one (ABX_REAL_BIN).

`old_abx.py rpc` runs the real `abx rpc` and stands between it and the client (newline-
delimited JSON, what abx.nvim speaks): `initialize` no longer lists the methods of MISSING,
and calling one gets the broker's own answer for an unknown method (-32601, E1003).
Everything else passes through unchanged, both ways. Other arguments run the real binary.
"""
import json
import os
import subprocess
import sys
import threading

MISSING = {"sandbox/subscribe", "sandbox/unsubscribe"}

real = os.environ.get("ABX_REAL_BIN")
if not real:
    sys.stderr.write("old_abx.py: ABX_REAL_BIN is not set\n")
    sys.exit(2)
args = sys.argv[1:]
if not args or args[0] != "rpc":
    os.execv(real, [real] + args)

child = subprocess.Popen([real] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
lock = threading.Lock()


def write(data: bytes) -> None:
    with lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def from_broker() -> None:
    for line in child.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            write(line)
            continue
        methods = None
        if isinstance(msg, dict) and isinstance(msg.get("result"), dict):
            methods = (msg["result"].get("capabilities") or {}).get("methods")
        if isinstance(methods, list):
            msg["result"]["capabilities"]["methods"] = [m for m in methods if m not in MISSING]
            write((json.dumps(msg) + "\n").encode())
        else:
            write(line)


reader = threading.Thread(target=from_broker)
reader.start()
for line in sys.stdin.buffer:
    try:
        msg = json.loads(line)
    except ValueError:
        msg = None
    if isinstance(msg, dict) and msg.get("method") in MISSING:
        if "id" in msg:
            err = {
                "code": -32601,
                "message": "Method '%s' not found." % msg["method"],
                "data": {"abx": "E1003", "suggestion": "See docs/broker-api.md for the method catalogue."},
            }
            write((json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": err}) + "\n").encode())
        continue
    child.stdin.write(line)
    child.stdin.flush()
child.stdin.close()
code = child.wait()
reader.join()
sys.exit(code)
