"""What a skill asks for, what the operator's ceiling gives it, and why the rest is denied.

``SKILL.md`` only *asks* (``trust``, ``network``, ``fs_read``/``fs_write``, ``env``,
``secrets``, ``timeout``); :func:`review` intersects the request with the skill's ceiling
(:meth:`Capabilities.ceiling` for its name: ``settings.sandbox`` widened by
``settings.skills.grants[name]`` and ``settings.skills.core_trusted``) and explains each
item, for ``robot-lab skills show`` / ``validate`` and for the warning logged when a skill's
tools are built. The grant it computes is the one the script tools run with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_lab.settings import get_settings
from robot_lab.sandbox.capabilities import Capabilities, expand_path


@dataclass(frozen=True, slots=True)
class Decision:
    """One requested item: ``granted`` or not, and ``reason`` (always set when denied)."""

    key: str
    asked: Any
    granted: bool
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "asked": self.asked, "granted": self.granted, "reason": self.reason}

    def line(self) -> str:
        verdict = "granted" if self.granted else "DENIED"
        return f"{self.key} {self.asked}: {verdict}{f' ({self.reason})' if self.reason else ''}"


@dataclass(frozen=True, slots=True)
class TrustReview:
    """A skill's request, its ceiling, the effective grant and one decision per item."""

    skill: str
    asked: Capabilities
    ceiling: Capabilities
    grant: Capabilities
    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    @property
    def denied(self) -> list[Decision]:
        return [d for d in self.decisions if not d.granted]

    def as_dict(self) -> dict[str, Any]:
        return {"skill": self.skill, "asked": describe(self.asked), "granted": describe(self.grant),
                "decisions": [d.as_dict() for d in self.decisions]}


def describe(caps: Capabilities) -> dict[str, Any]:
    """A capability set as plain data (values of ``env`` are not shown: they may be secrets)."""
    return {"trust": caps.trust, "network": caps.network, "fs_read": list(caps.fs_read),
            "fs_write": list(caps.fs_write), "env": sorted(caps.env), "secrets": list(caps.secrets),
            "timeout": caps.timeout}


def review(skill: str, asked: Capabilities, *, sandbox: Any = None, skills: Any = None,
           timeout_cap: float | None = None) -> TrustReview:
    """Intersect ``asked`` with the ceiling of ``skill`` and explain every item.

    ``sandbox``/``skills``: SandboxSettings/SkillsSettings (default: the process settings,
    read now, so a worker applies its own operator's ceiling). ``timeout_cap``: default
    none: the ceiling's ``sandbox.timeout`` bounds every call.
    """
    if sandbox is None or skills is None:
        sandbox = get_settings().sandbox if sandbox is None else sandbox
        skills = get_settings().skills if skills is None else skills
    ceiling = Capabilities.ceiling(sandbox, skill=skill, skills=skills)
    cap = timeout_cap
    grant = asked.intersect(ceiling).with_timeout_cap(cap)
    grants = f"skills.grants.{skill}"
    decisions: list[Decision] = []
    if asked.core:
        decisions.append(Decision("trust", "core", grant.core, (
            "runs UNCONFINED: host files, network and the worker's whole environment" if grant.core else
            f"{skill!r} is not in skills.core_trusted (ROBOT_LAB_SKILLS__CORE_TRUSTED); runs sandboxed")))
    if asked.network:
        decisions.append(Decision("network", True, grant.network, "" if grant.network else (
            f"sandbox.network is false and {grants}.network is not set")))
    for key in ("fs_read", "fs_write"):
        kept = set(getattr(grant, key))
        roots = list(getattr(ceiling, key))
        for path in getattr(asked, key):
            full = expand_path(path)
            decisions.append(Decision(key, path, full in kept, "" if full in kept else (
                f"not under sandbox.{key} or {grants}.{key} ({', '.join(roots) or 'none'})")))
    for name, value in asked.env.items():
        if value is not None:
            decisions.append(Decision("env", name, True, "a value the skill sets itself, nothing from the host"))
            continue
        ok = name in grant.env
        decisions.append(Decision("env", name, ok, "" if ok else (
            f"not in sandbox.env ({', '.join(ceiling.env) or 'none'}) or {grants}.env")))
    for name in asked.secrets:
        ok = name in grant.secrets
        decisions.append(Decision("secrets", name, ok, "" if ok else (
            f"not in sandbox.secrets or {grants}.secrets")))
    if grant.timeout < asked.timeout:  # shortened, not refused: never an error in validate --strict
        decisions.append(Decision("timeout", asked.timeout, True, (
            f"capped at {grant.timeout:g}s by sandbox.timeout")))
    return TrustReview(skill, asked, ceiling, grant, tuple(decisions))
