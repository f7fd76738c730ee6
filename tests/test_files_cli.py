"""Files that come back, from the command line: ``send --attach --wait --out``, ``files get``,
``chat --out``; and ``skills doctor`` naming what a bundle's scripts need."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from robot_lab.bus import Bus, BusPoller
from robot_lab.cli import main
from robot_lab.llm.scripted import register_script, unregister_script
from robot_lab.schemas.messages import ResultFile, RobotResult, TextMessage
from robot_lab.sandbox.workspace import Workspace
from tests.test_skills_sandbox import bwrap, needs_bwrap  # noqa: F401 - the fixture is used by name


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


class Reverser:
    """A served robot that writes each attachment reversed, plus a file too big to go inline."""

    def __init__(self, folder: Path) -> None:
        self.workspace = Workspace(folder)

    def run(self, message: str, *, conversation_id: str | None = None, attachments: Any = None) -> RobotResult:
        files = []
        for path in self.workspace.attach_all(attachments):
            out = path.with_name(f"reversed-{path.name}")
            out.write_bytes(path.read_bytes()[::-1])
            files.append(out)
        big = self.workspace.path / "big.bin"
        big.write_bytes(b"x" * 400_000)
        files.append(big)
        return RobotResult(robot_name="rev", output=[TextMessage(content=f"did {message}")],
                           workspace=str(self.workspace.path),
                           files=[ResultFile(path=p.name, size=p.stat().st_size,
                                             sha256=hashlib.sha256(p.read_bytes()).hexdigest()) for p in files])


def test_send_attaches_files_and_saves_the_replys_files(redis_client: Any, tmp_path: Path) -> None:
    bus = Bus()
    (tmp_path / "note.txt").write_bytes(b"abc")
    poller = BusPoller("rev", bus, block_ms=50, consumer="cli").serve(Reverser(tmp_path / "ws"))
    with poller:
        result = run("send", "rev", "flip it", "--attach", str(tmp_path / "note.txt"), "--wait", "--timeout", "20",
                     "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "did flip it"
    assert "file: reversed-note.txt (3 bytes, inline)" in result.output
    ref = hashlib.sha256(b"x" * 400_000).hexdigest()
    assert f"file: big.bin (400000 bytes, ref {ref})" in result.output
    assert (tmp_path / "out" / "reversed-note.txt").read_bytes() == b"cba"
    assert (tmp_path / "out" / "big.bin").read_bytes() == b"x" * 400_000

    got = run("files", "get", ref, "--out", str(tmp_path / "again.bin"))
    assert got.exit_code == 0 and (tmp_path / "again.bin").read_bytes() == b"x" * 400_000
    assert run("files", "get", "nothex").output.endswith("REF is the 64 hex digits of a reply attachment's 'ref'\n")
    missing = run("files", "get", "0" * 64)
    assert missing.exit_code == 1 and "is no longer stored (bus.file_ttl passed" in missing.output
    assert "Traceback" not in missing.output
    assert run("send", "rev", "x", "--out", str(tmp_path)).exit_code == 2  # --out needs --wait


CHAT_WRITER = {"turns": [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "report/summary.md", "content": "# Done\n"}}]},
    {"reply": "wrote it"},
]}


@needs_bwrap
def test_chat_prints_the_working_directory_and_copies_the_new_files_out(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.skills import reset_default_catalog, reset_default_matcher
    from tests.test_workspace_tools import write_skill

    write_skill(tmp_path / "skills", "reports", "write markdown reports")
    (tmp_path / "data.csv").write_text("a,b\n")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(tmp_path / "skills")]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__WORKSPACE_ROOT", str(tmp_path / "ws"))
    register_script("chat-writer", CHAT_WRITER)
    reset_default_catalog()
    reset_default_matcher()
    try:
        result = run("chat", "--skills", "reports", "-m", "scripted/chat-writer", "--attach", str(tmp_path / "data.csv"),
                     "--out", str(tmp_path / "out"), "write markdown reports")
    finally:
        unregister_script("chat-writer")
        reset_default_catalog()
        reset_default_matcher()
    assert result.exit_code == 0, result.output
    assert "working directory: " + str(tmp_path / "ws") in result.output
    assert f"file: report/summary.md (7 bytes) -> {tmp_path / 'out' / 'report' / 'summary.md'}" in result.output
    assert (tmp_path / "out" / "report" / "summary.md").read_text() == "# Done\n"
    assert not (tmp_path / "out" / "data.csv").exists()  # the attachment is not a result


def test_doctor_names_what_a_bundles_scripts_need(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_workspace_tools import write_skill

    write_skill(tmp_path / "skills", "office", "office files", files={
        "scripts/convert.py": ("import json, subprocess\nimport yaml\nimport robot_lab_no_such_pkg\n"
                               "from helpers.util import x\nfrom scripts.convert import y\n"
                               "subprocess.run(['qpdf', '--linearize', 'a.pdf'])\n"),
        "scripts/helpers/util.py": "x = 1\n",
        "scripts/build.js": "const fs = require('fs');\nconst docx = require('docx');\n",
        "reference.md": "```python\nfrom pptx import Presentation\n```\nRun `pandoc in.md -o out.docx` or "
                        "`npm install -g pptxgenjs`. Convert your notes first.\n",
    })
    import robot_lab.skills.doctor as doctor

    real_which = doctor.shutil.which
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None if name in ("qpdf", "pandoc") else real_which(name))
    result = run("skills", "doctor", "--root", str(tmp_path / "skills"), "office", "--json")
    assert result.exit_code == 1, result.output  # something is missing
    data = json.loads(result.stdout)["skills"][0]
    needs = {(n["kind"], n["name"]): n["present"] for n in data["needs"]}
    assert needs[("python", "yaml")] is True and needs[("python", "robot_lab_no_such_pkg")] is False
    assert ("python", "helpers") not in needs and ("python", "scripts") not in needs and ("python", "json") not in needs
    assert ("python", "pptx") in needs  # from a python block of the Markdown
    assert needs[("program", "qpdf")] is False and needs[("program", "pandoc")] is False
    assert ("program", "convert") not in needs  # a word in prose is not a command
    assert ("node", "docx") in needs and ("node", "pptxgenjs") in needs and ("node", "fs") not in needs
    install = data["install"]
    assert any(line.endswith("-m pip install python-pptx robot_lab_no_such_pkg") for line in install) or \
        any("robot_lab_no_such_pkg" in line and "pip install" in line for line in install), install
    assert "apt-get install --no-install-recommends pandoc qpdf" in install
    text = run("skills", "doctor", "--root", str(tmp_path / "skills"), "office")
    assert "MISSING python  robot_lab_no_such_pkg  (scripts/convert.py)" in text.output
    assert run("skills", "doctor", "--root", str(tmp_path / "skills"), "nope").exit_code == 1


def test_doctor_venv_makes_a_fresh_interpreter_and_names_the_setting(tmp_path: Path) -> None:
    from tests.test_workspace_tools import write_skill

    write_skill(tmp_path / "skills", "plain", "stdlib only", files={"scripts/run.py": "import json\nprint(1)\n"})
    venv = tmp_path / "skill-venv"
    result = run("skills", "doctor", "--root", str(tmp_path / "skills"), "plain", "--venv", str(venv), "--json")
    assert result.exit_code == 0, result.output
    python = venv.resolve() / "bin" / "python"
    assert python.exists()
    assert f"venv ready: set ROBOT_LAB_SKILLS__PYTHON={python}" in result.output
    assert json.loads(result.stdout)["skills"][0]["python"] == str(python)  # checked with that interpreter
