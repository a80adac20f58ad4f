"""``host=`` parsing, the ssh command line and the classification of ssh failures (no ssh
run here; test_ssh.py runs the real thing)."""

from __future__ import annotations

import pytest

import abx
from abx._transport import parse_host, socket_path


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
    monkeypatch.setenv("ABX_HOME", str(tmp_path))
    assert socket_path() == str(tmp_path / "run" / "broker.sock")
    monkeypatch.delenv("ABX_HOME")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert socket_path() == str(tmp_path / "abx" / "broker.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("TMPDIR", "/var/tmpx")
    import os

    assert socket_path() == f"/var/tmpx/abx-{os.geteuid()}/broker.sock"
