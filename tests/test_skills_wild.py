"""Bundles shaped like the public ones (tests/fixtures/wild_skills) work out of the box.

Each shape measured on a public collection is reproduced: an executable ``.py``
with no ``#!`` (the bundle's only script), ``#!/usr/bin/env python3`` scripts that need
robot-lab's packages, a Python path with ``..`` and a symlink, no fs grants but a
multi-step file flow, instructions that say "read FORMS.md", library modules and data files
in ``scripts/``, two skills sharing a script name beside a robot tool of that name. The PDF
form flow runs end to end under bwrap, driven by the scripted model: a fillable PDF made
with reportlab is attached, its fields extracted to JSON, then filled in the workspace.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import robot_lab
from robot_lab.errors import ConfigurationError
from robot_lab.llm.scripted import register_script, unregister_script
from robot_lab.schemas.codec import decode_message, encode_message
from robot_lab.schemas.messages import RobotMessage
from robot_lab.settings import SandboxSettings, Settings
from robot_lab.skills import AgentSkill, Capabilities, FakeEmbedder, SkillCatalog, SkillMatcher, reset_default_catalog
from robot_lab.skills import reset_default_matcher, validate
from robot_lab.skills.file_tool import SkillFileTool
from robot_lab.skills.session import SkillSession, reset_sessions, unique_tools
from robot_lab.sandbox.workspace import Workspace, envelope_attachments
from tests.test_skills_sandbox import bwrap, needs_bwrap  # noqa: F401 - the fixture is used by name

WILD = Path(__file__).parent / "fixtures" / "wild_skills"
pypdf = pytest.importorskip("pypdf")
reportlab_canvas = pytest.importorskip("reportlab.pdfgen.canvas")


def make_form(path: Path) -> bytes:
    """A one-page PDF with two fillable text fields, ``name`` and ``city``."""
    pdf = reportlab_canvas.Canvas(str(path))
    pdf.drawString(50, 760, "Name:")
    pdf.acroForm.textfield(name="name", x=120, y=750, width=240, height=20)
    pdf.drawString(50, 720, "City:")
    pdf.acroForm.textfield(name="city", x=120, y=710, width=240, height=20)
    pdf.save()
    return path.read_bytes()


@pytest.fixture
def wild_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The wild bundles as the skills root, TF-IDF matching, workspaces under tmp_path."""
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(WILD)]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__WORKSPACE_ROOT", str(tmp_path / "workspaces"))
    reset_default_catalog()
    reset_default_matcher()
    reset_sessions()
    yield tmp_path / "workspaces"
    reset_default_catalog()
    reset_default_matcher()
    reset_sessions()


def pdf_skill() -> AgentSkill:
    return SkillCatalog([WILD], entry_points=False).get("pdf")


# --- interpreters -------------------------------------------------------------------------------


def test_wild_bundles_pass_strict_validation_and_expose_only_programs() -> None:
    for bundle in sorted(WILD.iterdir()):
        skill, issues = validate(bundle, strict=True)
        assert skill is not None and not [i for i in issues if i.level == "error"], (bundle, issues)
    tools = {t.script_name: t for t in pdf_skill().script_tools(Capabilities())}
    # utils.py is a library module and field_template.csv data: neither becomes a tool
    assert set(tools) == {"check_fillable_fields", "extract_form_field_info", "fill_fillable_fields"}
    assert {t.name for t in tools.values()} == {"pdf__check_fillable_fields", "pdf__extract_form_field_info",
                                                "pdf__fill_fillable_fields"}
    assert tools["extract_form_field_info"].description == "Extract the fillable fields of a PDF form into a JSON file."


@needs_bwrap
def test_executable_py_without_shebang_runs_with_robot_labs_python(tmp_path: Path) -> None:
    skill = SkillCatalog([WILD], entry_points=False).get("env-probe")
    tool = skill.script_tools(Capabilities())[0]
    result = tool.call({})
    assert "import: not found" not in result
    assert result.endswith(" msgspec"), result  # a package of robot-lab's environment
    assert tool.last_outcome is not None and tool.last_outcome.mode == "bwrap"


@needs_bwrap
def test_python_path_with_dotdot_and_symlink_runs_inside_bwrap(tmp_path: Path) -> None:
    link = tmp_path / "linked"
    link.symlink_to(Path(sys.executable).parent)
    weird = f"{link}/../linked/{Path(sys.executable).name}"
    settings = Settings(skills={"python": weird})
    skill = SkillCatalog([WILD], settings=settings, entry_points=False).get("env-probe")
    tool = skill.script_tools(Capabilities())[0]
    assert ".." not in tool.command[0] and "linked" not in tool.command[0]
    assert tool.call({}).endswith(" msgspec")


# --- unique tool names ----------------------------------------------------------------------------


class RobotTool:
    def __init__(self, name: str) -> None:
        self.name, self.description = name, f"robot tool {name}"
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def call(self, arguments: dict[str, Any]) -> str:
        return self.name


def test_tool_names_are_unique_across_skills_and_robot_tools(tmp_path: Path) -> None:
    catalog = SkillCatalog([WILD], entry_points=False)
    skills = catalog.select(["report-a", "report-b"])
    session = SkillSession("desk", "conv-unique", settings=Settings(skills={"workspace_root": str(tmp_path)}))
    robot_tools = [RobotTool("run"), RobotTool("report-a__run")]
    run = session.match_run("report the quarterly numbers", skills, robot_tools, "BASE",
                            matcher=SkillMatcher(FakeEmbedder(), 0.0))
    names = [t.name for t in run.tools]
    assert len(names) == len(set(names)), names
    assert names[:2] == ["run", "report-a__run"]  # robot tools keep their names
    assert {"report-a__run_2", "report-b__run", "read_skill_file"} <= set(names)
    renamed = next(t for t in run.tools if t.name == "report-a__run_2")
    assert renamed.call({}).startswith("report a")  # the renamed copy still runs its script
    assert unique_tools([RobotTool("x"), RobotTool("x"), RobotTool("x")])[2].name == "x_3"


# --- reading bundle files ------------------------------------------------------------------------------


def test_read_skill_file_is_confined_and_capped(tmp_path: Path) -> None:
    skill = pdf_skill()
    tool = SkillFileTool([skill], max_bytes=64)
    assert tool.call({"skill": "pdf", "path": "FORMS.md"}).startswith("# Filling PDF forms")
    cut = tool.call({"skill": "pdf", "path": "FORMS.md"})
    assert "[... cut at 64 bytes: bytes 0-64 of" in cut and "offset=64" in cut
    assert tool.call({"skill": "pdf", "path": "FORMS.md", "offset": 64}).startswith(
        (WILD / "pdf" / "FORMS.md").read_bytes()[64:80].decode())
    listing = tool.call({"skill": "pdf", "path": "references"})
    assert "references/advanced.md" in listing
    for escape in ("../env-probe/SKILL.md", "scripts/../../report-a/SKILL.md"):
        assert "outside the pdf skill folder" in tool.call({"skill": "pdf", "path": escape}), escape
    assert "no file 'etc/passwd' in the pdf skill" in tool.call({"skill": "pdf", "path": "/etc/passwd"})
    missing = tool.call({"skill": "pdf", "path": "NOPE.md"})
    assert missing.startswith("Error (read_skill_file): no file 'NOPE.md'") and "FORMS.md" in missing
    assert tool.call({"skill": "other", "path": "x"}).startswith("Error (read_skill_file): unknown skill")


def test_read_skill_file_refuses_symlinks_out_and_describes_binaries(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    (bundle / "assets").mkdir(parents=True)
    (bundle / "SKILL.md").write_text("---\nname: b\ndescription: d\n---\nbody\n")
    (bundle / "assets" / "logo.png").write_bytes(b"\x89PNG\x00\x00binary")
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (bundle / "leak.md").symlink_to(secret)
    tool = SkillFileTool([AgentSkill(bundle)])
    assert "outside the b skill folder" in tool.call({"skill": "b", "path": "leak.md"})
    assert "binary file" in tool.call({"skill": "b", "path": "assets/logo.png"})


# --- the workspace ------------------------------------------------------------------------------------


def test_workspace_attachments_by_bytes_path_and_envelope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("user file")
    sandbox = SandboxSettings(max_attachment_bytes=100, attach_from=["."])
    ws = Workspace(tmp_path / "ws", sandbox=sandbox)
    assert ws.attach(b"hello", "../../evil.txt") == ws.path / "evil.txt"  # no folders, no '..'
    assert ws.attach("mine.txt").read_text() == "user file"
    entries = envelope_attachments([("data.bin", b"\x00\x01"), "mine.txt"])
    assert entries[0] == {"name": "data.bin", "content_base64": base64.b64encode(b"\x00\x01").decode()}
    assert [p.name for p in ws.attach_all(entries)] == ["data.bin", "mine.txt"]
    assert (ws.path / "data.bin").read_bytes() == b"\x00\x01"
    assert ws.files() == ["data.bin", "evil.txt", "mine.txt"]
    assert f"Working Directory: {ws.path}" in ws.prompt() and "data.bin, evil.txt, mine.txt" in ws.prompt()
    with pytest.raises(ConfigurationError, match="outside the folders files may be attached from"):
        ws.attach("/etc/hostname")
    with pytest.raises(ConfigurationError, match="the limit is 100"):
        ws.attach(b"x" * 101, "big.bin")
    with pytest.raises(ConfigurationError, match="needs a name"):
        ws.attach(b"x")
    with pytest.raises(ConfigurationError, match="not base64"):
        ws.attach({"name": "a", "content_base64": "!!"})


def test_envelope_keeps_attachments_as_an_extension() -> None:
    message = RobotMessage(to="clerk", content="fill this in",
                           extensions={"attachments": envelope_attachments([("form.pdf", b"%PDF")])})
    raw = json.loads(encode_message(message))
    assert raw["attachments"][0]["name"] == "form.pdf"  # top level: any language can send it
    assert decode_message(encode_message(message)).extensions["attachments"] == raw["attachments"]


@needs_bwrap
def test_workspace_is_writable_kept_and_can_be_turned_off(tmp_path: Path) -> None:
    bundle = tmp_path / "skills" / "writer"
    (bundle / "scripts").mkdir(parents=True)
    (bundle / "SKILL.md").write_text("---\nname: writer\ndescription: writes files\n---\nbody\n")
    (bundle / "scripts" / "write.py").write_text(
        "import os, sys\nopen(sys.argv[1], 'a').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))\n")
    tool = AgentSkill(bundle).script_tools(Capabilities())[0]
    ws = Workspace(tmp_path / "ws")
    bound = tool.in_workspace(ws.path)
    first = bound.call({"args": "out.txt"})
    assert first.startswith(f"{ws.path} ['out.txt']")
    assert first.endswith("[files written to the working directory: out.txt]")
    bound.call({"args": "out.txt"})
    assert (ws.path / "out.txt").read_text() == "xx"  # kept across calls
    off = SandboxSettings(workspace=False)
    closed = AgentSkill(bundle).script_tools(Capabilities.ceiling(off), sandbox=off)[0].in_workspace(ws.path)
    assert "Read-only file system" in closed.call({"args": "out.txt"})  # operator ceiling: no workspace
    assert (ws.path / "out.txt").read_text() == "xx"


# --- the PDF form flow, end to end ------------------------------------------------------------------


PDF_FLOW = {
    "rules": [
        {"when": {"contains": "fill out this PDF form"},
         "tool_calls": [
             {"name": "read_skill_file", "arguments": {"skill": "pdf", "path": "FORMS.md"}},
             {"name": "pdf__check_fillable_fields", "arguments": {"args": "form.pdf"}},
             {"name": "pdf__extract_form_field_info", "arguments": {"args": "form.pdf fields.json"}},
         ],
         "reply": "{tool_results}"},
        {"when": {"contains": "Ada Lovelace"},
         "tool_calls": [{"name": "pdf__fill_fillable_fields",
                         "arguments": {"args": "form.pdf filled.pdf --set 'name=Ada Lovelace' --set city=London"}}],
         "reply": "{tool_results}"},
    ],
}


@needs_bwrap
def test_pdf_form_flow_end_to_end(wild_env: Path, redis_client: Any, tmp_path: Path) -> None:
    register_script("pdf-flow", PDF_FLOW)
    try:
        form = make_form(tmp_path / "form.pdf")
        robot = robot_lab.build(name="clerk", model="scripted/pdf-flow", system_prompt="You help with paperwork.",
                                skills=["pdf", "env-probe", "report-a", "report-b"])
        first = robot.run("please fill out this PDF form for me", conversation_id="conv-pdf",
                          attachments=[("form.pdf", form)])
        assert first.error is None
        calls = {c.tool.name: str(c.data) for c in first.tool_calls}
        assert calls["read_skill_file"].startswith("# Filling PDF forms")
        assert calls["pdf__check_fillable_fields"] == "This PDF has 2 fillable form fields"
        assert calls["pdf__extract_form_field_info"].startswith("Wrote 2 fields to fields.json")
        assert "[files written to the working directory: fields.json]" in calls["pdf__extract_form_field_info"]
        workspaces = [p for p in wild_env.iterdir() if p.name.startswith("conv-pdf")]
        assert len(workspaces) == 1
        workspace = workspaces[0]
        assert {f["field_id"] for f in json.loads((workspace / "fields.json").read_text())} == {"name", "city"}

        # turn 2 matches no skill by itself: the pdf skill sticks to the conversation
        second = robot.run("Use Ada Lovelace as the name and London as the city", conversation_id="conv-pdf")
        calls = {c.tool.name: str(c.data) for c in second.tool_calls}
        assert calls["pdf__fill_fillable_fields"].startswith("Filled 2 fields into filled.pdf"), calls
        values = {name: field.get("/V") for name, field in pypdf.PdfReader(workspace / "filled.pdf").get_fields().items()}
        assert values == {"name": "Ada Lovelace", "city": "London"}
        assert (workspace / "form.pdf").read_bytes() == form  # the attachment is untouched
        assert not (Path(os.getcwd()) / "filled.pdf").exists()
    finally:
        unregister_script("pdf-flow")


def test_a_served_robot_gets_the_envelopes_attachments(redis_client: Any) -> None:
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.schemas.messages import RobotResult, TextMessage

    class Clerk:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def run(self, message: str, *, conversation_id: str | None = None, attachments: Any = None) -> RobotResult:
            self.seen.append((message, conversation_id, attachments))
            return RobotResult(robot_name="clerk", output=[TextMessage(content="ok")])

    bus = Bus(redis_client)
    clerk = Clerk()
    poller = BusPoller("clerk", bus, block_ms=0, retry_delay=0, consumer="c1").serve(clerk)
    poller.poll()
    files = envelope_attachments([("form.pdf", b"%PDF-1.4")])
    bus.publish_message(RobotMessage(to="clerk", content="fill it", conversation_id="c-9",
                                     extensions={"attachments": files}))
    while poller.run_once():
        pass
    assert clerk.seen == [("fill it", "c-9", files)]


def test_sticky_skills_are_shared_through_redis(redis_client: Any, key_prefix: str, tmp_path: Path) -> None:
    from robot_lab.keys import Keys

    catalog = SkillCatalog([WILD], entry_points=False)
    skills = catalog.select(["pdf", "report-a"])
    settings = Settings(skills={"workspace_root": str(tmp_path)})
    keys = Keys(prefix=key_prefix)
    matcher = SkillMatcher(FakeEmbedder(), settings=Settings(skills={"match_rules": {"fake": {"floor": 0.3}}}))
    first = SkillSession("clerk", "conv-7", settings=settings, redis=redis_client, keys=keys)  # worker 1
    assert [s.name for s in first.match_run("fill in the pdf form", skills, [], None, matcher=matcher).skills] == ["pdf"]
    second = SkillSession("clerk", "conv-7", settings=settings, redis=redis_client, keys=keys)  # worker 2
    run = second.match_run("Ada Lovelace, London", skills, [], None, matcher=matcher)
    assert [s.name for s in run.skills] == ["pdf"]  # the conversation's skill, read back from Redis
    assert json.loads(redis_client.get(keys.skill_sticky("clerk", "conv-7"))) == ["pdf"]
    assert redis_client.ttl(keys.skill_sticky("clerk", "conv-7")) > 0


def test_attaching_never_writes_through_a_link_a_script_left(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (ws.path / "form.pdf").symlink_to(precious)  # what a hostile script could leave behind
    ws.attach(b"%PDF new", "form.pdf")
    assert precious.read_text() == "keep me"
    assert not (ws.path / "form.pdf").is_symlink() and (ws.path / "form.pdf").read_bytes() == b"%PDF new"


def test_a_workspace_root_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root").symlink_to(elsewhere)
    with pytest.raises(ConfigurationError, match="symlink or belongs to another user"):
        Workspace.for_scope("conv-1", settings=Settings(skills={"workspace_root": str(tmp_path / "root")}))
