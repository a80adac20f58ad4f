"""Issue 46's defects of the native SDK, against the real broker: parents made on write,
stream handles that end their command (Ctrl-C, process exit, leaving ``with``) and can
re-attach (``exec/attach``), records whose unknown attributes raise, ssh suggestions with
the port and the CLI's options."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import abx
from abx._transport import parse_host
from conftest import wait_until


def running(sb, marker: str) -> bool:
    return any(marker in (p.command or "") for p in sb.processes.list())


def test_write_makes_parents(sb):
    assert sb.files.write("new/deep/dir/f.txt", "x") == 1
    assert sb.files.read("/workspace/new/deep/dir/f.txt") == "x"
    assert sb.files.write("/tmp/a/b/c.bin", b"\x00\xff") == 2
    assert sb.files.read_bytes("/tmp/a/b/c.bin") == b"\x00\xff"
    with pytest.raises(abx.ReadOnlyError):  # a place that cannot be written still says so
        sb.files.write("/nope/x", "x")


def test_async_write_makes_parents(sb):
    async def main():
        s = await abx.AsyncSandbox.connect(sb.id)
        await s.files.write("async/deep/f.txt", "y")
        return await s.files.read("async/deep/f.txt")

    assert asyncio.run(main()) == "y"


def test_records_refuse_unknown_attributes(sb):
    info = sb.info()
    assert info.id == sb.id and info.template_digest is None  # a field of Sandbox the reply left out
    with pytest.raises(AttributeError, match="expires_att"):
        info.expires_att
    entry = sb.files.stat("/workspace")
    assert entry.type in ("dir", "directory")
    with pytest.raises(AttributeError):
        entry.no_such_field
    with pytest.raises(AttributeError):
        info.id = "x"  # read-only


def test_with_block_ends_the_command(sb):
    with sb.exec_stream("sleep 311") as s:
        wait_until("sleep 311 runs", lambda: running(sb, "sleep 311"))
        assert s.exit is None
    wait_until("sleep 311 ended with the with block", lambda: not running(sb, "sleep 311"))


def test_async_with_block_ends_the_command(sb):
    async def main():
        s = await abx.AsyncSandbox.connect(sb.id)
        async with await s.exec_stream("sleep 312"):
            await asyncio.to_thread(wait_until, "sleep 312 runs", lambda: running(sb, "sleep 312"))

    asyncio.run(main())
    wait_until("sleep 312 ended", lambda: not running(sb, "sleep 312"))


CHILD = textwrap.dedent('''
    import sys, abx
    sb = abx.Sandbox.connect(sys.argv[1])
    s = sb.exec_stream(sys.argv[2])
    print("started", flush=True)
    if sys.argv[3] == "exit":
        sys.stdin.readline()
        sys.exit(0)          # the process ends with the stream still running
    for ev in s:             # Ctrl-C (SIGINT) arrives while reading
        pass
''')


@pytest.mark.parametrize("how", ["ctrl-c", "exit"])
def test_ctrl_c_and_process_exit_end_the_command(sb, how):
    cmd = f"sleep 31{3 if how == 'ctrl-c' else 4}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-c", CHILD, sb.id, cmd, how], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"started", p.stderr.read()
    wait_until(f"{cmd} runs", lambda: running(sb, cmd))
    if how == "ctrl-c":
        p.send_signal(signal.SIGINT)
    else:
        p.stdin.write(b"go\n")
        p.stdin.flush()
    rc = p.wait(timeout=30)
    assert rc in (0, 1, -signal.SIGINT), p.stderr.read()
    wait_until(f"{cmd} ended with its client", lambda: not running(sb, cmd))


def test_detach_and_attach_again(sb):
    s = sb.exec_stream("echo before; read line; echo after $line")
    first = s.next(timeout=10)
    assert first.text == "before\n"
    exec_id = s.detach()
    other = abx.Connection()
    try:
        again = abx.Sandbox.connect(sb.id, connection=other).attach(exec_id)
        assert again.attached.running is True
        again.write("ok\n", eof=True)
        events = list(again)
        out = b"".join(e.data for e in events if isinstance(e, abx.ExecOutput))
        assert out.endswith(b"after ok\n") and events[-1].exit_code == 0
    finally:
        other.close()


def test_ssh_suggestions_name_the_port_and_options(monkeypatch):
    monkeypatch.setenv("ABX_SSH_CONFIG", "/etc/abx-ssh-config")
    h = parse_host("ssh://root@127.0.0.1:2222")
    cmd = h.check_command()
    assert cmd == "ssh -F /etc/abx-ssh-config -p 2222 -T -o BatchMode=yes -- root@127.0.0.1 true"
    e = h.classify(255, "ssh: connect to host 127.0.0.1 port 2222: Connection refused")
    assert e.code == "E1014" and cmd in e.suggestion
    e = h.classify(255, "root@127.0.0.1: Permission denied (publickey).")
    assert e.code == "E1015" and cmd in e.suggestion
    monkeypatch.delenv("ABX_SSH_CONFIG")
    assert parse_host("ssh://u@h").check_command() == "ssh -T -o BatchMode=yes -- u@h true"


def test_record_fields_follow_openrpc():
    """abx/_fields.py is generated from docs/openrpc.json: a field added there must be known
    here (else reading it when absent would raise). Regenerate it as its header says."""
    import json

    from abx._fields import FIELDS
    from conftest import ROOT

    spec = json.loads((ROOT / "docs" / "openrpc.json").read_text())["components"]["schemas"]
    stale = {}
    for name, fields in FIELDS.items():
        props = set((spec.get(name) or {}).get("properties", {}))
        if props - set(fields):
            stale[name] = sorted(props - set(fields))
    assert stale == {}, f"regenerate abx/_fields.py: {stale}"


def test_run_code_streams_its_output_and_is_typed(sb):
    seen = []
    r = sb.run_code("import sys\nprint('a')\nprint('b', file=sys.stderr)\n6*7", on_output=seen.append)
    assert isinstance(r, abx.CodeResult) and r.results == [{"text/plain": "42"}] and r.error is None
    assert [(o.type, o.text) for o in seen if o.type in ("stdout", "stderr")] == [("stdout", "a\n"), ("stderr", "b\n")]
    assert [o.result for o in seen if o.type == "result"] == [{"text/plain": "42"}]
    assert sb.sandbox_id == sb.id
    with pytest.raises(AttributeError):
        r.exit_code  # not a field of a code result

    async def main():
        s = await abx.AsyncSandbox.connect(sb.id)
        got = []
        r = await s.run_code("print('x')", on_output=got.append)
        return r, got, s.sandbox_id

    r, got, sid = asyncio.run(main())
    assert r.stdout == "x\n" and [o.text for o in got] == ["x\n"] and sid == sb.id
