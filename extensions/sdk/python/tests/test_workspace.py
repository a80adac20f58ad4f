"""Workspaces through the SDK against the real broker (issue 43): a host folder mounted as an
overlay, the sandbox's changes reviewed with ``diff``, brought to the host with ``apply`` (a
host change since create is a conflict), dropped with ``discard``; the command log."""

from __future__ import annotations

import os
import subprocess

import abx
from abx import _types as t


def test_mount_strings_and_mappings_become_the_brokers_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert t.p_mounts(["."]) == [{"source": str(tmp_path)}]
    assert t.p_mounts(["proj:/workspace/p:ro"]) == [
        {"source": str(tmp_path / "proj"), "target": "/workspace/p", "mode": "ro"}]
    assert t.p_mounts(["/abs:rw"]) == [{"source": "/abs", "mode": "rw"}]
    assert t.p_mounts([{"source": "/abs", "target": None}]) == [{"source": "/abs"}]
    assert t.p_mounts(None) is None


def test_overlay_diff_apply_conflict_discard_and_log(home, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("one\n")
    (proj / "b.txt").write_text("keep\n")
    (proj / "c.txt").write_text("host\n")
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    with abx.Sandbox.create(provider="local", timeout=120, mounts=[{"source": str(proj)}]) as sb:
        assert [(m["source"], m["target"], m["mode"]) for m in sb.last_info.mounts] == [
            (str(proj), "/workspace", "overlay")]
        r = sb.exec("cat a.txt && echo two >> a.txt && rm b.txt && echo new > d.txt && echo sb > c.txt")
        assert r.exit_code == 0 and r.stdout == "one\n"
        assert (proj / "a.txt").read_text() == "one\n" and (proj / "b.txt").exists()  # host untouched
        changes = {c.path: c.change for c in sb.diff()}
        assert changes == {"/workspace/a.txt": "modified", "/workspace/b.txt": "deleted",
                           "/workspace/c.txt": "modified", "/workspace/d.txt": "added"}
        (patch,) = sb.diff(["/workspace/a.txt"], patch=True)
        assert "+two" in patch.patch and patch.binary is False
        # The host changes c.txt after create: applying it is a conflict, the rest applies.
        (proj / "c.txt").write_text("host changed\n")
        res = sb.apply(["/workspace/a.txt", "/workspace/c.txt", "/workspace/d.txt"])
        assert sorted(res.applied) == ["/workspace/a.txt", "/workspace/d.txt"]
        assert [c["path"] for c in res.conflicts] == ["/workspace/c.txt"]
        assert (proj / "a.txt").read_text() == "one\ntwo\n" and (proj / "d.txt").read_text() == "new\n"
        assert (proj / "c.txt").read_text() == "host changed\n"
        assert os.stat(proj / "d.txt").st_uid == os.stat(proj).st_uid
        assert {c.path for c in sb.diff()} == {"/workspace/b.txt", "/workspace/c.txt"}
        assert sb.discard(["/workspace/b.txt"]) == ["/workspace/b.txt"]
        assert {c.path for c in sb.diff()} == {"/workspace/c.txt"}
        forced = sb.apply(force=True)
        assert forced.applied == ["/workspace/c.txt"] and (proj / "c.txt").read_text() == "sb\n"
        assert sb.diff() == []
        log = sb.log()
        assert log.entries[-1]["argv"][-1].startswith("cat a.txt") and log.last >= 1
        assert log.entries[-1]["exitCode"] == 0
        assert sb.log(since=log.last).entries == []


def test_network_policy_create_and_set_network(home):
    with abx.Sandbox.create(provider="local", timeout=120, network={"allow": ["pypi.example"]}) as sb:
        net = sb.last_info.network
        assert net["allow"] == ["pypi.example"] and net["blocked"] == []
        r = sb.exec("echo $HTTPS_PROXY")
        assert r.stdout.startswith("http://127.0.0.1:")
        info = sb.set_network({"allow": ["pypi.example", "*.files.example"], "deny": ["bad.files.example"]})
        assert info.network["allow"] == ["pypi.example", "*.files.example"]
        assert sb.info().network["deny"] == ["bad.files.example"]
        try:
            sb.set_network({"allow": ["127.0.0.1"]})
        except abx.AbxError as e:
            assert e.code == "E1004" and "127.0.0.1" in str(e)
        else:
            raise AssertionError("a loopback entry was accepted")
