"""A conversation's workspace has a quota (bytes and files) and a TTL (skills/quota.py): a
skill script that writes past the quota is stopped with a tool result that says so -- under
real bwrap -- and workspaces untouched past the TTL are removed when another is opened."""

from __future__ import annotations

import os
import time
from pathlib import Path

from robot_lab.settings import SandboxSettings, SkillsSettings
from robot_lab.skills import AgentSkill, Capabilities
from robot_lab.skills import quota
from robot_lab.skills.workspace import Workspace
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
    assert (workspace / "big.bin").stat().st_size > 2_000_000


@needs_bwrap
def test_the_file_quota_and_a_script_within_both(tmp_path: Path) -> None:
    sandbox = SandboxSettings(workspace_max_files=50)
    text, _ = _run(tmp_path, sandbox, "#!/bin/sh\ni=0; while true; do i=$((i+1)); : > f$i; done\n")
    assert "[the script was stopped:" in text and "quota is 1073741824 bytes and 50 files" in text, text
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
