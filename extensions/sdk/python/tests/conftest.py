"""A private broker for the session: a temp ABX_HOME, the real debug binaries (ABX_BIN,
default target/debug/abx, the daemon beside it), the py-local fixture plugin installed
from a local directory. The daemon is stopped at the end with ``abx broker stop``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
ABX = Path(os.environ.get("ABX_BIN") or ROOT / "target" / "debug" / "abx").resolve()
FIXTURE = ROOT / "tests" / "fixtures" / "plugins" / "py-local"


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``cond`` until true; fail with ``what`` after ``timeout`` s (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="session", autouse=True)
def home():
    assert ABX.exists(), f"{ABX} is missing: build it first (cargo build --workspace --bins) or set ABX_BIN"
    d = tempfile.mkdtemp(prefix="abx-sdk-")
    old = {k: os.environ.get(k) for k in ("ABX_HOME", "ABX_BIN", "ABX_HOST", "ABX_PROVIDER")}
    os.environ["ABX_HOME"] = d
    os.environ["ABX_BIN"] = str(ABX)
    os.environ.pop("ABX_HOST", None)
    os.environ.pop("ABX_PROVIDER", None)
    yield d
    subprocess.run([str(ABX), "broker", "stop"], capture_output=True, timeout=60)
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def py_local(home):
    """The py-local fixture plugin, installed from a copy (trust: local)."""
    import abx

    src = Path(home) / "py-local-src"
    shutil.copytree(FIXTURE, src)
    r = abx.providers.install(str(src), yes=True)
    assert r.id == "py-local", r
    return "py-local"


@pytest.fixture
def sb(home):
    import abx

    s = abx.Sandbox.create(provider="local")
    yield s
    s.kill()
