"""The model-invoked ``Skill`` tool (the gencode/Claude Code proposal): progressive disclosure.

Instead of matching by embedding, the robot's system prompt lists each available skill by
name and description only (:func:`system_prompt_listing`), and the model loads one by
calling ``Skill(skill="name", args="...")``. The call's result carries the skill's full
instructions into the conversation; its script tools become available for the rest of the
run (the Robot asks :meth:`SkillTool.active_tools` after each tool round, or passes
``on_activate``). A skill's ``allowed-tools`` restricts which tools the model may use while
it is active (:meth:`SkillTool.filter_tools`).

One ``SkillTool`` holds the state of one run: make a new one per run (it is cheap; the
catalog and the skills are shared).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.sandbox.capabilities import Capabilities
from robot_lab.skills.matching import allowed_tool_names, filter_tools
from robot_lab.skills.skill import MAX_DESCRIPTION, AgentSkill
from robot_lab.sandbox.tool_shape import ToolShape

log = get_logger("robot_lab.skills.skill_tool")

SKILL_TOOL_NAME = "Skill"


def system_prompt_listing(skills: Iterable[AgentSkill], *, tool_name: str = SKILL_TOOL_NAME) -> str:
    """The system-prompt section naming each skill (name + description, nothing else)."""
    skills = list(skills)
    if not skills:
        return ""
    lines = [
        "## Skills",
        f"You can load specialised instructions (and tools) by calling the `{tool_name}` tool with a "
        "skill's name. Load a skill before working on a task that matches its description; do not "
        "load skills that are not relevant.",
        "",
    ]
    for skill in skills:
        description = " ".join(skill.description.split())[:MAX_DESCRIPTION]
        lines.append(f"- {skill.name}: {description}")
    return "\n".join(lines)


@dataclass
class Activation:
    """One skill the model loaded during this run."""

    skill: AgentSkill
    args: str
    tools: list[Any] = field(default_factory=list)


_CLOSE_RE = re.compile(r"</(skill)\b", re.I)


def _escape(text: str) -> str:
    """``</skill>`` -> ``<\\/skill>``: the rest of the text reads the same to a model."""
    return _CLOSE_RE.sub(r"<\\/\1", text)


class SkillTool(ToolShape):
    """``Skill(skill, args)``: duck-typed tool (``name``, ``description``, ``parameters``, ``call``).

    ``SkillTool(catalog, names)`` offers the catalog skills named in ``names`` (all of the
    catalog when ``names`` is None); names that are not AgentSkills are ignored. A list of
    :class:`AgentSkill` may be given instead of a catalog.
    """

    name = SKILL_TOOL_NAME

    def __init__(
        self,
        catalog: Any,
        names: Sequence[str] | None = None,
        *,
        ceiling: Capabilities | None = None,
        sandbox: Any = None,
        on_activate: Callable[[Activation], None] | None = None,
    ) -> None:
        if isinstance(catalog, (list, tuple)):
            pool = [s for s in catalog if isinstance(s, AgentSkill)]
            skills = pool if names is None else [s for n in names for s in pool if s.name == n]
        elif names is None:
            skills = catalog.all()
        else:
            skills = catalog.select(names)
        self.skills: dict[str, AgentSkill] = {s.name: s for s in skills}
        self.ceiling = ceiling
        self.sandbox = sandbox
        self.on_activate = on_activate
        self.activations: list[Activation] = []
        self._lock = threading.Lock()
        listed = ", ".join(self.skills) or "(none)"
        self.description = (
            "Load a skill: specialised instructions, and sometimes tools, for a kind of task. Call it "
            "when the task matches one of the skills described in the system prompt, before doing the "
            f"task. Available skills: {listed}."
        )
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "skill": {"type": "string", "description": "The skill's name.", "enum": list(self.skills)},
                "args": {"type": "string", "description": "Optional arguments for the skill."},
            },
            "required": ["skill"],
        }

    def listing(self) -> str:
        """:func:`system_prompt_listing` of the skills this tool offers."""
        return system_prompt_listing(self.skills.values(), tool_name=self.name)

    @property
    def active(self) -> list[AgentSkill]:
        return [a.skill for a in self.activations]

    def active_tools(self) -> list[Any]:
        """Script tools of every skill activated so far (add them to the run's tools)."""
        return [tool for a in self.activations for tool in a.tools]

    def allowed_tools(self) -> set[str] | None:
        """Union of the active skills' ``allowed-tools``; None when none of them restricts."""
        return allowed_tool_names(self.active)

    def filter_tools(self, tools: Sequence[Any]) -> list[Any]:
        """The tools to offer the model now: ``tools`` as the active skills allow, plus the
        active skills' script tools, plus this Skill tool itself (always)."""
        extra = self.active_tools()
        return filter_tools([*tools, *extra], self.allowed_tools(), always=[self, *extra])

    def call(self, arguments: dict[str, Any] | None = None) -> str:
        """Activate a skill; returns its instructions as text for the model. Never raises."""
        arguments = arguments or {}
        requested = str(arguments.get("skill") or arguments.get("name") or "").strip()
        args = "" if arguments.get("args") is None else str(arguments.get("args"))
        skill = self.skills.get(requested)
        if skill is None:
            folded = requested.lower().replace("_", "-")
            skill = next((s for n, s in self.skills.items() if n.lower().replace("_", "-") == folded), None)
        if skill is None:
            available = ", ".join(self.skills) or "none"
            return f"Error ({self.name}): unknown skill {requested!r}. Available skills: {available}"
        with self._lock:
            if any(a.skill is skill for a in self.activations):
                return f"Skill '{skill.name}' is already active; its instructions are above."
            try:
                instructions = skill.instructions
                tools = skill.script_tools(self.ceiling, sandbox=self.sandbox)
            except Exception as exc:
                log.warning("skills.activation_failed", skill=skill.name, error=f"{type(exc).__name__}: {exc}")
                return f"Error ({self.name}): skill {skill.name!r} could not be loaded: {exc}"
            activation = Activation(skill=skill, args=args, tools=tools)
            self.activations.append(activation)
        log.info("skills.activated", skill=skill.name, tools=[t.name for t in tools])
        if self.on_activate is not None:
            try:
                self.on_activate(activation)
            except Exception as exc:
                log.warning("skills.on_activate_failed", skill=skill.name, error=f"{type(exc).__name__}: {exc}")
        return self.activation_text(activation, instructions)

    __call__ = call

    def activation_text(self, activation: Activation, instructions: str) -> str:
        skill = activation.skill
        # a body (or arguments) holding "</skill>" must not close the wrapper early
        parts = [f'<skill name="{skill.name}">', f"# Skill activated: {skill.name}", "", _escape(instructions), ""]
        parts.append(f"Arguments: {_escape(activation.args) if activation.args else '(none)'}")
        parts.append(f"Skill folder (read-only, on PYTHONPATH for run_command): {os.path.realpath(skill.path)}")
        if activation.tools:
            tools = "; ".join(f"{t.name} ({t.description})" for t in activation.tools)
            parts.append(f"Tools added by this skill: {tools}")
        if skill.allowed_tools is not None:
            parts.append(f"While this skill is active you may use only: {', '.join(skill.allowed_tools) or 'no tools'}"
                         + (" plus the skill's own tools" if activation.tools else ""))
        parts.append("</skill>")
        return "\n".join(parts)

    def restore(self, names: Iterable[str]) -> None:
        """Activate ``names`` silently (skills the conversation activated in earlier runs:
        their instructions are already in its history, their tools must be offered again)."""
        for name in names:
            skill = self.skills.get(name)
            if skill is None or any(a.skill is skill for a in self.activations):
                continue
            try:
                tools = skill.script_tools(self.ceiling, sandbox=self.sandbox)
            except Exception as exc:
                log.warning("skills.activation_failed", skill=skill.name, error=f"{type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self.activations.append(Activation(skill=skill, args="", tools=tools))

    def reset(self) -> None:
        with self._lock:
            self.activations.clear()

    def __repr__(self) -> str:
        return f"<SkillTool {list(self.skills)}>"
