"""``robot-lab skills ...`` through click's runner (the command as users type it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from robot_lab.cli import main
from tests.test_skills import write_skill


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "skills"
    write_skill(base, "pdf-tools", "Extract text and tables from PDF files.", "PDF BODY",
                scripts={"extract.py": '"""Extract the text of a PDF."""\nprint("text")\n'})
    write_skill(base, "Odd_Name", "Review Python code style.", folder="odd-name")
    (base / "broken").mkdir()
    (base / "broken" / "SKILL.md").write_text("---\nname: broken\n---\nno description\n")
    return base


def test_lazy_registration(runner: CliRunner) -> None:
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0 and "skills" in result.output
    result = runner.invoke(main, ["skills", "--help"])
    assert result.exit_code == 0
    for sub in ("list", "show", "validate", "create", "match"):
        assert sub in result.output


def test_list_shows_skills_warnings_and_skipped(runner: CliRunner, root: Path) -> None:
    result = runner.invoke(main, ["skills", "list", "--root", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pdf-tools" in result.output and "Odd_Name" in result.output
    assert "--root" in result.output  # the root column
    assert "does not match the directory name" in result.output
    assert "skipped" in result.output and "missing 'description'" in result.output


def test_show(runner: CliRunner, root: Path) -> None:
    result = runner.invoke(main, ["skills", "show", "pdf-tools", "--root", str(root)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Extract text and tables" in result.output
    assert "tool pdf-tools__extract: Extract the text of a PDF." in result.output
    assert "PDF BODY" in result.output
    missing = runner.invoke(main, ["skills", "show", "nope", "--root", str(root)])
    assert missing.exit_code != 0 and "no skill named 'nope'" in missing.output


def test_validate_lenient_and_strict(runner: CliRunner, root: Path) -> None:
    lenient = runner.invoke(main, ["skills", "validate", str(root / "odd-name")])
    assert lenient.exit_code == 0, lenient.output
    assert "warning: name 'Odd_Name' does not match" in lenient.output
    strict = runner.invoke(main, ["skills", "validate", "--strict", str(root / "odd-name")])
    assert strict.exit_code == 1
    assert "error: name 'Odd_Name' does not match" in strict.output
    whole_root = runner.invoke(main, ["skills", "validate", str(root)])
    assert whole_root.exit_code == 1
    assert "FAIL" in whole_root.output and "missing 'description'" in whole_root.output
    assert "ok  pdf-tools" in whole_root.output
    assert runner.invoke(main, ["skills", "validate", str(root / "pdf-tools" / "SKILL.md"), "--strict"]).exit_code == 0


def test_create_makes_a_valid_bundle(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "made"
    result = runner.invoke(main, ["skills", "create", "release-notes", "--root", str(target),
                                  "--description", "Write release notes from merged pull requests."])
    assert result.exit_code == 0, result.output
    bundle = target / "release-notes"
    assert (bundle / "SKILL.md").is_file() and (bundle / "scripts" / "hello.py").is_file()
    assert runner.invoke(main, ["skills", "validate", "--strict", str(bundle)]).exit_code == 0
    again = runner.invoke(main, ["skills", "create", "release-notes", "--root", str(target)])
    assert again.exit_code != 0 and "already exists" in again.output
    bad = runner.invoke(main, ["skills", "create", "Bad_Name", "--root", str(target)])
    assert bad.exit_code != 0 and "lowercase" in bad.output


def test_create_defaults_to_the_user_root(runner: CliRunner) -> None:
    result = runner.invoke(main, ["skills", "create", "mine"])
    assert result.exit_code == 0, result.output
    assert (Path(os.environ["HOME"]) / ".prompts" / "skills" / "mine" / "SKILL.md").is_file()
    listed = runner.invoke(main, ["skills", "list"], env={"COLUMNS": "200"})
    assert "mine" in listed.output and "user" in listed.output


def test_match_scores_every_skill(runner: CliRunner, root: Path) -> None:
    result = runner.invoke(main, ["skills", "match", "extract tables from this pdf", "--root", str(root),
                                  "--embedder", "tfidf"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "embedder tfidf, floor 0.10, margin 0.05" in result.output
    rows = [line for line in result.output.splitlines() if "│" in line]  # table rows, not log lines
    lines = [line for line in rows if "pdf-tools" in line or "Odd_Name" in line]
    assert "pdf-tools" in lines[0] and "yes" in lines[0]  # sorted by score, matched
    assert "Odd_Name" in lines[1] and "yes" not in lines[1]
