"""One daemon per data dir, found from every context (issue 41), against the real binaries: a
temp HOME (no ABX_HOME), a shell context (HOME and XDG_RUNTIME_DIR, the real ``abx`` of ABX_BIN)
and an SDK context like an MCP host's (only HOME, PATH, SHELL and TERM), in both directions.
The SDK runs in a child Python with exactly that environment. Every daemon started here is
stopped at the end (``abx broker stop`` in its context) and the temp-dir fallback runtime dirs
it made (``/tmp/abx-<uid>/<key>``) are removed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import abx
from conftest import ABX

UID = os.geteuid()
SDK_PARENT = str(Path(abx.__file__).resolve().parent.parent)

# What the SDK sees and does in its context: where it tries first, what it resolves, and the
# `broker/status` of the daemon it connects to (start=False unless told: it must find it).
SDK_PROBE = r"""
import json, sys
import abx
from abx import _transport as T
out = {"first": T.socket_path(), "dataDir": T.broker_paths().data_dir, "resolved": T.resolve_socket()}
try:
    c = abx.Connection(start=sys.argv[1] == "start")
except abx.AbxError as e:
    out["error"] = e.code
else:
    st = c.call("broker/status")
    out["status"] = {k: st[k] for k in ("pid", "dataDir", "socket")}
    c.close()
print(json.dumps(out))
"""


def sha256sum_key(path: str) -> str:
    """The fallback key as the shell computes it: ``printf %s PATH | sha256sum | cut -c1-16``."""
    return subprocess.run(["sh", "-c", 'printf %s "$1" | sha256sum | cut -c1-16', "sh", path],
                          capture_output=True, text=True, check=True).stdout.strip()


def fallback_dir(data_dir: str) -> str:
    """The temp-dir runtime dir of a data dir, for a context without TMPDIR."""
    return f"/tmp/abx-{UID}/{sha256sum_key(data_dir)}"


class Context:
    """A process environment: a HOME, with or without XDG_RUNTIME_DIR, nothing else of ours."""

    def __init__(self, home: str, xdg: Optional[str] = None) -> None:
        self.home = home
        self.data_dir = os.path.join(home, ".local/share/abx")
        self.env: Dict[str, str] = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    "SHELL": "/bin/sh", "TERM": "dumb"}
        if xdg is not None:
            self.env["XDG_RUNTIME_DIR"] = xdg

    def abx(self, *args: str) -> Dict:
        p = subprocess.run([str(ABX), "-j", *args], env=self.env, capture_output=True, text=True, timeout=120,
                           cwd=self.home)
        assert p.returncode == 0, f"abx {' '.join(args)}: {p.stdout} {p.stderr}"
        return json.loads(p.stdout)

    def sdk(self, start: bool = False) -> Dict:
        env = dict(self.env, PYTHONPATH=SDK_PARENT, PYTHONDONTWRITEBYTECODE="1")
        if start:
            env["ABX_BIN"] = str(ABX)
        p = subprocess.run([sys.executable, "-c", SDK_PROBE, "start" if start else "no"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=self.home)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)


class Homes:
    """Temp HOMEs and the contexts made on them; ``cleanup`` stops their daemons."""

    def __init__(self) -> None:
        self.dirs: List[str] = []
        self.contexts: List[Context] = []

    def home(self) -> str:
        d = tempfile.mkdtemp(prefix="abx-home-")
        self.dirs.append(d)
        return d

    def xdg(self, home: str) -> str:
        d = os.path.join(home, "xdg")
        os.mkdir(d, 0o700)
        return d

    def context(self, home: str, xdg: Optional[str] = None) -> Context:
        c = Context(home, xdg)
        self.contexts.append(c)
        return c

    def cleanup(self) -> None:
        for c in self.contexts:
            subprocess.run([str(ABX), "broker", "stop"], env=c.env, capture_output=True, timeout=60, cwd=c.home)
        for d in self.dirs:
            shutil.rmtree(fallback_dir(os.path.join(d, ".local/share/abx")), ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def homes():
    h = Homes()
    try:
        yield h
    finally:
        h.cleanup()


def test_the_sdk_without_xdg_reaches_the_daemon_a_shell_with_xdg_started(homes):
    home = homes.home()
    shell = homes.context(home, homes.xdg(home))
    started = shell.abx("broker", "start")
    st = shell.abx("broker", "status")
    assert st["pid"] == started["pid"]
    assert st["dataDir"] == shell.data_dir
    assert st["socket"] == os.path.join(home, "xdg", "abx", "broker.sock")

    mcp = homes.context(home)
    got = mcp.sdk()
    # It tries its own runtime dir first (nothing there), then the data dir's record.
    assert got["first"] == os.path.join(fallback_dir(shell.data_dir), "broker.sock")
    assert got["dataDir"] == shell.data_dir
    assert got["resolved"] == st["socket"]
    assert got["status"] == {"pid": st["pid"], "dataDir": shell.data_dir, "socket": st["socket"]}
    # Allowed to start one, it still reaches the shell's (no second daemon on the same data).
    assert mcp.sdk(start=True)["status"]["pid"] == st["pid"]
    assert shell.abx("broker", "status")["pid"] == st["pid"]


def test_the_sdk_with_xdg_reaches_the_daemon_started_without_it(homes):
    home = homes.home()
    bare = homes.context(home)
    started = bare.abx("broker", "start")
    st = bare.abx("broker", "status")
    assert st["pid"] == started["pid"]
    assert st["dataDir"] == bare.data_dir
    # The daemon's fallback runtime dir is keyed as sha256sum keys the data dir.
    assert st["socket"] == os.path.join(fallback_dir(bare.data_dir), "broker.sock")

    shell = homes.context(home, homes.xdg(home))
    got = shell.sdk()
    assert got["first"] == os.path.join(home, "xdg", "abx", "broker.sock")
    assert got["resolved"] == st["socket"]
    assert got["status"] == {"pid": st["pid"], "dataDir": bare.data_dir, "socket": st["socket"]}
    assert shell.sdk(start=True)["status"]["pid"] == st["pid"]


def test_a_runtime_socket_of_another_data_dir_is_not_used(homes):
    # Two HOMEs share one XDG_RUNTIME_DIR: its socket belongs to the first HOME's daemon.
    home1, home2 = homes.home(), homes.home()
    xdg = homes.xdg(home1)
    first = homes.context(home1, xdg)
    first_pid = first.abx("broker", "start")["pid"]
    other = homes.context(home2, xdg)
    got = other.sdk()
    assert got["first"] == os.path.join(xdg, "abx", "broker.sock")
    assert got["resolved"] is None
    assert got["error"] == "E1007"

    # Its own daemon (started without XDG_RUNTIME_DIR) is found through its data dir instead.
    second = homes.context(home2)
    second_pid = second.abx("broker", "start")["pid"]
    assert second_pid != first_pid
    got = other.sdk()
    assert got["status"]["pid"] == second_pid
    assert got["status"]["dataDir"] == second.data_dir
    assert got["resolved"] == os.path.join(fallback_dir(second.data_dir), "broker.sock")


def test_a_data_dir_record_naming_another_daemons_socket_is_not_used(homes):
    # A record in our data dir that names a live socket whose daemon serves another data dir.
    home1, home2 = homes.home(), homes.home()
    owner = homes.context(home1, homes.xdg(home1))
    st = owner.abx("broker", "start")
    sock = owner.abx("broker", "status")["socket"]
    forged = homes.context(home2)
    os.makedirs(forged.data_dir, 0o700)
    Path(forged.data_dir, "broker.lock").write_text(f"{st['pid']}\n{st['version']}\n{sock}\n{forged.data_dir}\n")
    got = forged.sdk()
    assert got["resolved"] is None
    assert got["error"] == "E1007"
