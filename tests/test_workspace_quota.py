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


def _tool(tmp_path: Path, sandbox: SandboxSettings, script: str) -> object:
    directory = write_skill(tmp_path, "filler", scripts={"fill.sh": script})
    ceiling = Capabilities.ceiling(sandbox, skill="filler", skills=SkillsSettings())
    return AgentSkill(directory).script_tools(ceiling, sandbox=sandbox)[0]


@needs_bwrap
def test_a_script_filling_its_workspace_is_stopped_at_the_byte_quota(tmp_path: Path) -> None:
    sandbox = SandboxSettings(workspace_max_bytes=2_000_000)
    workspace = Workspace(tmp_path / "ws")
    tool = _tool(tmp_path, sandbox, "#!/bin/sh\nwhile true; do head -c 100000 /dev/zero >> big.bin; sleep 0.01; done\n")
    text = tool.in_workspace(workspace.path).call({})
    assert text.startswith("Error") and "[the script was stopped: the working directory holds over" in text, text
    assert "sandbox.workspace_max_bytes" in text
    size = (workspace.path / "big.bin").stat().st_size
    assert 2_000_000 < size < 50_000_000  # stopped soon after the quota, long before its 30 s timeout


@needs_bwrap
def test_the_file_quota_and_a_script_within_both(tmp_path: Path) -> None:
    sandbox = SandboxSettings(workspace_max_files=50)
    workspace = Workspace(tmp_path / "ws")
    many = _tool(tmp_path, sandbox, "#!/bin/sh\ni=0; while true; do i=$((i+1)); : > f$i; done\n")
    text = many.in_workspace(workspace.path).call({})
    assert "[the script was stopped:" in text and "quota is 1073741824 bytes and 50 files" in text, text
    small = _tool(tmp_path / "b", sandbox, "#!/bin/sh\necho fine > out.txt; echo done\n")
    fresh = Workspace(tmp_path / "ws2")
    assert small.in_workspace(fresh.path).call({}).startswith("done")


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
