"""The skills CLI and runtime papercuts: an empty message, a missing root, bundles in
dot-folders, eval's refusals and misses, read_skill_file's case, a typo in skills=[...],
``</skill>`` in a body, and spec warnings said once (by validate), not on every load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from robot_lab.cli import main
from robot_lab.errors import ConfigurationError
from robot_lab.skills import AgentSkill
from robot_lab.skills.file_tool import SkillFileTool
from robot_lab.skills.skill_tool import SkillTool
from tests.test_workspace_tools import write_skill


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "skills"
    write_skill(base, "sheets", "make excel spreadsheets with formulas")
    write_skill(base, "memo", "write word document memos")
    return base


def test_match_refuses_an_empty_message_and_a_missing_root(root: Path, tmp_path: Path) -> None:
    empty = run("skills", "match", "  ", "--root", str(root), "--embedder", "tfidf")
    assert empty.exit_code == 2 and "MESSAGE is empty" in empty.output
    missing = run("skills", "list", "--root", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_match_json_says_its_shape_and_the_cap(root: Path) -> None:
    result = run("skills", "match", "make excel spreadsheets", "--root", str(root), "--embedder", "tfidf", "--json")
    data = json.loads(result.stdout)
    assert {"embedder", "floor", "margin", "max_selected", "matched", "scores"} <= set(data)
    assert data["matched"] == ["sheets"] and data["max_selected"] == 3
    assert {"name", "score", "matched", "description"} == set(data["scores"][0])


def test_bundles_only_in_dot_folders_are_pointed_at(tmp_path: Path) -> None:
    base = tmp_path / "openai-skills"
    write_skill(base / ".curated", "gh-fix-ci", "fix failing CI")
    write_skill(base / ".curated", "linear", "manage linear issues")
    result = run("skills", "list", "--root", str(base))
    assert result.exit_code == 0
    assert (f"note: {base / '.curated'} holds 2 bundle(s) in a dot-folder, which is not scanned; add it as a root: "
            f"--root {base / '.curated'}") in result.output


def test_eval_refuses_a_set_without_unrelated_prompts_and_a_share_over_one(root: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("prompts:\n  - {text: make a spreadsheet, skill: sheets}\n")
    result = run("skills", "eval", str(prompts), "--root", str(root), "--embedder", "tfidf")
    assert result.exit_code == 1 and "no unrelated prompts (skill: null)" in result.output
    result = run("skills", "eval", str(prompts), "--root", str(root), "--max-fp", "5")
    assert result.exit_code == 2 and "is not a share between 0 and 1" in result.output


def test_eval_lists_the_configured_rules_misses(root: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("prompts:\n  - {text: make excel spreadsheets with formulas, skill: sheets}\n"
                       "  - {text: zzz qqq, skill: memo}\n  - {text: the weather today, skill: null}\n")
    result = run("skills", "eval", str(prompts), "--root", str(root), "--embedder", "tfidf")
    assert result.exit_code == 0, result.output
    configured = result.output.split("chosen rule:")[0]
    assert "configured rule:" in configured and "  missed: zzz qqq" in configured


def test_read_skill_file_ignores_case_when_one_file_matches(tmp_path: Path) -> None:
    bundle = write_skill(tmp_path, "pdf", "pdf things", files={"forms.md": "# Forms\n", "a/Notes.md": "x",
                                                               "a/notes.md": "y"})
    tool = SkillFileTool([AgentSkill(bundle)])
    assert tool.call({"skill": "pdf", "path": "FORMS.md"}) == "# Forms\n"
    assert tool.call({"skill": "pdf", "path": "a/NOTES.md"}).startswith("Error (read_skill_file): no file")  # two match


def test_a_typo_in_skills_names_the_unknown_skill(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import robot_lab
    from robot_lab.skills import reset_default_catalog

    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(root)]))
    reset_default_catalog()
    try:
        with pytest.raises(ConfigurationError, match=r"unknown skill 'sheetz': no AgentSkill of that name in the "
                                                     r"catalog \(skills: .*sheets.*\) and no template skill sheetz.md"):
            robot_lab.build(name="clerk", model="scripted/echo", skills=["sheets", "sheetz"])
    finally:
        reset_default_catalog()


def test_a_closing_skill_tag_in_a_body_does_not_end_the_wrapper(tmp_path: Path) -> None:
    bundle = tmp_path / "tricky"
    bundle.mkdir()
    (bundle / "SKILL.md").write_text("---\nname: tricky\ndescription: tricky\n---\nBefore </skill> after\n")
    text = SkillTool([AgentSkill(bundle)]).call({"skill": "tricky", "args": "x </skill> y"})
    assert text.count("</skill>") == 1 and text.endswith("</skill>")
    assert "Before <\\/skill> after" in text and "Arguments: x <\\/skill> y" in text


def test_spec_warnings_are_said_by_validate_not_on_every_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    bundle = write_skill(tmp_path, "long", "x" * 1100)
    capsys.readouterr()
    AgentSkill(bundle)
    assert "description is 1100 characters" not in capsys.readouterr().err  # loading is quiet
    result = run("skills", "validate", str(bundle))
    assert "description is 1100 characters" in result.output
