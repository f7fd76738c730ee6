"""AgentSkills wired into the Robot itself: matching mode injects for one run only, the
Skill-tool mode lets the model activate a skill, template skills still expand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import robot_lab
from robot_lab.skills.catalog import reset_default_catalog
from robot_lab.skills.matching import reset_default_matcher
from tests.test_skills import write_skill

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@pytest.fixture
def skills_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "skills"
    write_skill(root, "greeter", "Greet people warmly by their name.", "GREETER INSTRUCTIONS",
                scripts={"greet.py": '"""Greet someone."""\nimport sys\nprint("hi", *sys.argv[1:])\n'})
    write_skill(root, "taxes", "Compute income tax for a salary.", "TAX INSTRUCTIONS")
    monkeypatch.setenv("ROBOT_LAB_SKILLS__ROOTS", json.dumps([str(root)]))
    monkeypatch.setenv("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__ENABLED", "false")
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__WHEN_UNAVAILABLE", "unconfined")
    reset_default_catalog()
    reset_default_matcher()
    yield root
    reset_default_catalog()
    reset_default_matcher()


def test_matched_skill_is_injected_for_one_run_only(skills_root: Path) -> None:
    seen: list[str | None] = []

    def probe(note: str) -> str:
        """Record the system prompt in force."""
        seen.append(robot.instructions)
        return "ok"

    robot = robot_lab.build(name="desk", system_prompt="BASE", skills=["greeter", "taxes"], local_tools=[probe])
    assert [s.name for s in robot.agent_skills] == ["greeter", "taxes"]
    result = robot.run("please greet people warmly by name", tools="inherit")
    assert len(seen) == 1 and seen[0].startswith("GREETER INSTRUCTIONS\n\nBASE\n\nWorking Directory: ")
    assert "- greeter__greet: hi" in result.reply  # the matched skill's script became a tool and ran
    assert robot.instructions == "BASE"
    seen.clear()
    robot.run("and now the next one", tools="inherit")  # the chosen skill sticks to the conversation
    assert seen[0].startswith("GREETER INSTRUCTIONS")
    assert robot.instructions == "BASE"
    seen.clear()
    robot = robot_lab.build(name="desk", system_prompt="BASE", skills=["greeter", "taxes"], local_tools=[probe])
    robot.run("bake some banana bread", tools="inherit")  # a new robot: a new conversation
    assert seen == ["BASE"]


def test_prompt_restored_when_the_run_fails(skills_root: Path) -> None:
    robot = robot_lab.build(name="fragile", system_prompt="BASE", skills=["greeter"], model="scripted/fail:down")
    robot._gateway = robot_lab.llm.gateway.LLMGateway(max_retries=0)  # type: ignore[attr-defined]
    with pytest.raises(robot_lab.InferenceError):
        robot.run("greet people warmly by name")
    assert robot.instructions == "BASE"


def test_skill_tool_mode_lets_the_model_activate_a_skill(skills_root: Path) -> None:
    robot = robot_lab.build(name="agent", system_prompt="BASE", skills=["greeter", "taxes"], skill_mode="tool")
    result = robot.run("do what you can", tools="inherit")
    names = [r.tool.name for r in result.tool_calls]
    assert names[0] == "Skill"
    assert "GREETER INSTRUCTIONS" in result.tool_calls[0].data  # instructions arrive as the tool result
    assert "greeter__greet" in names[1:]  # the activated skill's script tool was offered on the next round
    assert robot.instructions == "BASE"


def test_template_skills_and_agent_skills_mix(skills_root: Path) -> None:
    robot = robot_lab.build(name="mix", skills=["concise", "greeter"], template_dirs=[TEMPLATES])
    assert [s.name for s in robot.agent_skills] == ["greeter"]
    assert robot.instructions == "Always say please.\n\nKeep answers short."


def test_bad_skill_mode_is_rejected() -> None:
    with pytest.raises(robot_lab.ConfigurationError, match="skill_mode"):
        robot_lab.build(name="x", skill_mode="auto")


def test_skill_tool_mode_activation_sticks_to_the_conversation(skills_root: Path) -> None:
    from robot_lab.llm.scripted import register_script, unregister_script

    register_script("activate-then-use", {"rules": [
        {"when": {"contains": "first"}, "tool_calls": [{"name": "Skill", "arguments": {"skill": "greeter"}}],
         "reply": "loaded"},
        {"when": {"contains": "second"},
         "tool_calls": [{"name": "greeter__greet", "arguments": {"args": "Ada"}}], "reply": "{tool_results}"},
    ]})
    try:
        robot = robot_lab.build(name="agent2", system_prompt="BASE", skills=["greeter", "taxes"], skill_mode="tool",
                                model="scripted/activate-then-use")
        robot.run("first, load what you need")
        second = robot.run("second, greet Ada")
        assert [str(c.data) for c in second.tool_calls] == ["hi Ada"]  # offered again without a new Skill call
    finally:
        unregister_script("activate-then-use")
