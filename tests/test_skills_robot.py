"""The "Integration with Robot" recipe of docs/skills.md, run against the real Robot and the
offline scripted model: matched instructions are in the system prompt during the run, the
skill's script tool is offered and runs, and the prompt is restored afterwards, even when
the run fails. The Robot wires this in itself; this test keeps the documented recipe true.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from robot_lab.settings import SandboxSettings
from robot_lab.skills import FakeEmbedder, SkillCatalog, SkillMatcher, SkillTool
from tests.test_skills import write_skill

runtime = pytest.importorskip("robot_lab.runtime.robot")


def run_with_skills(robot: Any, message: str, skills: list[Any], matcher: SkillMatcher, **kwargs: Any) -> Any:
    """The documented matching-mode recipe, from the outside."""
    injection = matcher.prepare(message, skills, sandbox=kwargs.pop("sandbox", None))
    saved = robot.instructions
    try:
        if injection:
            robot._set_system_message(injection.system_prompt(saved))
        return robot.run(message, tools="inherit", extra_tools=injection.tools, **kwargs)
    finally:
        robot._set_system_message(saved)


@pytest.fixture
def catalog(tmp_path: Path) -> SkillCatalog:
    write_skill(tmp_path, "greeter", "Greet people warmly by their name.", "GREETER INSTRUCTIONS",
                scripts={"greet.py": '"""Greet someone."""\nimport sys\nprint("hi", *sys.argv[1:])\n'})
    write_skill(tmp_path, "taxes", "Compute income tax for a salary.", "TAX INSTRUCTIONS")
    return SkillCatalog([tmp_path])


def test_matched_skill_injected_for_one_run(catalog: SkillCatalog) -> None:
    seen: list[str | None] = []

    def probe(note: str) -> str:
        """Record the system prompt the model is running under."""
        seen.append(robot.instructions)
        return "probed"

    robot = runtime.build(name="skilled", system_prompt="BASE", model="scripted/echo", local_tools=[probe])
    matcher = SkillMatcher(FakeEmbedder(), 0.3)
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined")
    result = run_with_skills(robot, "please greet people by name", catalog.all(), matcher, sandbox=sandbox)
    assert seen == ["GREETER INSTRUCTIONS\n\nBASE"]
    assert "- greeter__greet: hi" in result.reply  # the script tool was offered, called and ran
    assert robot.instructions == "BASE"
    assert robot.local_tools.names() == ["probe"]

    seen.clear()
    run_with_skills(robot, "what is the weather", catalog.all(), matcher, sandbox=sandbox)
    assert seen == ["BASE"]


class Boom(BaseException):
    """Escapes the tool loop's error handling (which turns Exceptions into text)."""


def test_prompt_restored_when_the_run_fails(catalog: SkillCatalog) -> None:
    def explode(note: str) -> str:
        """Fail the run from inside."""
        raise Boom()

    robot = runtime.build(name="failing", system_prompt="BASE", model="scripted/echo", local_tools=[explode])
    with pytest.raises(Boom):
        run_with_skills(robot, "greet people by name", catalog.all(), SkillMatcher(FakeEmbedder(), 0.3))
    assert robot.instructions == "BASE"


def test_skill_tool_mode_with_a_scripted_call(catalog: SkillCatalog) -> None:
    skill_tool = SkillTool(catalog, ["greeter", "taxes"])
    robot = runtime.build(name="tooled", system_prompt="BASE", model="scripted/echo")
    saved = robot.instructions
    try:
        robot._set_system_message("\n\n".join(p for p in (saved, skill_tool.listing()) if p))
        listing = robot.instructions
        result = robot.run("do the thing", tools="inherit", extra_tools=[skill_tool])
    finally:
        robot._set_system_message(saved)
    assert "- greeter: Greet people warmly" in listing and "GREETER INSTRUCTIONS" not in listing
    # echo calls each offered tool once with schema-generated arguments: the enum's first value
    assert "GREETER INSTRUCTIONS" in result.reply
    assert [a.skill.name for a in skill_tool.activations] == ["greeter"]
    assert [t.name for t in skill_tool.active_tools()] == ["greeter__greet"]
    assert robot.instructions == "BASE"
