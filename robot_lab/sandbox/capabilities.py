"""What a skill's scripts may read, write, reach, see and how long they may run.

A skill *asks* in its ``SKILL.md`` front matter; the operator's settings are the *ceiling*
(``settings.sandbox`` for every skill, widened per skill by ``settings.skills.grants`` and
``settings.skills.core_trusted``); the effective grant is :meth:`Capabilities.intersect`:
a path survives only when it is a ceiling root or lives beneath one, network only when both
allow it, the smaller timeout, ``trust: core`` only when the ceiling names the skill, and
host variables (``env: [NAME]``, ``secrets``) only when the ceiling lists the name.

Every value is normalised on construction, so a malformed ``SKILL.md`` degrades to the
safe default (no paths, no network, 60 s, ``external``) instead of raising.

Beyond robot_lab (which trusted ``SKILL.md``): trust, env and secrets are requests the
operator must grant, and paths are compared after ``realpath`` as well as
``expanduser``/``abspath``, so a symlink under a ceiling root cannot lead outside it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from robot_lab.settings import get_settings

DEFAULT_TIMEOUT = 60.0
TRUST_LEVELS = ("core", "external")
# Names a skill can never set: they would let a script redirect the loader or the shell.
_FORBIDDEN_ENV = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP", "BASH_ENV", "ENV"})


def _paths(value: Any) -> tuple[str, ...]:
    if value is None or value is False:
        return ()
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if not isinstance(value, Iterable):
        return (str(value),)
    return tuple(str(item) for item in value if item is not None and str(item).strip())


def _timeout(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT
    if not math.isfinite(number) or number <= 0:
        return DEFAULT_TIMEOUT
    return number


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on", "y"}
    return bool(value)


def _env(value: Any) -> dict[str, str | None]:
    """``env:`` as a list of names (passed through from the parent) or a name -> value map."""
    result: dict[str, str | None] = {}
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((name, None) for name in value)
    elif isinstance(value, str):
        items = ((name, None) for name in value.split())
    else:
        return result
    for name, val in items:
        name = str(name).strip()
        if not name or name in _FORBIDDEN_ENV or "=" in name:
            continue
        result[name] = None if val is None else str(val)
    return result


def expand_path(path: str, *, base: str | None = None) -> str:
    """``~`` and relative paths resolved (relative to ``base`` or the cwd), symlinks followed."""
    expanded = os.path.expanduser(path)
    if not os.path.isabs(expanded):
        expanded = os.path.join(base or os.getcwd(), expanded)
    return os.path.realpath(expanded)


def is_under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it (both already expanded)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A declared (or granted) set of permissions for a skill's scripts."""

    fs_read: tuple[str, ...] = ()
    fs_write: tuple[str, ...] = ()
    network: bool = False
    timeout: float = DEFAULT_TIMEOUT
    trust: str = "external"
    env: Mapping[str, str | None] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fs_read", _paths(self.fs_read))
        object.__setattr__(self, "fs_write", _paths(self.fs_write))
        object.__setattr__(self, "network", _truthy(self.network))
        object.__setattr__(self, "timeout", _timeout(self.timeout))
        trust = str(self.trust).strip().lower() if self.trust is not None else "external"
        object.__setattr__(self, "trust", trust if trust in TRUST_LEVELS else "external")
        object.__setattr__(self, "env", _env(self.env))
        secrets = tuple(n for n in _env(list(_paths(self.secrets))) if n not in self.env)
        object.__setattr__(self, "secrets", secrets)

    @classmethod
    def from_front_matter(cls, front_matter: Mapping[str, Any] | None) -> Capabilities:
        """Build from a parsed front matter (missing keys take the safe defaults)."""
        fm = front_matter or {}
        return cls(
            fs_read=fm.get("fs_read"),
            fs_write=fm.get("fs_write"),
            network=fm.get("network", False),
            timeout=fm.get("timeout", DEFAULT_TIMEOUT),
            trust=fm.get("trust", "external"),
            env=fm.get("env") or {},
            secrets=fm.get("secrets") or (),
        )

    @classmethod
    def ceiling(cls, sandbox: Any = None, *, skill: str | None = None, skills: Any = None) -> Capabilities:
        """The most a skill may get: ``settings.sandbox`` (or the given SandboxSettings),
        widened for the skill named ``skill`` by ``skills.grants[skill]`` and, when
        ``skills.core_trusted`` names it, core trust (``skills``: SkillsSettings, default
        the process settings). Without ``skill``: the global ceiling (never core).
        """
        if sandbox is None or (skill is not None and skills is None):
            sandbox = get_settings().sandbox if sandbox is None else sandbox
            skills = get_settings().skills if skills is None else skills
        grant = (getattr(skills, "grants", None) or {}).get(skill) if skill is not None else None
        core = skill is not None and skill in (getattr(skills, "core_trusted", None) or ())

        def more(name: str) -> list[Any]:
            return [*getattr(sandbox, name, ()), *(getattr(grant, name, ()) if grant is not None else ())]

        return cls(
            fs_read=more("fs_read"),
            fs_write=more("fs_write"),
            network=bool(sandbox.network or (grant is not None and grant.network)),
            timeout=sandbox.timeout,
            trust="core" if core else "external",
            env=more("env"),
            secrets=more("secrets"),
        )

    @property
    def core(self) -> bool:
        """``trust: core`` skills run unconfined; reserve it for bundles you wrote and audited."""
        return self.trust == "core"

    def intersect(self, ceiling: Capabilities) -> Capabilities:
        """The effective grant: asked ∩ ceiling (paths come back expanded).

        ``env: {NAME: value}`` literals carry nothing of the host and are kept; a name to
        pass through from the host is kept only when the ceiling's ``env`` lists it, a secret
        only when its ``secrets`` does; core trust only when the ceiling has it too.
        """
        read_roots = [expand_path(p) for p in ceiling.fs_read]
        write_roots = [expand_path(p) for p in ceiling.fs_write]

        def keep(paths: tuple[str, ...], roots: list[str]) -> tuple[str, ...]:
            kept: list[str] = []
            for path in paths:
                full = expand_path(path)
                if any(is_under(full, root) for root in roots) and full not in kept:
                    kept.append(full)
            return tuple(kept)

        return replace(
            self,
            fs_read=keep(self.fs_read, read_roots),
            fs_write=keep(self.fs_write, write_roots),
            network=self.network and ceiling.network,
            timeout=min(self.timeout, ceiling.timeout),
            trust="core" if self.core and ceiling.core else "external",
            env={n: v for n, v in self.env.items() if v is not None or n in ceiling.env},
            secrets=tuple(n for n in self.secrets if n in ceiling.secrets),
        )

    def with_timeout_cap(self, cap: float | None) -> Capabilities:
        """The same grant with its timeout bounded by ``cap`` (None or 0: unbounded)."""
        if cap is None or cap <= 0:
            return self
        return replace(self, timeout=min(self.timeout, float(cap)))

    def denied(self, grant: Capabilities) -> dict[str, Any]:
        """What was asked for but not granted (for warnings and ``skills show``)."""
        expanded_read = {expand_path(p) for p in self.fs_read}
        expanded_write = {expand_path(p) for p in self.fs_write}
        result: dict[str, Any] = {}
        if lost := sorted(expanded_read - set(grant.fs_read)):
            result["fs_read"] = lost
        if lost := sorted(expanded_write - set(grant.fs_write)):
            result["fs_write"] = lost
        if self.network and not grant.network:
            result["network"] = True
        if self.core and not grant.core:
            result["trust"] = "core"
        if lost := sorted(set(self.env) - set(grant.env)):
            result["env"] = lost
        if lost := sorted(set(self.secrets) - set(grant.secrets)):
            result["secrets"] = lost
        return result
