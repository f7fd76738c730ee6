"""The system prompt of a robot: templates (main + template skills) with their front
matter, AgentSkills picked from the catalog, run-time context rendering, and the skills
applied to one run (match mode injects instructions, tool mode offers a ``Skill`` tool).

the Ruby gem's precedence is kept: front matter fills only what the constructor left open,
and rendering is deferred to run time when build-time context is incomplete.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.templates import Template, expand_skills, find_template, load_template, template_dirs
from robot_lab.runtime.tools import Tool, as_tool

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

log = get_logger("robot_lab.robot")

FRONT_MATTER_EXTRAS = ("robot_name", "description", "tools", "mcp")


def set_system_message(messages: list[dict[str, Any]], text: str | None) -> None:
    """Replace, insert or drop the leading system message in place."""
    if messages and messages[0].get("role") == "system":
        if text:
            messages[0] = {"role": "system", "content": text}
        else:
            messages.pop(0)
    elif text:
        messages.insert(0, {"role": "system", "content": text})


def system_message(messages: list[dict[str, Any]]) -> str | None:
    if messages and messages[0].get("role") == "system":
        return messages[0]["content"]
    return None


def _unbound(selected: list[Tool]) -> list[Tool]:
    """The workspace tools given by import path among ``selected``: bound per conversation."""
    return [t for t in selected if getattr(getattr(t, "inner", t), "needs_workspace", False)]


class AppliedSkills:
    """The tools one run offers, and what its workspace held when the run began, so that
    :meth:`finish` can list the files the run wrote there (``RobotResult.files``)."""

    def __init__(self, tools: list[Tool] | Callable[[], list[Tool]], workspace: Path | None = None) -> None:
        self.tools = tools
        self.workspace = workspace
        self._before: Any = None
        if workspace is not None:
            from robot_lab.sandbox.workspace import snapshot  # lazy: start-up time

            self._before = snapshot(workspace)

    def finish_may_block(self, result: Any) -> bool:
        """Whether :meth:`finish` reads the workspace (``arun`` then runs it in a thread)."""
        return self.workspace is not None

    def finish(self, result: Any) -> Any:
        """``result`` with the files the run wrote or changed in the workspace."""
        if self.workspace is not None and hasattr(result, "files"):
            from robot_lab.sandbox.workspace import result_files  # lazy: start-up time

            result.files = result_files(self.workspace, self._before)
            result.workspace = str(self.workspace)
        return result


class PromptAssembly:
    """Templates and skills of one robot, and the prompt they render to."""

    def __init__(self, template_dirs: list[Path] | None) -> None:
        self.template_dirs = template_dirs
        self.templates: list[Template] = []
        self.render_deferred = False
        self.agent_skills: list[Any] = []
        self._own_skill_scope: str | None = None  # this robot's own conversation, for skills

    # --- build time ----------------------------------------------------------------------
    def apply_template(self, robot: RobotParts) -> None:
        """Load ``robot``'s template skills and main template; front matter fills what the
        constructor left open (config, name, description, tools, mcp)."""
        names = list(robot.skills)
        main: Template | None = None
        if robot.template:
            main = load_template(robot.template, self.template_dirs)
            names += [s for s in main.skills if s not in names]
        names = self._split_agent_skills(names)
        skill_templates = expand_skills(names, self.template_dirs) if names else []
        self.templates = [*skill_templates, *([main] if main else [])]
        if not self.templates:
            return
        fm_config = RunConfig.cascade(*(RunConfig(t.config) for t in self.templates))
        robot.config = fm_config.merge(robot.config)
        extras: dict[str, Any] = {}
        for t in self.templates:
            extras.update({k: t.metadata[k] for k in FRONT_MATTER_EXTRAS if k in t.metadata})
        if "robot_name" in extras and not robot._name_from_constructor:
            robot.name = str(extras["robot_name"])
        if extras.get("description") and robot.description is None:
            robot.description = str(extras["description"])
        if extras.get("tools") and not len(robot.local_tools):
            for path in [extras["tools"]] if isinstance(extras["tools"], str) else extras["tools"]:
                try:
                    robot.local_tools.add(path).robot = robot
                except ConfigurationError as exc:
                    log.warning("template.tool_skipped", robot=robot.name, tool=path, error=str(exc))
        if extras.get("mcp") and robot.config.mcp is None:
            robot.config = robot.config.merge({"mcp": extras["mcp"]})

    def _split_agent_skills(self, names: list[str]) -> list[str]:
        """AgentSkills (SKILL.md bundles in the catalog) are checked first, as robot_lab
        does; the remaining names are template skills."""
        if not names:
            self.agent_skills = []
            return names
        from robot_lab.skills import default_catalog  # lazy: start-up time

        catalog = default_catalog()
        self.agent_skills = catalog.select(names)
        rest = [n for n in names if catalog.find(n) is None]

        dirs = self.template_dirs if self.template_dirs is not None else template_dirs()
        unknown = [n for n in rest if find_template(n, dirs) is None]
        if unknown:  # a typo in skills=[...] names the skill, not a template search
            known = ", ".join(catalog.names()) or "none"
            raise ConfigurationError(
                f"unknown skill {unknown[0]!r}: no AgentSkill of that name in the catalog (skills: {known}) "
                f"and no template skill {unknown[0]}.md (searched {', '.join(str(d) for d in dirs) or 'no template_path'})")
        return rest

    # --- rendering -----------------------------------------------------------------------
    def render(self, build_context: Mapping[str, Any], system_prompt: str | None,
               run_context: Mapping[str, Any] | None = None) -> str | None:
        """The system prompt: rendered templates then the robot's own ``system_prompt``.
        With incomplete build-time context the templates wait for run time."""
        context = {**build_context, **(run_context or {})}
        rendered: str | None = None
        if self.templates:
            missing = sorted({m for t in self.templates for m in t.missing(context)})
            if missing and run_context is None:
                self.render_deferred = True
            else:
                parts = [t.render(context) for t in self.templates]
                rendered = "\n\n".join(p for p in parts if p) or None
                self.render_deferred = False
        parts = [p for p in (rendered, system_prompt) if p]
        return "\n\n".join(parts) if parts else None

    # --- one run -------------------------------------------------------------------------
    def skills_may_block(self, messages: list[dict[str, Any]], skill_mode: str, message: str | None,
                         selected: list[Tool], *_: Any, **__: Any) -> bool:
        """Whether :meth:`with_agent_skills` (same arguments) opens a skill session (a
        workspace on disk, skill matching): ``arun`` then runs it in a thread; without skills
        or workspace tools it only returns the tools."""
        return bool(self.agent_skills) or bool(_unbound(selected))

    def with_agent_skills(
        self, messages: list[dict[str, Any]], skill_mode: str, message: str | None,
        selected: list[Tool], base_prompt: str | None, *, robot_name: str = "robot",
        scope: str | None = None, attachments: Iterable[Any] | None = None,
    ) -> AppliedSkills:
        """Apply the AgentSkills for one run; ``robot_lab.skills.session`` does the work.

        ``scope`` is the conversation or network run (else this robot's own conversation):
        its skill session holds the workspace (where ``attachments`` land) and the skills
        that stick. Match mode: matched instructions and the working directory are in the
        prompt, their script tools offered. Tool mode: the prompt lists the skills and a
        ``Skill`` tool activates one, so the offered tools are recomputed every round."""
        unbound = _unbound(selected)
        if not self.agent_skills and not unbound:
            if attachments:
                log.warning("robot.attachments_ignored", robot=robot_name, reason="the robot has no AgentSkills")
            return AppliedSkills(selected)
        from robot_lab.skills import default_catalog  # lazy: start-up time
        from robot_lab.skills.session import session_for  # lazy: start-up time

        if self._own_skill_scope is None:
            self._own_skill_scope = f"robot-{robot_name}-{uuid.uuid4().hex[:12]}"
        session = session_for(robot_name, scope or self._own_skill_scope)
        session.attach(attachments)
        if unbound:  # workspace tools given by import path: bound to this conversation's workspace
            selected = [as_tool(getattr(t, "inner", t).in_workspace(session.workspace.path)) if t in unbound else t
                        for t in selected]
        if not self.agent_skills:
            set_system_message(messages, "\n\n".join(p for p in (base_prompt, session.workspace.prompt()) if p))
            return AppliedSkills(selected, session.workspace.path)
        if skill_mode == "tool":
            run = session.tool_mode_run(self.agent_skills, selected, base_prompt, catalog=default_catalog())
        else:
            run = session.match_run(message, self.agent_skills, selected, base_prompt)
        if run.prompt is not None:
            set_system_message(messages, run.prompt)
        tools = run.tools
        if callable(tools):
            return AppliedSkills(lambda: [as_tool(t) for t in tools()], session.workspace.path)  # type: ignore[operator]
        return AppliedSkills([as_tool(t) for t in tools], session.workspace.path)
