"""Per-run skill matching (the Ruby gem's ``AgentSkillMatching``), without touching the Robot.

The Robot asks :meth:`SkillMatcher.prepare` for the skills that match this run's message
and gets back a :class:`SkillInjection`: the instructions to prepend to the system prompt
and the script tools to add *for this run only*. Restoring afterwards (even on error) is
the Robot's job; see docs/skills.md, "Integration with Robot".

Matching is cosine similarity between the message's *query* embedding and each
description's *passage* embedding (computed once, cached in-process and in Redis by content
hash). An embedding failure on the message is logged and yields no skills: the run goes on.

Which scores match is a per-model :class:`~robot_lab.settings.MatchRule` (calibrated on the
labelled prompts, see docs/skills.md): the best-scoring skill
when it reaches the rule's ``floor``, plus any other within ``margin`` of it. Real
descriptions are long and score a right skill anywhere from 0.1 to 0.65, so one fixed
threshold either misses most right skills or lets wrong ones in; the best-plus-margin rule
follows the ranking, which is right far more often. An explicit ``threshold=`` keeps the
first rule: every skill at or above it. In a conversation, :func:`select` keeps the skills
already chosen until another beats them by ``switch_margin``.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robot_lab.connection import get_redis
from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.settings import DEFAULT_MATCH_RULES, MatchRule, get_settings
from robot_lab.sandbox.capabilities import Capabilities
from robot_lab.skills.embedding import Embedder, EmbeddingCache, load_embedder
from robot_lab.skills.skill import AgentSkill
from robot_lab.sandbox.workspace_tools import expand_allowed

log = get_logger("robot_lab.skills.matching")


def _text(message: Any) -> str:
    if message is None:
        return ""
    if isinstance(message, str):
        return message
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    return str(message if content is None else content)


def compose_system_prompt(base: str | None, skills: Iterable[AgentSkill]) -> str:
    """Matched instructions first (``"\\n\\n"``-joined, in skill order), then the base prompt."""
    parts = [s.instructions for s in skills if s.instructions]
    if base:
        parts.append(base)
    return "\n\n".join(parts)


def allowed_tool_names(skills: Iterable[AgentSkill]) -> set[str] | None:
    """The union of ``allowed-tools`` of the skills that declare it; None when none restricts."""
    allowed: set[str] | None = None
    for skill in skills:
        if skill.allowed_tools is not None:
            allowed = (allowed or set()) | set(skill.allowed_tools)
    return allowed


def filter_tools(tools: Sequence[Any], allowed: set[str] | None, *, always: Iterable[Any] = ()) -> list[Any]:
    """``tools`` restricted to ``allowed`` names (``fnmatch`` patterns), plus ``always``."""
    allowed = expand_allowed(allowed)  # Read, Bash... stand for the workspace tools
    keep = list(always)
    keep_ids = {id(t) for t in keep}
    for tool in tools:
        if id(tool) in keep_ids:
            continue
        if allowed is None or any(fnmatch.fnmatchcase(tool.name, pattern) for pattern in allowed):
            keep.append(tool)
    return keep


_SENTENCE_RE = re.compile(r"(?<=[.;:!?])\s+|\n+|\s+-\s+|,\s+(?=(?:or|and|also|use|when)\b)")


def description_sentences(text: str) -> list[str]:
    """A description cut into its sentences and trigger phrases ("Use when ...; also when
    ..."), at least two words each; the whole text when it has no such parts."""
    parts = [p.strip(" -\u2022\"'") for p in _SENTENCE_RE.split(text) if p and p.strip()]
    return [p for p in parts if len(p.split()) >= 2] or [text]


def cap_selected(matched: list[AgentSkill], scores: dict[str, float], limit: int) -> list[AgentSkill]:
    """At most ``limit`` skills (``skills.max_selected``): the best-scoring, kept in order.
    Low, close scores otherwise inject many skills' instructions at once."""
    if len(matched) <= limit:
        return matched
    best = {s.name for s in sorted(matched, key=lambda s: -scores.get(s.name, 0.0))[:limit]}
    log.info("skills.capped", matched=[s.name for s in matched], kept=sorted(best), max_selected=limit)
    return [s for s in matched if s.name in best]


def select(
    scored: Sequence[tuple[AgentSkill, float]], rule: MatchRule, current: Sequence[str] = ()
) -> list[AgentSkill]:
    """The skills ``rule`` picks from ``scored`` (in ``scored`` order).

    ``current`` names the skills the conversation already uses: they stay unless the best
    new skill reaches the floor and beats every one of them by ``rule.switch_margin``.
    """
    if not scored:
        return []
    best_skill, best = max(scored, key=lambda item: item[1])
    chosen = [s for s, score in scored if score >= rule.floor and score >= best - rule.margin]
    kept = [s for s, _ in scored if s.name in current]
    if not kept:
        return chosen
    kept_best = max(score for s, score in scored if s.name in current)
    if best_skill.name not in current and best >= rule.floor and best >= kept_best + rule.switch_margin:
        return chosen
    return kept


@dataclass
class SkillInjection:
    """What one run gets from its matched skills."""

    skills: list[AgentSkill] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.skills)

    @property
    def instructions(self) -> str:
        return "\n\n".join(s.instructions for s in self.skills if s.instructions)

    def system_prompt(self, base: str | None) -> str:
        """The run's system prompt: matched instructions prepended to ``base``."""
        return compose_system_prompt(base, self.skills)

    @property
    def allowed_tools(self) -> set[str] | None:
        return allowed_tool_names(self.skills)

    def filter_tools(self, tools: Sequence[Any]) -> list[Any]:
        """The robot's tools as these skills allow, plus the skills' own script tools."""
        return filter_tools([*tools, *self.tools], self.allowed_tools, always=self.tools)


class SkillMatcher:
    """Scores skills against a message; thread-safe, one per process is enough.

    Without an explicit ``threshold`` the embedder's match rule applies
    (``settings.skills.match_rules``, else the shipped ``DEFAULT_MATCH_RULES``), else a rule
    whose floor is the embedder's own ``default_threshold`` attribute, else
    ``settings.skills.default_floor``.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        threshold: float | None = None,
        *,
        cache: EmbeddingCache | None = None,
        settings: Any = None,
    ) -> None:
        if settings is None:
            settings = get_settings()
        self.settings = settings
        self._embedder = embedder
        self._threshold = threshold
        self.cache = cache if cache is not None else self._default_cache(settings)
        self._matrices: OrderedDict[tuple[str, tuple[str, ...]], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _default_cache(settings: Any) -> EmbeddingCache:
        if not settings.redis_url:
            return EmbeddingCache()

        return EmbeddingCache(get_redis(settings.redis_url), keys=Keys(prefix=settings.key_prefix),
                              ttl=settings.skills.embedding_cache_ttl)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = load_embedder(self.settings)
        return self._embedder

    @property
    def threshold(self) -> float:
        """The floor of :attr:`rule` (the explicit threshold when one was given)."""
        return self.rule.floor

    @property
    def rule(self) -> MatchRule:
        """This embedder's match rule; an explicit threshold means every skill at or above it."""
        if self._threshold is not None:
            return MatchRule(floor=float(self._threshold), margin=1e9, switch_margin=0.0)
        skills = self.settings.skills
        name = self.embedder.name
        if name in skills.match_rules or name in DEFAULT_MATCH_RULES:
            return skills.rule_for(name)
        return MatchRule(floor=float(getattr(self.embedder, "default_threshold", skills.default_floor)))

    # --- vectors -------------------------------------------------------------------------------
    def passage_matrix(self, skills: Sequence[AgentSkill]) -> np.ndarray:
        """Description vectors of ``skills`` stacked (n, d); memoised per skill set."""
        embedder = self.embedder
        key = (embedder.name, tuple(s.description_digest for s in skills))
        with self._lock:
            matrix = self._matrices.get(key)
            if matrix is not None:
                self._matrices.move_to_end(key)
                return matrix
        descriptions = [s.description for s in skills]
        if embedder.cacheable:
            vectors = self.cache.get_many(embedder.name, descriptions)
            missing = [i for i, v in enumerate(vectors) if v is None]
            if missing:
                fresh = embedder.embed_passages([descriptions[i] for i in missing])
                for i, vec in zip(missing, fresh):
                    vectors[i] = vec
                self.cache.put_many(embedder.name, [descriptions[i] for i in missing], list(fresh))
            matrix = np.stack(vectors).astype(np.float32) if vectors else np.zeros((0, 0), np.float32)
        else:
            matrix = embedder.embed_passages(descriptions)
        with self._lock:
            self._matrices[key] = matrix
            while len(self._matrices) > 64:
                self._matrices.popitem(last=False)
        return matrix

    def sentence_matrix(self, skills: Sequence[AgentSkill]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of every skill's description sentences stacked (m, d), and where each
        skill's rows start; memoised and cached like the description vectors."""
        embedder = self.embedder
        key = (f"{embedder.name}#sentences", tuple(s.description_digest for s in skills))
        with self._lock:
            hit = self._matrices.get(key)
            if hit is not None:
                self._matrices.move_to_end(key)
                return hit  # type: ignore[return-value]
        parts = [description_sentences(s.description) for s in skills]
        flat = [p for group in parts for p in group]
        if embedder.cacheable:
            vectors = self.cache.get_many(embedder.name, flat)
            missing = [i for i, v in enumerate(vectors) if v is None]
            if missing:
                fresh = embedder.embed_passages([flat[i] for i in missing])
                for i, vec in zip(missing, fresh):
                    vectors[i] = vec
                self.cache.put_many(embedder.name, [flat[i] for i in missing], list(fresh))
            matrix = np.stack(vectors).astype(np.float32)
        else:
            matrix = np.asarray(embedder.embed_passages(flat), dtype=np.float32)
        starts = np.cumsum([0, *[len(g) for g in parts[:-1]]]).astype(np.int64)
        with self._lock:
            self._matrices[key] = (matrix, starts)  # type: ignore[assignment]
            while len(self._matrices) > 64:
                self._matrices.popitem(last=False)
        return matrix, starts

    def warm(self, skills: Sequence[AgentSkill]) -> None:
        """Embed the descriptions now (worker start-up) instead of on the first message."""
        if skills:
            self.passage_matrix(list(skills))
            if self.rule.scoring == "blend":
                self.sentence_matrix(list(skills))

    # --- scoring -------------------------------------------------------------------------------
    def scores(self, message: Any, skills: Sequence[AgentSkill]) -> list[tuple[AgentSkill, float]]:
        """Cosine similarity of the message with every skill, in ``skills`` order. May raise."""
        skills = list(skills)
        if not skills:
            return []
        matrix = self.passage_matrix(skills)
        query = self.embedder.embed_query(_text(message))
        if matrix.size == 0 or query.size == 0 or matrix.shape[1] != query.shape[0]:
            return [(s, 0.0) for s in skills]
        sims = matrix @ query
        if self.rule.scoring == "blend":
            sentences, starts = self.sentence_matrix(skills)
            if sentences.size and sentences.shape[1] == query.shape[0]:
                best = np.maximum.reduceat(sentences @ query, starts)
                sims = (sims + best) / 2
        return [(s, float(v)) for s, v in zip(skills, sims)]

    def match(self, message: Any, skills: Sequence[AgentSkill], *, current: Sequence[str] = ()) -> list[AgentSkill]:
        """The skills :attr:`rule` picks, in ``skills`` order; ``current`` are the skills the
        conversation already uses (see :func:`select`). Never raises: an embedding failure
        logs a warning and returns ``current`` (the run goes on)."""
        return self._match(message, skills, current)[0]

    def _match(self, message: Any, skills: Sequence[AgentSkill],
               current: Sequence[str] = ()) -> tuple[list[AgentSkill], dict[str, float]]:
        if not skills:
            return [], {}
        try:
            scored = self.scores(message, skills)
            rule = self.rule
        except Exception as exc:
            log.warning("skills.match_failed", error=f"{type(exc).__name__}: {exc}",
                        note="no new skills matched for this run")
            return [s for s in skills if s.name in current], {}
        matched = select(scored, rule, current)
        scores = {s.name: score for s, score in scored}
        matched = cap_selected(matched, scores, int(getattr(self.settings.skills, "max_selected", 3) or 3))
        if matched:
            log.info("skills.matched", skills=[s.name for s in matched],
                     scores={s.name: round(scores[s.name], 3) for s in matched}, floor=rule.floor,
                     margin=rule.margin, kept=[s.name for s in matched if s.name in current])
        return matched, scores

    def prepare(
        self,
        message: Any,
        skills: Sequence[AgentSkill],
        *,
        ceiling: Capabilities | None = None,
        sandbox: Any = None,
        current: Sequence[str] = (),
    ) -> SkillInjection:
        """Match, then build the run's injection (instructions + script tools). Never raises."""
        matched, scores = self._match(message, skills, current)
        usable: list[AgentSkill] = []
        tools: list[Any] = []
        for skill in matched:
            try:
                skill.instructions  # noqa: B018 - read now, so a vanished file fails here, not mid-run
                tools.extend(skill.script_tools(ceiling, sandbox=sandbox))
            except Exception as exc:
                log.warning("skills.injection_failed", skill=skill.name, error=f"{type(exc).__name__}: {exc}")
                continue
            usable.append(skill)
        return SkillInjection(skills=usable, tools=tools, scores=scores)


_default_matcher: SkillMatcher | None = None
_default_lock = threading.Lock()


def default_matcher() -> SkillMatcher:
    """The process-wide matcher over ``settings.skills`` (embedder loaded on first match)."""
    global _default_matcher
    with _default_lock:
        if _default_matcher is None:
            _default_matcher = SkillMatcher()
        return _default_matcher


def reset_default_matcher() -> None:
    """Forget the process-wide matcher (settings changed, tests)."""
    global _default_matcher
    with _default_lock:
        _default_matcher = None
