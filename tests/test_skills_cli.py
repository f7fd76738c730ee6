"""``robot-lab skills ...`` through click's runner (the command as users type it)."""

from __future__ import annotations

import json
import os
import re
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
    for sub in ("list", "show", "validate", "create", "match", "eval"):
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
    assert "embedder tfidf, floor 0.29, margin 0.00" in result.output
    rows = [line for line in result.output.splitlines() if "│" in line]  # table rows, not log lines
    lines = [line for line in rows if "pdf-tools" in line or "Odd_Name" in line]
    assert "pdf-tools" in lines[0] and "yes" in lines[0]  # sorted by score, matched
    assert "Odd_Name" in lines[1] and "yes" not in lines[1]


# --- CLI papercuts ------------------------------------------------------------------------------------


def test_create_quotes_a_description_with_a_colon(runner: CliRunner, tmp_path: Path) -> None:
    description = "Use when: the user asks for release notes # or a changelog"
    result = runner.invoke(main, ["skills", "create", "notes", "--root", str(tmp_path), "--description", description])
    assert result.exit_code == 0, result.output
    from robot_lab.skills import AgentSkill

    assert AgentSkill(tmp_path / "notes").description == description
    assert runner.invoke(main, ["skills", "validate", "--strict", str(tmp_path / "notes")]).exit_code == 0


def test_strict_validate_ignores_data_files_libraries_and_the_size_cap(runner: CliRunner, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = write_skill(tmp_path, "bulky", "Does bulky things.", "word " * 20_000, scripts={
        "run.py": "from helpers import go\ngo()\n",
        "helpers.py": '"""Helpers."""\ndef go():\n    print("went")\n',
        "template.pdf": "%PDF-1.4\n",
        "schema.xsd": "<xs:schema/>\n",
    })
    monkeypatch.setenv("ROBOT_LAB_SKILLS__MAX_INSTRUCTIONS_CHARS", "1000")
    result = runner.invoke(main, ["skills", "validate", "--strict", str(bundle)])
    assert result.exit_code == 0, result.output
    assert "warning: instructions truncated to 1000" in result.output  # reported, not an error
    listed = runner.invoke(main, ["skills", "list", "--json", "--root", str(tmp_path)])
    entry = next(s for s in json.loads(listed.stdout)["skills"] if s["name"] == "bulky")
    assert entry["tools"] == ["bulky__run"]


def test_list_and_match_json(runner: CliRunner, root: Path) -> None:
    listed = json.loads(runner.invoke(main, ["skills", "list", "--json", "--root", str(root)]).stdout)
    assert {s["name"] for s in listed["skills"]} >= {"pdf-tools", "Odd_Name"}
    assert any(p["path"].endswith("broken") and "description" in p["error"] for p in listed["skipped"])
    matched = runner.invoke(main, ["skills", "match", "extract tables from this pdf", "--json", "--root", str(root),
                                   "--embedder", "tfidf"])
    data = json.loads(matched.stdout)
    assert data["embedder"] == "tfidf" and data["matched"] == ["pdf-tools"]
    assert data["scores"][0]["name"] == "pdf-tools" and data["scores"][0]["matched"] is True


def test_tables_do_not_wrap_names_when_piped(runner: CliRunner, tmp_path: Path) -> None:
    long_name = "a-very-long-skill-name-that-would-wrap-in-a-narrow-table-column"
    write_skill(tmp_path, long_name, "Describes a thing at some length so the table is wide.")
    result = runner.invoke(main, ["skills", "list", "--root", str(tmp_path)], env={"COLUMNS": None})
    assert long_name in result.output  # on one line, not folded
    result = runner.invoke(main, ["skills", "match", "thing", "--root", str(tmp_path), "--embedder", "tfidf"],
                           env={"COLUMNS": None})
    assert long_name in result.output


def test_eval_command_prints_the_figures(runner: CliRunner) -> None:
    from tests.skills_eval import BUNDLES, PROMPTS

    result = runner.invoke(main, ["skills", "eval", str(PROMPTS), "--root", str(BUNDLES), "--embedder", "tfidf",
                                  "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prompts"] == 72 and data["configured"]["recall"] >= 0.75
    assert 0 <= data["chosen"]["false_positive_rate"] <= 0.10


def test_chat_with_skills_and_an_attachment(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_skill(tmp_path / "skills", "lister", "List the files the user sent.", "LIST INSTRUCTIONS",
                scripts={"ls.py": "import os\nprint(sorted(os.listdir('.')))\n"})
    (tmp_path / "note.txt").write_text("hi")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(tmp_path / "skills")]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__WORKSPACE_ROOT", str(tmp_path / "ws"))
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__ENABLED", "false")
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__WHEN_UNAVAILABLE", "unconfined")
    from robot_lab.skills import reset_default_catalog, reset_default_matcher

    reset_default_catalog()
    reset_default_matcher()
    try:
        result = runner.invoke(main, ["chat", "--skills", "lister", "--attach", str(tmp_path / "note.txt"),
                                      "-m", "scripted/echo", "list the files the user sent", "--json"])
    finally:
        reset_default_catalog()
        reset_default_matcher()
    assert result.exit_code == 0, result.output
    assert re.search(r"lister__ls: \[[^]]*'note.txt'", result.output), result.output


def test_match_names_the_embedder_fallback_once_in_its_output(root: Path, tmp_path: Path) -> None:
    """An unloadable model is said in the command's own output (a caption, a JSON field),
    not as a log warning on every call (a real subprocess: stderr is what a user sees)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "ROBOT_LAB_SKILLS__EMBEDDER": "fastembed",
           "ROBOT_LAB_SKILLS__EMBEDDING_MODEL_PATH": str(tmp_path / "no-such-model"), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "robot_lab", "skills", "match", "merge these PDF documents", "--root", str(root)]
    human = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert human.returncode == 0, human.stderr
    fallback_lines = [line for line in human.stderr.splitlines() if "embedder_fallback" in line]
    assert not fallback_lines and "matching is lexical (TF-IDF)" in " ".join(human.stdout.split())
    as_json = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["fallback_from"] and "embedder_fallback" not in as_json.stderr
