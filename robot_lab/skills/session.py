"""One conversation's skills: its workspace, the skills it sticks to, and what each run gets.

The Robot keeps only a pointer to this: :func:`session_for` returns the session of a
(robot, conversation or network run) pair, and :meth:`SkillSession.match_run` /
:meth:`SkillSession.tool_mode_run` give one run its system prompt and tools:

* the matched (or activated) skills' instructions, then the base prompt, then the
  "Working Directory" lines and which bundle files ``read_skill_file`` can open;
* the robot's tools as the skills' ``allowed-tools`` permit, the skills' script tools bound
  to the workspace, ``read_skill_file``, and (tool mode) ``Skill`` — with every name unique
  (:func:`unique_tools`), since a provider rejects two tools of one name.

Sticky skills: match mode re-scores every message, but the skills chosen earlier in the
conversation stay until another skill clearly wins (:func:`robot_lab.skills.matching.select`),
so turn 2 of a PDF task ("now fill it with my address") keeps the pdf skill and its tools.
The chosen names are kept in-process and, with Redis, under ``skill_sticky`` (any worker
continues the conversation).
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from robot_lab.connection import get_redis
from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.skills.file_tool import SkillFileTool, bundle_files
from robot_lab.skills.matching import SkillMatcher, default_matcher, filter_tools
from robot_lab.skills.skill import AgentSkill
from robot_lab.skills.skill_tool import SkillTool
from robot_lab.sandbox.workspace import Workspace
from robot_lab.sandbox.workspace_tools import bundles_prompt, workspace_tools

log = get_logger("robot_lab.skills.session")

STICKY_TTL = 7 * 86_400
_MAX_SESSIONS = 1024


def unique_tools(tools: Iterable[Any]) -> list[Any]:
    """``tools`` with every name unique: the first keeps its name (robot tools come first),
    a later same-named tool is offered as a copy named ``<name>_2``, ``<name>_3``..."""
    seen: set[str] = set()
    out: list[Any] = []
    for tool in tools:
        name = tool.name
        if name in seen:
            n = 2
            while f"{name[:60]}_{n}" in seen:
                n += 1
            renamed = copy.copy(tool)
            renamed.name = f"{name[:60]}_{n}"
            log.warning("skills.tool_renamed", tool=name, offered_as=renamed.name)
            tool, name = renamed, renamed.name
        seen.add(name)
        out.append(tool)
    return out


@dataclass
class TurnSkills:
    """What one run gets: its system prompt, the tools to offer (a list, or a callable
    re-evaluated every round in tool mode) and the skills in play."""

    prompt: str | None
    tools: list[Any] | Callable[[], list[Any]]
    skills: list[AgentSkill] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)


class SkillSession:
    """The skills state of one conversation (or network run) of one robot."""

    def __init__(self, robot: str, scope: str, *, settings: Any = None, redis: Any = None, keys: Any = None) -> None:
        self.robot = robot
        self.scope = scope
        self.settings = settings
        self.redis = redis
        self.keys = keys
        self._workspace: Workspace | None = None
        self._current: list[str] | None = None
        self._lock = threading.Lock()

    # --- workspace ---------------------------------------------------------------------------
    @property
    def workspace(self) -> Workspace:
        if self._workspace is None:
            sandbox = getattr(self.settings, "sandbox", None) if self.settings is not None else None
            self._workspace = Workspace.for_scope(self.scope, settings=self.settings, sandbox=sandbox)
        return self._workspace

    def attach(self, attachments: Iterable[Any] | None) -> list[str]:
        """Put the user's files in the workspace; their paths there."""
        return [str(p) for p in self.workspace.attach_all(attachments)]

    # --- sticky skills -------------------------------------------------------------------------
    @property
    def current(self) -> list[str]:
        """The skills the conversation uses. With Redis it is read on every run (one GET),
        since another worker may have moved the conversation on meanwhile."""
        if self._current is None or self.redis is not None:
            self._current = self._load_current()
        return list(self._current)

    def _load_current(self) -> list[str]:
        if self.redis is None:
            return []
        try:
            raw = self.redis.get(self.keys.skill_sticky(self.robot, self.scope))
            return [str(n) for n in json.loads(raw)] if raw else []
        except Exception as exc:
            log.warning("skills.sticky_read_failed", error=f"{type(exc).__name__}: {exc}")
            return []

    def _save_current(self, names: list[str]) -> None:
        changed = names != self._current
        self._current = list(names)
        if self.redis is None or not changed:
            return
        try:
            self.redis.set(self.keys.skill_sticky(self.robot, self.scope), json.dumps(names), ex=STICKY_TTL)
        except Exception as exc:
            log.warning("skills.sticky_write_failed", error=f"{type(exc).__name__}: {exc}")

    # --- one run ---------------------------------------------------------------------------------
    def _prompt(self, instructions: str, base: str | None, skills: Sequence[AgentSkill]) -> str:
        parts = [p for p in (instructions, base) if p]
        if skills or self.workspace.files():
            parts.append(self.workspace.prompt())
        if skills and self._workspace_tools_on():
            parts.append(bundles_prompt(skills))
        if skills:
            readable = [f"{s.name}: {', '.join(files)}" for s in skills if (files := bundle_files(s))]
            if readable:
                parts.append("Skill files you can open with read_skill_file: " + "; ".join(readable))
        return "\n\n".join(parts)

    def _skill_tools(self, skills: Sequence[AgentSkill], tools: Sequence[Any]) -> list[Any]:
        bound = [t.in_workspace(self.workspace.path) if hasattr(t, "in_workspace") else t for t in tools]
        return [*bound, SkillFileTool(list(skills))] if skills else bound

    def _workspace_tools_on(self) -> bool:
        skills = getattr(self.settings, "skills", None)
        return bool(getattr(skills, "workspace_tools", True))

    def _workspace_tools(self, skills: Sequence[AgentSkill]) -> list[Any]:
        """read_file, write_file, list_files, run_command over the workspace, the skills'
        bundles mounted read-only (``skills.workspace_tools = false``: none)."""
        if not self._workspace_tools_on():
            return []
        sandbox = getattr(self.settings, "sandbox", None)
        return workspace_tools(self.workspace.path, [s.path for s in skills], sandbox=sandbox, settings=self.settings)

    def match_run(
        self,
        message: Any,
        skills: Sequence[AgentSkill],
        robot_tools: Sequence[Any],
        base_prompt: str | None,
        *,
        matcher: SkillMatcher | None = None,
        ceiling: Any = None,
        sandbox: Any = None,
    ) -> TurnSkills:
        """Match mode: the skills this message (and the conversation so far) calls for."""
        matcher = matcher or default_matcher()
        with self._lock:
            injection = matcher.prepare(message or "", skills, ceiling=ceiling, sandbox=sandbox, current=self.current)
            self._save_current([s.name for s in injection.skills])
        if not injection:
            if self.workspace.files():  # the user's files are listed (and reachable) all the same
                return TurnSkills(prompt=self._prompt("", base_prompt, []), scores=injection.scores,
                                 tools=unique_tools([*robot_tools, *self._workspace_tools([])]))
            return TurnSkills(prompt=None, tools=list(robot_tools), scores=injection.scores)
        robot_part = filter_tools([*robot_tools, *self._workspace_tools(injection.skills)], injection.allowed_tools)
        offered = unique_tools([*robot_part, *self._skill_tools(injection.skills, injection.tools)])
        return TurnSkills(prompt=self._prompt(injection.instructions, base_prompt, injection.skills),
                         tools=offered, skills=list(injection.skills), scores=injection.scores)

    def tool_mode_run(
        self,
        skills: Sequence[AgentSkill],
        robot_tools: Sequence[Any],
        base_prompt: str | None,
        *,
        catalog: Any = None,
        ceiling: Any = None,
        sandbox: Any = None,
    ) -> TurnSkills:
        """Tool mode: the prompt lists the skills; ``Skill`` activates one (tools recomputed
        every round, the workspace and ``read_skill_file`` following the activations)."""
        skill_tool = SkillTool(list(skills) if catalog is None else catalog, [s.name for s in skills],
                               ceiling=ceiling, sandbox=sandbox,
                               on_activate=lambda _: self._save_current([s.name for s in skill_tool.active]))
        skill_tool.restore(self.current)  # skills activated earlier in the conversation stay active
        prompt = "\n\n".join(p for p in (base_prompt, skill_tool.listing(), self.workspace.prompt()) if p)

        def offered() -> list[Any]:
            active = skill_tool.active
            extra = self._skill_tools(active, skill_tool.active_tools())
            offered_robot = [*robot_tools, *self._workspace_tools(active)] if active else list(robot_tools)
            robot_part = filter_tools(offered_robot, skill_tool.allowed_tools())
            return unique_tools([skill_tool, *robot_part, *extra])

        return TurnSkills(prompt=prompt, tools=offered, skills=list(skills))


_sessions: OrderedDict[tuple[str, str], SkillSession] = OrderedDict()
_sessions_lock = threading.Lock()


def session_for(robot: str, scope: str | None, *, settings: Any = None) -> SkillSession:
    """The session of ``(robot, scope)``; ``scope`` None gets a fresh one-run scope.

    Kept in-process (LRU); with ``REDIS_URL`` the sticky skills also live in Redis.
    """
    if scope is None:
        scope = f"run-{uuid.uuid4().hex}"
    key = (robot, scope)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is not None:
            _sessions.move_to_end(key)
            return session
    if settings is None:
        settings = get_settings()
    redis = keys = None
    if settings.redis_url:

        redis, keys = get_redis(settings.redis_url), Keys(prefix=settings.key_prefix, cluster=settings.cluster_keys)
    session = SkillSession(robot, scope, settings=settings, redis=redis, keys=keys)
    with _sessions_lock:
        session = _sessions.setdefault(key, session)
        while len(_sessions) > _MAX_SESSIONS:
            _sessions.popitem(last=False)
    return session


def reset_sessions() -> None:
    with _sessions_lock:
        _sessions.clear()


__all__ = ["TurnSkills", "SkillSession", "reset_sessions", "session_for", "unique_tools"]
