"""A conversation's workspace has a quota (bytes and files) and a TTL (sandbox/quota.py): a
skill script that writes past the quota is stopped with a tool result that says so -- under
real bwrap -- and workspaces untouched past the TTL are removed when another is opened."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from robot_lab.settings import SandboxSettings, SkillsSettings
from robot_lab.skills import AgentSkill, Capabilities
from robot_lab.sandbox import quota
from robot_lab.sandbox.workspace import Workspace
from robot_lab.sandbox.workspace_tools import workspace_tools
from tests.test_skills import write_skill
from tests.test_skills_sandbox import bwrap, needs_bwrap  # noqa: F401


def _run(tmp_path: Path, sandbox: SandboxSettings, script: str, name: str = "ws") -> tuple[str, Path]:
    """The tool result of ``script`` run as a skill script in a fresh workspace, and the workspace."""
    directory = write_skill(tmp_path / name, "filler", scripts={"fill.sh": script})
    ceiling = Capabilities.ceiling(sandbox, skill="filler", skills=SkillsSettings())
    workspace = Workspace(tmp_path / f"{name}-workspace")
    tool = AgentSkill(directory).script_tools(ceiling, sandbox=sandbox)[0]
    return tool.in_workspace(workspace.path).call({}), workspace.path


@needs_bwrap
def test_a_script_filling_its_workspace_is_stopped_at_the_byte_quota(tmp_path: Path) -> None:
    text, workspace = _run(tmp_path, SandboxSettings(workspace_max_bytes=2_000_000),
                           "#!/bin/sh\nwhile true; do head -c 100000 /dev/zero >> big.bin; sleep 0.01; done\n")
    assert text.startswith("Error") and "[the script was stopped: the working directory holds over" in text, text
    assert "sandbox.workspace_max_bytes" in text and "timed out" not in text  # stopped, not run to its timeout
    assert "[removed to bring the working directory back under its quota: big.bin (" in text, text
    assert not (workspace / "big.bin").exists()  # the call's file is gone: the workspace is back under the quota


@needs_bwrap
def test_the_file_quota_and_a_script_within_both(tmp_path: Path) -> None:
    sandbox = SandboxSettings(workspace_max_files=50)
    text, workspace = _run(tmp_path, sandbox, "#!/bin/sh\ni=0; while true; do i=$((i+1)); : > f$i; done\n")
    assert "[the script was stopped:" in text and "quota is 1073741824 bytes and 50 files" in text, text
    assert "[removed to bring the working directory back under its quota: f" in text, text
    assert len(os.listdir(workspace)) == 50  # back within the quota, at its edge
    assert "timed out" not in text
    text, _ = _run(tmp_path, sandbox, "#!/bin/sh\necho fine > out.txt; echo done\n", name="small")
    assert text.startswith("done"), text


def test_old_workspaces_are_removed_when_another_is_opened(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_SKILLS__WORKSPACE_ROOT", str(tmp_path / "root"))
    monkeypatch.setattr(quota, "_last_sweep", {})
    sandbox = SandboxSettings(workspace_ttl=3600)
    old = Workspace.for_scope("conversation-old", sandbox=sandbox)
    recent = Workspace.for_scope("conversation-recent", sandbox=sandbox)
    (old.path / "notes.txt").write_text("x")
    past = time.time() - 7200
    os.utime(old.path, (past, past))
    monkeypatch.setattr(quota, "_last_sweep", {})
    Workspace.for_scope("conversation-new", sandbox=sandbox)
    assert not old.path.exists() and recent.path.exists()


def _allocated(folder: Path) -> int:
    """The disk ``folder`` takes: allocated blocks, as du counts them."""
    return sum(os.lstat(os.path.join(root, n)).st_blocks * 512 for root, _, names in os.walk(folder) for n in names)


@needs_bwrap
@pytest.mark.parametrize("how", ["fallocate -l 3G big.bin", ": > big.bin; fallocate -n -l 3G big.bin",
                                 "for i in $(seq 60); do fallocate -l 50M f$i.bin; done"])
def test_an_allocation_past_the_quota_is_stopped_and_removed(tmp_path: Path, how: str) -> None:
    """One fallocate takes gigabytes of disk at once, between two polls (``-n``: blocks past
    the end of an empty file; the loop: many files each under the quota)."""
    if shutil.which("fallocate") is None:
        pytest.fail("fallocate (util-linux) is not installed")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "kept.txt").write_text("from an earlier call\n")
    (workspace / "log.txt").write_text("line 1\n")
    tools = {t.name: t for t in workspace_tools(workspace, sandbox=SandboxSettings(workspace_max_bytes=50_000_000))}
    text = tools["run_command"].call({"command": f"echo more >> log.txt; {how}; echo allocated"})
    if "fallocate: fallocate failed: Operation not supported" in text:
        pytest.skip(f"the file system under {tmp_path} does not support fallocate")
    assert "[the script was stopped: the working directory holds over" in text, text
    assert "[removed to bring the working directory back under its quota:" in text and ".bin (" in text, text
    assert _allocated(workspace) <= 50_000_000
    assert (workspace / "kept.txt").read_text() == "from an earlier call\n"  # files of earlier calls stay
    assert (workspace / "log.txt").read_text().startswith("line 1\n")
    assert tools["run_command"].call({"command": "echo next > next.txt && cat next.txt"}).startswith("next")


@needs_bwrap
def test_tmp_is_bounded(tmp_path: Path) -> None:
    sandbox = SandboxSettings(tmp_max_bytes=20 * 1024 * 1024)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    run = {t.name: t for t in workspace_tools(workspace, sandbox=sandbox)}["run_command"]
    text = run.call({"command": "head -c 100000000 /dev/zero > /tmp/big; echo size=$(stat -c %s /tmp/big)"})
    assert "No space left on device" in text, text
    assert int(text.split("size=", 1)[1].split()[0]) <= 20 * 1024 * 1024, text
    assert "sandbox.tmp_max_bytes" in text, text
    assert run.call({"command": "head -c 1000000 /dev/zero > /tmp/small && echo fits"}) == "fits"


def test_a_workspace_over_its_quota_before_a_call_may_shrink_not_grow(tmp_path: Path) -> None:
    """A quota lowered by the operator leaves a workspace over it: a call may delete files
    (the model can bring it back), but not make it hold more."""
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "old.bin").write_bytes(b"x" * 300_000)
    over = quota.Quota.of(str(folder), SandboxSettings(workspace_max_bytes=100_000))
    assert over is not None and over.over() is None  # as it was at the start
    (folder / "old.bin").unlink()
    assert over.over() is None
    (folder / "new.bin").write_bytes(b"x" * 400_000)
    assert over.over() is not None and "quota is 100000 bytes" in str(over.over())
    assert [t.split(" (")[0] for t in over.trim()] == ["new.bin"] and not (folder / "new.bin").exists()
