"""``host=`` parsing, the ssh command line and the classification of ssh failures (no ssh
run here; test_ssh.py runs the real thing)."""

from __future__ import annotations

import pytest

import abx
from abx._transport import _read_record, broker_paths, data_key, parse_host, socket_path


def test_parse_hosts():
    assert parse_host("") is None
    h = parse_host("ssh://me@box.example:2222")
    assert (h.user, h.host, h.port, h.target) == ("me", "box.example", 2222, "me@box.example")
    h = parse_host("ssh://[::1]:22")
    assert (h.host, h.port) == ("::1", 22)
    assert parse_host("ssh://box").user is None
    for bad in ["box", "tcp://box", "ssh://", "ssh://box:0", "ssh://box:x", "ssh://-oProxyCommand=x", "ssh://@box"]:
        with pytest.raises(abx.UsageError):
            parse_host(bad)


def test_env_host(monkeypatch):
    monkeypatch.setenv("ABX_HOST", "ssh://u@h:7")
    assert parse_host(None).port == 7
    monkeypatch.setenv("ABX_HOST", "")
    assert parse_host(None) is None


def test_ssh_argv(monkeypatch):
    monkeypatch.setenv("ABX_SSH_CONFIG", "/c/f")
    monkeypatch.setenv("ABX_REMOTE_BIN", "/opt/my abx/abx")
    argv = parse_host("ssh://u@h:2200").ssh_argv(["rpc"])
    assert argv == ["ssh", "-F", "/c/f", "-p", "2200", "-T", "-o", "BatchMode=yes", "--", "u@h",
                    "'/opt/my abx/abx'", "rpc"]


def test_classify():
    h = parse_host("ssh://u@h:1")
    assert isinstance(h.classify(255, "ssh: connect to host h port 1: Connection refused"), abx.HostUnreachableError)
    assert isinstance(h.classify(255, "u@h: Permission denied (publickey)."), abx.HostAuthError)
    assert isinstance(h.classify(255, "Host key verification failed."), abx.HostAuthError)
    assert isinstance(h.classify(127, "sh: 1: abx: not found"), abx.RemoteAbxNotFoundError)
    assert h.classify(1, "[E1007] the daemon did not start") is None


def test_socket_path_like_the_cli(monkeypatch, tmp_path):
    """broker/home/src/paths.rs: ABX_HOME, else XDG_RUNTIME_DIR/abx when it is a directory, else
    a runtime dir per data dir under the temp dir (TMPDIR as Rust's temp_dir takes it)."""
    import os

    monkeypatch.setenv("ABX_HOME", str(tmp_path))
    assert socket_path() == str(tmp_path / "run" / "broker.sock")
    assert broker_paths().data_dir == str(tmp_path / "data")
    assert broker_paths().data_lock == str(tmp_path / "data" / "broker.lock")
    monkeypatch.delenv("ABX_HOME")
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert socket_path() == str(tmp_path / "abx" / "broker.sock")
    assert broker_paths() == (str(tmp_path / "abx"), "/home/u/.local/share/abx")
    uid = os.geteuid()
    for xdg in [str(tmp_path / "missing"), ""]:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
        monkeypatch.setenv("TMPDIR", "/var/tmpx")
        # The key of the Rust unit test (broker/home/src/paths.rs): SHA-256 of the data dir.
        assert socket_path() == f"/var/tmpx/abx-{uid}/5d30585de145e544/broker.sock"
        monkeypatch.delenv("TMPDIR")
        assert socket_path() == f"/tmp/abx-{uid}/5d30585de145e544/broker.sock"
    monkeypatch.setenv("XDG_DATA_HOME", "/d")
    assert broker_paths() == (f"/tmp/abx-{uid}/{data_key('/d/abx')}", "/d/abx")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", "")
    assert broker_paths().data_dir == "/.local/share/abx"
    # Joined as Rust's PathBuf::join joins: no normalization (the key hashes these bytes).
    monkeypatch.setenv("HOME", "/home//u/")
    assert broker_paths().data_dir == "/home//u/.local/share/abx"


def test_data_key_is_sha256sum_of_the_path():
    import subprocess

    for p in ["/home/u/.local/share/abx", "/tmp/a b/.local/share/abx", "/h/\u00e9t\u00e9/abx", "rel/abx"]:
        want = subprocess.run(["sh", "-c", 'printf %s "$1" | sha256sum | cut -c1-16', "sh", p],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert len(want) == 16
        assert data_key(p) == want, p


def test_lock_records_are_read_as_the_cli_reads_them(tmp_path):
    """broker/home/src/lock.rs Record::read: complete lines only; an older daemon's pid-only or
    pid-and-version file; a record without a data dir serves any."""
    f = tmp_path / "broker.lock"
    for text, want in [
        (b"42\n1.2\n/r/abx/broker.sock\n/h/.local/share/abx\n",
         (42, "1.2", b"/r/abx/broker.sock", b"/h/.local/share/abx")),
        (b"42\n1.2\n/r/abx/bro", (42, "1.2", None, None)),
        (b"42\n1.2\n/r/abx/broker.sock\n/h/.local/sh", (42, "1.2", b"/r/abx/broker.sock", None)),
        (b"42\n", (42, None, None, None)),
        (b"42", (42, None, None, None)),
        (b" 42 \n\n/x\n/y\n", (42, None, None, None)),
        (b"", None),
        (b"x\n1\n", None),
    ]:
        f.write_bytes(text)
        r = _read_record(str(f))
        assert (r if r is None else tuple(r)) == want, text
    assert _read_record(str(tmp_path / "none")) is None
    f.write_bytes(b"1\n1\n/s\n/h//abx/\n")
    r = _read_record(str(f))
    assert r.serves("/h/abx") and not r.serves("/h/abx2")
    f.write_bytes(b"1\n1\n")
    assert _read_record(str(f)).serves("/any")
