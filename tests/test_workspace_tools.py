"""The workspace tools (read_file, write_file, list_files, run_command) run under real bwrap
with the default ceiling; ``allowed-tools`` maps the seed's names onto them; the files a run
writes come back in ``RobotResult.files`` and, served, in the reply's ``attachments``."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import robot_lab
from robot_lab.errors import BusError
from robot_lab.llm.recording import clear_recorded_calls, recorded_calls
from robot_lab.llm.scripted import register_script, unregister_script
from robot_lab.settings import SandboxSettings, Settings, reload_settings
from robot_lab.skills import AgentSkill, FakeEmbedder, SkillMatcher, reset_default_catalog, reset_default_matcher
from robot_lab.skills.matching import cap_selected, filter_tools
from robot_lab.skills.session import SkillSession, reset_sessions
from robot_lab.sandbox.workspace_tools import expand_allowed, workspace_tools
from tests.test_skills_sandbox import bwrap, needs_bwrap  # noqa: F401 - the fixture is used by name


def write_skill(root: Path, name: str, description: str, *, extra: str = "", files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n{extra}---\n# {name}\nDo it.\n")
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


@pytest.fixture
def tools(tmp_path: Path) -> dict[str, Any]:
    bundle = write_skill(tmp_path / "skills", "office", "office files", files={
        "scripts/office/helpers.py": "def shout(text):\n    return text.upper()\n",
        "scripts/office/pack.py": "import sys\nfrom scripts.office.helpers import shout\nprint(shout(sys.argv[1]))\n",
    })
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return {t.name: t for t in workspace_tools(workspace, [bundle], sandbox=SandboxSettings())} | {
        "bundle": bundle, "workspace": workspace}


@needs_bwrap
def test_files_are_written_read_and_listed_inside_the_sandbox(tools: dict[str, Any]) -> None:
    ws: Path = tools["workspace"]
    assert tools["write_file"].call({"path": "notes/a.txt", "content": "héllo"}) == (
        "Wrote 6 bytes to notes/a.txt\n[files written to the working directory: notes/a.txt]")
    assert (ws / "notes" / "a.txt").read_text() == "héllo"
    assert tools["write_file"].last_outcome.mode == "bwrap"
    assert tools["read_file"].call({"path": "notes/a.txt"}) == "héllo"
    blob = bytes(range(256))
    tools["write_file"].call({"path": "b.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"})
    assert (ws / "b.bin").read_bytes() == blob
    read = tools["read_file"].call({"path": "b.bin"})
    assert read.startswith("[binary file, 256 bytes; bytes 0-256 as base64]\n")
    assert base64.b64decode(read.split("\n", 1)[1]) == blob
    assert tools["list_files"].call({}) == "b.bin\t256\nnotes/a.txt\t6"
    assert tools["read_file"].call({"path": "missing.txt"}) == "Error (exit 1):\nNo such file or directory: missing.txt"
    assert tools["write_file"].call({"path": "x"}) == "Error (bad args): write_file needs 'content'"


@needs_bwrap
def test_long_files_are_cut_with_an_offset_to_read_on(tools: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    (tools["workspace"] / "long.txt").write_text("x" * 100_000)
    seen, offset, reads = 0, 0, 0
    while True:
        text = tools["read_file"].call({"path": "long.txt", "offset": offset})
        reads += 1
        seen += text.count("x")
        if "call again with offset=" not in text:
            break
        offset = int(text.rsplit("offset=", 1)[1].split()[0])
    assert (seen, reads) == (100_000, 2)


@needs_bwrap
def test_run_command_sees_the_bundle_read_only_and_nothing_of_the_host(tools: dict[str, Any], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    bundle: Path = tools["bundle"]
    run = tools["run_command"]
    # scripts in subfolders, importing their bundle as a package (the bundle is on PYTHONPATH)
    assert run.call({"command": f"python {bundle}/scripts/office/pack.py hello"}) == "HELLO"
    assert run.last_outcome.mode == "bwrap"
    assert "Read-only file system" in run.call({"command": f"touch {bundle}/x"})
    assert not (bundle / "x").exists()
    host = tmp_path / "host-secret.txt"
    host.write_text("secret")
    assert "No such file or directory" in run.call({"command": f"cat {host}"})
    (Path.cwd() / ".env").exists()  # the worker's cwd is not mounted either
    assert run.call({"command": f"test -e {Path.cwd()}/pyproject.toml && echo seen || echo unseen"}) == "unseen"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host")
    assert run.call({"command": "echo key=${OPENAI_API_KEY:-none} home=$HOME"}) == "key=none home=/tmp"
    net = run.call({"command": "python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\""})
    assert net.startswith("Error (exit 1)") and "Network is unreachable" in net
    assert net.endswith("[no network in the sandbox: sandbox.network is false and skills.grants.<skill>.network "
                        "is not set; the operator decides]")
    missing = run.call({"command": "python -c \"open('nope.pdf')\""})
    assert "FileNotFoundError" in missing and "no network" not in missing  # not a network failure
    out = run.call({"command": "echo made > made.txt; exit 4"})
    assert out == "Error (exit 4):\n(no output)\n[files written to the working directory: made.txt]"


@needs_bwrap
def test_run_command_has_the_ceilings_timeout(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (run,) = workspace_tools(ws, names=["run_command"], sandbox=SandboxSettings(timeout=1), settings=Settings())
    assert run.call({"command": "sleep 30"}) == "Error (timed out):\n[killed: exceeded 1s]"


def test_allowed_tools_map_the_seeds_names_onto_the_workspace_tools(tmp_path: Path) -> None:
    assert expand_allowed(["Read", "Bash"]) == {"Read", "Bash", "read_file", "run_command"}
    assert expand_allowed(None) is None
    ws = tmp_path / "ws"
    ws.mkdir()
    offered = filter_tools(workspace_tools(ws), expand_allowed(["Read", "Glob"]))
    assert [t.name for t in offered] == ["read_file", "list_files"]


def test_a_skills_allowed_tools_restrict_the_workspace_tools_while_it_is_active(tmp_path: Path) -> None:
    reader = write_skill(tmp_path / "skills", "reader", "read pdf reports", extra="allowed-tools: Read Glob\n")
    free = write_skill(tmp_path / "skills", "sheets", "make excel spreadsheets")
    settings = Settings(skills={"workspace_root": str(tmp_path / "wsroot")})
    matcher = SkillMatcher(FakeEmbedder(), settings=Settings(skills={"match_rules": {"fake": {"floor": 0.3}}}))
    session = SkillSession("clerk", "c-1", settings=settings)
    run = session.match_run("read pdf reports", [AgentSkill(reader), AgentSkill(free)], [], None, matcher=matcher)
    assert [t.name for t in run.tools] == ["read_file", "list_files", "read_skill_file"]
    assert f"reader: {os.path.realpath(reader)}" in str(run.prompt)
    other = SkillSession("clerk", "c-2", settings=settings)
    run = other.match_run("make excel spreadsheets", [AgentSkill(reader), AgentSkill(free)], [], None, matcher=matcher)
    assert [t.name for t in run.tools] == ["read_file", "write_file", "list_files", "run_command", "read_skill_file"]
    off = SkillSession("clerk", "c-3", settings=Settings(skills={"workspace_root": str(tmp_path / "w"),
                                                                 "workspace_tools": False}))
    run = off.match_run("make excel spreadsheets", [AgentSkill(free)], [], None, matcher=matcher)
    assert [t.name for t in run.tools] == ["read_skill_file"]


def test_an_attachment_is_listed_when_no_skill_matches(tmp_path: Path) -> None:
    skill = write_skill(tmp_path / "skills", "sheets", "make excel spreadsheets")
    session = SkillSession("clerk", "c-9", settings=Settings(skills={"workspace_root": str(tmp_path / "w")}))
    session.attach([("notes.txt", b"hi")])
    matcher = SkillMatcher(FakeEmbedder(), settings=Settings(skills={"match_rules": {"fake": {"floor": 0.9}}}))
    run = session.match_run("what is in my file?", [AgentSkill(skill)], [], "BASE", matcher=matcher)
    assert run.skills == []
    assert run.prompt is not None and run.prompt.startswith("BASE") and "Files: notes.txt" in run.prompt
    assert "read_file" in [t.name for t in run.tools]


def test_at_most_max_selected_skills_are_injected(tmp_path: Path) -> None:
    skills = [AgentSkill(write_skill(tmp_path / "s", f"s{i}", f"skill {i}")) for i in range(5)]
    scores = {"s0": 0.3, "s1": 0.5, "s2": 0.31, "s3": 0.6, "s4": 0.2}
    assert [s.name for s in cap_selected(skills, scores, 3)] == ["s1", "s2", "s3"]  # the best, in order
    assert cap_selected(skills[:2], scores, 3) == skills[:2]
    matcher = SkillMatcher(FakeEmbedder(), settings=Settings(skills={"match_rules": {"fake": {"floor": 0.0,
                                                                                             "margin": 1.0}},
                                                                     "max_selected": 2}))
    assert len(matcher.match("skill", skills)) == 2


# --- files come back ---------------------------------------------------------------------------------


@pytest.fixture
def skills_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "skills"
    write_skill(root, "sheets", "make excel spreadsheets with formulas")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(root)]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__WORKSPACE_ROOT", str(tmp_path / "workspaces"))
    reload_settings()
    reset_default_catalog()
    reset_default_matcher()
    reset_sessions()
    yield root
    reset_default_catalog()
    reset_default_matcher()
    reset_sessions()


WRITER = {"turns": [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out/report.csv", "content": "a,b\n1,2\n"}},
                    {"name": "run_command", "arguments": {"command": "head -c 300000 /dev/zero > big.bin"}}]},
    {"reply": "done"},
]}


@needs_bwrap
def test_the_files_a_run_wrote_come_back_in_the_result_and_the_reply(skills_env: Path, redis_client: Any) -> None:
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.bus.reply_files import save_attachments

    register_script("ws-writer", WRITER)
    clear_recorded_calls()
    try:
        robot = robot_lab.build(name="clerk", model="scripted/ws-writer", skills=["sheets"])
        result = robot.run("make excel spreadsheets with formulas", conversation_id="c-files",
                           attachments=[("input.txt", b"given")])
        assert result.error is None, result
        assert {f.path: (f.size, f.media_type) for f in result.files} == {
            "out/report.csv": (8, "text/csv"), "big.bin": (300000, "application/octet-stream")}
        report = next(f for f in result.files if f.path == "out/report.csv")
        assert report.sha256 == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
        assert result.workspace and Path(result.workspace, "input.txt").read_bytes() == b"given"  # not a result
        assert {"read_file", "write_file", "list_files", "run_command"} <= set(recorded_calls()[0]["tools"])

        bus = Bus(redis_client)
        bus.register("clerk")
        poller = BusPoller("clerk", bus, block_ms=50, retry_delay=0, consumer="c1").serve(robot).start()
        try:
            reply = bus.request("clerk", "make excel spreadsheets with formulas", conversation_id="c-2", timeout=30)
        finally:
            poller.stop()
        assert reply.content == "done"
        files = {a["name"]: a for a in reply.extensions["attachments"]}
        assert base64.b64decode(files["out/report.csv"]["content_base64"]) == b"a,b\n1,2\n"  # small: inline
        assert "content_base64" not in files["big.bin"] and files["big.bin"]["ref"]  # past the inline cap
        assert bus.fetch_file(files["big.bin"]) == b"\0" * 300000
        assert bus.fetch_file(files["big.bin"]["ref"]) == b"\0" * 300000
        written = save_attachments(bus, reply.extensions["attachments"], str(skills_env.parent / "out"))
        assert sorted(Path(p).name for p in written) == ["big.bin", "report.csv"]
        redis_client.delete(bus.keys.result_file(files["big.bin"]["sha256"]))
        with pytest.raises(BusError, match="no longer stored"):
            bus.fetch_file(files["big.bin"])
        with pytest.raises(BusError, match="not a relative path"):
            save_attachments(bus, [{"name": "../evil", "content_base64": ""}], str(skills_env.parent / "out"))
    finally:
        unregister_script("ws-writer")


OFFICE_LITTER = {"turns": [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": (
        "echo doc > report.docx && echo lock > '.~lock.report.docx#' && echo owner > '~$report.docx' && "
        "echo t > lu12345.tmp && echo b > report.docx~ && echo s > .report.docx.swp && echo e > '.#notes' && "
        "mkdir -p __pycache__ && echo c > __pycache__/x.cpython-311.pyc && echo l > debug.log && "
        "mkdir -p out && echo keep > out/summary.txt")}}]},
    {"reply": "done"},
]}


@needs_bwrap
def test_lock_and_temp_files_are_not_returned_and_a_setting_ignores_more(
        skills_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An office edit leaves LibreOffice's ``.~lock.*#``, Word's ``~$*``, editor backups and
    temp files beside what the user wants: only the wanted files come back (in the result and
    in the script's note to the model), and ``sandbox.result_ignore`` names more."""
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__RESULT_IGNORE", json.dumps(["*.log"]))
    reload_settings()
    register_script("ws-litter", OFFICE_LITTER)
    clear_recorded_calls()
    try:
        robot = robot_lab.build(name="editor", model="scripted/ws-litter", skills=["sheets"])
        result = robot.run("make excel spreadsheets with formulas", conversation_id="c-litter")
        assert result.error is None, result
        assert sorted(f.path for f in result.files) == ["out/summary.txt", "report.docx"]
        assert Path(result.workspace, ".~lock.report.docx#").exists()  # left alone, only not returned
        [tool] = result.tool_calls
        assert "[files written to the working directory: out/summary.txt, report.docx]" in str(tool.content)
    finally:
        unregister_script("ws-litter")


@needs_bwrap
def test_a_network_tasks_result_lists_the_files_it_wrote(skills_env: Path) -> None:
    """Location transparency: the same robot as a network task (the rq job, embedded) reports
    its files in the recorded result and in its task.completed event."""
    import fakeredis

    from robot_lab import connection
    from robot_lab.network.dsl import create_network

    connection.reset_embedded()
    register_script("ws-writer", WRITER)
    try:
        client = fakeredis.FakeRedis()
        net = create_network("office-net")
        net.task("sheet", robot_lab.build("net-clerk", model="scripted/ws-writer", skills=["sheets"]))
        result = net.run("make excel spreadsheets with formulas", connection=client)
        assert result.status == "completed", result
        task = result.context["sheet"]
        assert {f.path for f in task.files} == {"out/report.csv", "big.bin"}
        assert task.workspace and Path(task.workspace, "out", "report.csv").read_text() == "a,b\n1,2\n"
        from robot_lab.network.coordinator import Coordinator, RunHandle

        handle = RunHandle(Coordinator(connection=client), result.run_id)
        (done,) = [e for e in handle.events() if e.event == "task.completed"]
        assert {f["path"] for f in done.data["files"]} == {"out/report.csv", "big.bin"}
    finally:
        unregister_script("ws-writer")
        connection.reset_embedded()


@needs_bwrap
def test_a_script_that_fails_for_lack_of_network_says_which_grant_is_missing(tmp_path: Path) -> None:
    bundle = write_skill(tmp_path / "skills", "weather", "weather", files={
        "scripts/fetch.py": "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=3)\n"})
    (tool,) = AgentSkill(bundle).script_tools(sandbox=SandboxSettings())
    out = tool.call({})
    assert out.startswith("Error (exit 1)"), out
    assert out.endswith("[no network in the sandbox: sandbox.network is false and skills.grants.weather.network "
                        "is not set; the operator decides]")


def test_servers_browser_js_and_helper_modules_with_a_shebang_are_not_tools(tmp_path: Path) -> None:
    from robot_lab.skills.script_tool import plan_script

    bundle = write_skill(tmp_path / "skills", "wild", "wild", files={
        "scripts/github_utils.py": "#!/usr/bin/env python3\n\"\"\"Shared helpers.\"\"\"\nimport os\n\n\ndef token():\n"
                                   "    return os.environ.get('GH')\n",
        "scripts/server.cjs": "const http = require('http');\nhttp.createServer(() => {}).listen(8080);\n",
        "scripts/helper.js": "(function() { window.addEventListener('load', () => {}); })();\n",
        "scripts/serve.py": "from flask import Flask\napp = Flask(__name__)\nif __name__ == '__main__':\n    app.run()\n",
        "scripts/cli.js": "const fs = require('fs');\nconsole.log(process.argv.slice(2));\n",
        "scripts/report.py": "#!/usr/bin/env python3\nprint('report')\n",
    })
    kinds = {p.name: plan_script(p).kind for p in sorted((bundle / "scripts").iterdir())}
    assert kinds == {"github_utils.py": "library", "server.cjs": "not-a-program", "helper.js": "not-a-program",
                     "serve.py": "not-a-program", "cli.js": "tool" if shutil.which("node") else "unrunnable",
                     "report.py": "tool"}
    assert plan_script(bundle / "scripts" / "server.cjs").why.startswith("a server that runs in the foreground")
    assert "report" in [t.script_name for t in AgentSkill(bundle).script_tools()]


def test_tool_mode_offers_the_workspace_tools_once_a_skill_is_activated(tmp_path: Path) -> None:
    reader = write_skill(tmp_path / "skills", "reader", "read pdf reports", extra="allowed-tools: [Read]\n")
    session = SkillSession("clerk", "c-tool", settings=Settings(skills={"workspace_root": str(tmp_path / "w")}))
    run = session.tool_mode_run([AgentSkill(reader)], [], "BASE")
    assert callable(run.tools)
    assert [t.name for t in run.tools()] == ["Skill"]
    skill_tool = run.tools()[0]
    text = skill_tool.call({"skill": "reader"})
    assert text.startswith('<skill name="reader">')
    assert f"Skill folder (read-only, on PYTHONPATH for run_command): {os.path.realpath(reader)}" in text
    assert [t.name for t in run.tools()] == ["Skill", "read_file", "read_skill_file"]  # allowed-tools: [Read]


@needs_bwrap
def test_a_robot_without_skills_can_be_given_the_workspace_tools_by_import_path(skills_env: Path) -> None:
    from robot_lab.sandbox import workspace_tools as module

    assert module.read_file.call({"path": "x"}).startswith("Error (read_file): no working directory")
    register_script("ws-plain", {"turns": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}},
                        {"name": "write_file", "arguments": {"path": "upper.txt", "content": "HELLO"}}]},
        {"reply": "{tool_results}"}]})
    clear_recorded_calls()
    try:
        robot = robot_lab.build(name="plain", model="scripted/ws-plain", system_prompt="BASE",
                                local_tools=["robot_lab.sandbox.workspace_tools:read_file",
                                             "robot_lab.skills.workspace_tools:write_file"])  # the first path too
        result = robot.run("shout my notes", tools="inherit", conversation_id="c-plain",
                           attachments=[("notes.txt", b"hello")])
        assert result.error is None, result
        assert "read_file: hello" in str(result.reply)
        assert [f.path for f in result.files] == ["upper.txt"]
        assert Path(str(result.workspace), "upper.txt").read_text() == "HELLO"
        system = recorded_calls()[0]["system"]
        assert system.startswith("BASE") and "Files: notes.txt" in system
        assert robot.instructions == "BASE"  # the working directory lines were for that run only
    finally:
        unregister_script("ws-plain")
