"""The sync API against the real broker: every call, bytes exact, streaming order, errors
per E-code, cancellation, two clients at once; on ``local`` and the py-local plugin."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading

import pytest

import abx
from conftest import wait_until

BINARY = "printf 'a\\000b\\377\\376z'"  # NUL and bytes that are not UTF-8
BINARY_BYTES = b"a\x00b\xff\xfez"


def test_create_info_refresh_connect_list_kill(home):
    sb = abx.Sandbox.create(provider="local", timeout=120, env={"GREETING": "hi"}, metadata={"k": "v"},
                            network="none", limits={"pids": 64})
    assert sb.status == "running" and sb.provider == "local" and sb.id.startswith("sb-")
    info = sb.info()
    assert info.id == sb.id and info.timeout == 120 and info.metadata == {"k": "v"}
    assert info.expires_at and info["expiresAt"] == info.expires_at
    assert sb.refresh() is sb
    assert sb.exec("echo $GREETING").stdout == "hi\n"
    again = abx.Sandbox.connect(sb.id)
    assert again.id == sb.id and again.last_info.expires_at == info.expires_at  # connect keeps the lifetime
    assert abx.Sandbox.connect(f"local:{sb.id}").id == sb.id
    listed = abx.Sandbox.list()
    assert sb.id in [s.id for s in listed] and listed.errors == []
    assert sb.id in [s.id for s in abx.Sandbox.list(provider="local")]
    assert sb.kill() is True
    assert sb.kill() is False  # idempotent
    assert sb.id not in [s.id for s in abx.Sandbox.list()]


def test_exec_result_text_and_exit_code(sb):
    r = sb.exec("echo out; echo err >&2; exit 4")
    assert (r.exit_code, r.stdout, r.stderr) == (4, "out\n", "err\n")
    code, out, err = r
    assert code == 4 and not r.ok and not r.timed_out and r.duration_ms is not None
    assert sb.exec(["printf", "%s|", "a b", "c"]).stdout == "a b|c|"  # argv, no shell


def test_exec_bytes_exact(sb):
    r = sb.exec(f"{BINARY}; {BINARY} >&2")
    assert r.stdout_bytes == BINARY_BYTES and r.stderr_bytes == BINARY_BYTES
    assert r.stdout == BINARY_BYTES.decode("utf-8", "replace")
    # stdin as bytes goes through exact too
    r = sb.exec("od -An -tx1 | tr -d ' \\n'", stdin=BINARY_BYTES)
    assert r.stdout == BINARY_BYTES.hex()
    assert sb.exec("cat", stdin="héllo").stdout == "héllo"


def test_exec_env_cwd_timeout(sb):
    sb.files.mkdir("sub")
    r = sb.exec("pwd; echo $A", env={"A": "1"}, cwd="/workspace/sub")
    assert r.stdout == "/workspace/sub\n1\n"
    r = sb.exec("sleep 5", timeout=0.5)
    assert r.timed_out


def test_exec_stream_order_and_one_exit_last(sb):
    s = sb.exec_stream("for i in 1 2 3 4 5; do echo o$i; echo e$i >&2; done; " + BINARY + "; exit 7")
    events = list(s)
    exits = [e for e in events if isinstance(e, abx.ExecExit)]
    assert len(exits) == 1 and events[-1] is exits[0] and exits[0].exit_code == 7
    out = b"".join(e.data for e in events if isinstance(e, abx.ExecOutput) and e.stream == "stdout")
    err = b"".join(e.data for e in events if isinstance(e, abx.ExecOutput) and e.stream == "stderr")
    assert out == b"o1\no2\no3\no4\no5\n" + BINARY_BYTES
    assert err == b"e1\ne2\ne3\ne4\ne5\n"
    assert s.next() is None and list(s) == []  # nothing after the exit


def test_exec_stream_write_kill_pty(sb):
    s = sb.exec_stream("cat")
    s.write(b"ab\x00\xff")
    s.write("cd", eof=True)
    got = b"".join(e.data for e in s if isinstance(e, abx.ExecOutput))
    assert got == b"ab\x00\xffcd" and s.exit.exit_code == 0
    s = sb.exec_stream("sleep 60")
    s.kill("TERM")
    ex = s.wait(timeout=30)
    assert ex is not None and ex.signal == "SIGTERM"
    p = sb.exec_stream("tty; stty size", pty=(100, 30))
    text = b"".join(e.data for e in p if isinstance(e, abx.ExecOutput)).decode()
    assert "/dev/pts/" in text and "30 100" in text and p.exit.exit_code == 0
    p = sb.exec_stream("read x; stty size", pty=True)
    p.resize(120, 40)
    p.write("go\n")
    text = b"".join(e.data for e in p if isinstance(e, abx.ExecOutput)).decode()
    assert "40 120" in text


def test_files(sb, tmp_path):
    assert sb.files.write("t.txt", "héllo\n") == 7
    assert sb.files.read("t.txt") == "héllo\n"
    blob = os.urandom(300_000) + b"\x00\xff"
    sb.files.mkdir("d")
    sb.files.write("d/b.bin", blob)
    assert sb.files.read_bytes("d/b.bin") == blob and sb.files.read("d/b.bin", binary=True) == blob
    assert sb.files.write("t.txt", "more", append=True) == 11
    assert sb.files.exists("t.txt") and not sb.files.exists("nope")
    st = sb.files.stat("t.txt")
    assert (st.name, st.type, st.size, st.path) == ("t.txt", "file", 11, "/workspace/t.txt") and st.modified_at
    assert sorted(e.name for e in sb.files.list()) == ["d", "t.txt"]
    assert "/workspace/d/b.bin" in [e.path for e in sb.files.list(recursive=True)]
    sb.files.rename("t.txt", "u.txt")
    assert not sb.files.exists("t.txt") and sb.files.read("u.txt") == "héllo\nmore"
    sb.files.mkdir("x/y/z", parents=True)
    with pytest.raises(abx.DirectoryNotEmptyError):
        sb.files.remove("x")
    sb.files.remove("x", recursive=True)
    assert not sb.files.exists("x")
    sb.files.write("m.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sb.exec("./m.sh").stdout == "ran\n"
    # bigger than one chunk both ways (chunked reads and writes)
    big = os.urandom(9 * 1024 * 1024 + 5)
    sb.files.write("big.bin", big)
    assert hashlib.sha256(sb.files.read_bytes("big.bin")).digest() == hashlib.sha256(big).digest()
    # upload / download through the broker, with progress
    src = tmp_path / "up.bin"
    src.write_bytes(blob)
    seen = []
    assert sb.files.upload(str(src), "up.bin", on_progress=lambda b, total: seen.append((b, total))) == len(blob)
    assert sb.files.read_bytes("up.bin") == blob and seen and seen[-1][0] == len(blob)
    dst = tmp_path / "down.bin"
    assert sb.files.download("up.bin", str(dst)) == len(blob) and dst.read_bytes() == blob


def test_files_watch(sb):
    with sb.files.watch("/workspace", recursive=True) as w:
        sb.files.write("w.txt", "1")
        seen = set()
        wait_until("a change of w.txt", lambda: (lambda c: c is not None and seen.add(c.path) is None)(w.next(0.2))
                   and "/workspace/w.txt" in seen)
        assert w.watch_id
    assert w.closed and w.next() is None


def test_processes_ports_timeout_pause_resume(sb):
    s = sb.exec_stream("sleep 60")
    procs = sb.processes.list()
    victim = [p for p in procs if "sleep 60" in (p.command or "")]
    assert victim, procs
    sb.processes.kill(victim[0].pid)
    assert s.wait(timeout=30) is not None
    with pytest.raises(abx.ProcessNotFoundError) as e:
        sb.processes.kill(999_999)
    assert e.value.code == "E3006"
    # The same number on the host when it is free there (a port just found free: a fixed
    # one like 8080 may be taken on the machine, and then the broker picks another).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    u = sb.ports.url(port)
    assert u.url == f"http://127.0.0.1:{port}" and u.headers == {}
    before = sb.last_info.expires_at
    info = sb.set_timeout(3600)
    assert info.expires_at != before and sb.last_info.timeout == 3600
    assert sb.pause().status == "paused" and sb.info().status == "paused"
    assert sb.resume().status == "running"
    assert sb.exec("echo alive").stdout == "alive\n"
    assert "exec" in str(sb.capabilities().to_dict()) and sb.system_info().os


def test_run_code_keeps_state_in_its_context_on_local(sb):
    # local declares code.interpret: the default context keeps its variables between cells;
    # an error is part of the result; a context that does not exist is E1004 (the E8004 case
    # is the py-local plugin's, in test_py_local_plugin).
    r = sb.run_code("x = 41\nprint('hi')\nx + 1", language="python")
    assert r.stdout == "hi\n" and r.error is None
    assert r.results[0]["text/plain"] == "42"
    r = sb.run_code("x * 2", env={"A": "1"}, timeout=30)
    assert r.results[0]["text/plain"] == "82"
    r = sb.run_code("1/0")
    assert r.error["name"] == "ZeroDivisionError" and r.error["traceback"]
    with pytest.raises(abx.InvalidParamsError):
        sb.run_code("1", context="nope")


def test_errors_per_code(sb):
    cases = [
        (lambda: abx.Sandbox.connect("sb-nope"), abx.SandboxNotFoundError, "E2009", abx.SandboxError),
        (lambda: sb.files.read("nope.txt"), abx.SandboxFileNotFoundError, "E4001", abx.FilesError),
        (lambda: sb.files.read("/workspace/../../etc/passwd"), abx.PathOutsideSandboxError, "E4002", abx.FilesError),
        (lambda: abx.Sandbox.create(provider="nope"), abx.ProviderNotInstalledError, "E8001", abx.ProviderError),
        (lambda: abx.Sandbox.create(provider="local", timeout=0), abx.InvalidTimeoutError, "E2004",
         abx.SandboxError),
        (lambda: sb.connection.call("no/such"), abx.MethodNotFoundError, "E1003", abx.WireError),
        (lambda: sb.connection.call("exec/write", {"execId": "e-nope", "data": ""}), abx.ExecNotFoundError,
         "E3002", abx.ExecError),
    ]
    for f, cls, code, family in cases:
        with pytest.raises(cls) as e:
            f()
        err = e.value
        assert isinstance(err, family) and isinstance(err, abx.AbxError)
        assert err.code == code and err.number == int(code[1:]) and err.message and err.suggestion
        assert str(err).startswith(f"[{code}] ") and "Suggestion: " in str(err)
    assert abx.errors.error_class("E2999") is abx.SandboxError  # unknown codes get their family
    assert abx.errors.error_class("E5001") is abx.PortsError


def _sleepers(sb):
    return [p for p in sb.processes.list() if "sleep 77" in (p.command or "")]


def test_timeout_cancels_at_the_broker(sb):
    with pytest.raises(abx.RequestTimeoutError) as e:
        sb.connection.call("exec/run", {"sandbox": sb._route, "command": "sleep 77"}, timeout=0.5)
    assert e.value.code == "E1006"
    wait_until("the cancelled exec/run to be killed", lambda: not _sleepers(sb))
    assert sb.exec("echo next").stdout == "next\n"  # the connection is fine


def test_connection_request_timeout_cancels_every_call(sb):
    with abx.Connection(request_timeout=0.5) as c:
        s = abx.Sandbox.connect(sb.id, connection=c)
        with pytest.raises(abx.RequestTimeoutError):
            s.exec("sleep 77")
        wait_until("the timed-out exec to be killed", lambda: not _sleepers(sb))
        assert s.exec("echo fast").stdout == "fast\n"


def test_keyboard_interrupt_cancels_at_the_broker(sb):
    # interrupt the main thread once the command runs (as Ctrl-C would)
    def interrupt():
        wait_until("sleep 77 to run", lambda: bool(_sleepers(abx.Sandbox.connect(sb.id, connection=other))))
        signal.pthread_kill(main, signal.SIGINT)  # what Ctrl-C does to a blocked read

    main = threading.main_thread().ident
    other = abx.Connection()
    t = threading.Thread(target=interrupt)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        sb.exec("sleep 77")
    t.join()
    wait_until("the interrupted exec/run to be killed", lambda: not _sleepers(sb))
    assert sb.exec("echo next").stdout == "next\n"
    other.close()


def test_two_clients_at_once(sb):
    a, b = abx.Connection(), abx.Connection()
    sa = abx.Sandbox.connect(sb.id, connection=a)
    sbb = abx.Sandbox.connect(sb.id, connection=b)
    results = {}

    def run(name, s):
        st = s.exec_stream(f"for i in $(seq 1 200); do echo {name}$i; done")
        results[name] = b"".join(e.data for e in st if isinstance(e, abx.ExecOutput))
        results[name + "-run"] = s.exec(f"echo {name}").stdout

    ts = [threading.Thread(target=run, args=(n, s)) for n, s in (("a", sa), ("b", sbb))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for n in ("a", "b"):
        assert results[n] == "".join(f"{n}{i}\n" for i in range(1, 201)).encode()
        assert results[n + "-run"] == f"{n}\n"
    # one connection shared by threads: replies reach their own caller
    out = {}

    def many(i):
        out[i] = sa.exec(f"echo {i}").stdout

    ts = [threading.Thread(target=many, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {i: f"{i}\n" for i in range(8)}
    a.close()
    b.close()
    with pytest.raises(abx.BrokerUnreachableError):
        sa.exec("true")


def test_py_local_plugin(py_local):
    sb = abx.Sandbox.create(provider=py_local)
    try:
        assert sb.provider == "py-local"
        r = sb.exec(f"{BINARY}; echo e >&2; exit 2")
        assert (r.exit_code, r.stdout_bytes, r.stderr) == (2, BINARY_BYTES, "e\n")
        events = list(sb.exec_stream("echo a; echo b >&2; echo c"))
        assert isinstance(events[-1], abx.ExecExit) and sum(isinstance(e, abx.ExecExit) for e in events) == 1
        assert b"".join(e.data for e in events if isinstance(e, abx.ExecOutput) and e.stream == "stdout") == b"a\nc\n"
        sb.files.write("f.bin", BINARY_BYTES)
        assert sb.files.read_bytes("f.bin") == BINARY_BYTES and sb.files.exists("f.bin")
        assert sb.id in [s.id for s in abx.Sandbox.list(provider=py_local)]
        with pytest.raises(abx.FeatureNotSupportedError) as e:
            sb.run_code("1")
        assert "code.interpret" in e.value.message
        with pytest.raises(abx.FeatureNotSupportedError):
            sb.files.watch("/workspace")
        assert isinstance(sb.processes.list(), list)
    finally:
        assert sb.kill()


def test_providers(py_local, tmp_path):
    ps = {p.id: p for p in abx.providers.list()}
    assert ps["local"].kind == "builtin" and ps["local"].default and "py-local" in ps
    assert ps["py-local"].trust == "local"
    info = abx.providers.info("py-local")
    assert info.id == "py-local" and info.runtime == ["python3", "./provider.py"]
    d = abx.providers.doctor("py-local")
    assert d.ok and {c["name"] for c in d.checks} >= {"integrity", "handshake"}
    seen = []
    r = abx.providers.test("py-local", filter="lifecycle", on_result=seen.append)
    assert r.failed == 0 and r.passed >= 1 and len(seen) == len(r.results)
    # confirmation rules: a plan shown to confirm=, declined -> nothing installed (E1009)
    src = tmp_path / "again"
    import shutil
    from conftest import FIXTURE

    shutil.copytree(FIXTURE, src)
    plans = []
    with pytest.raises(abx.UsageError):
        abx.providers.install(str(src), confirm=lambda p: plans.append(p) or False)
    assert plans and plans[0].id == "py-local" and plans[0].digest
    plan = abx.providers.install(str(src), dry_run=True)
    assert plan.id == "py-local"
    with pytest.raises(abx.AlreadyInstalledError):
        abx.providers.install(str(src), yes=True)
    with pytest.raises(abx.ProviderNotInstalledError):
        abx.providers.info("nope")


def test_install_needs_confirmation(home, tmp_path):
    import shutil
    from conftest import FIXTURE

    src = tmp_path / "p"
    shutil.copytree(FIXTURE, src)
    manifest = src / "abx-provider.toml"
    manifest.write_text(manifest.read_text().replace('id = "py-local"', 'id = "py-local-two"'))
    with pytest.raises(abx.RefusedError) as e:
        abx.providers.install(str(src))
    assert e.value.code == "E8012" and e.value.suggestion
    assert "py-local-two" not in [p.id for p in abx.providers.list()]
