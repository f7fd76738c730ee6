"""The skill catalog: every bundle under several roots, scanned once, lazily, thread-safely.

Roots, in priority order (the first root that defines a name wins; later duplicates are
skipped with a warning naming both bundles):

1. ``~/.prompts/skills`` — the Ruby gem's root (``user``);
2. ``./.robot_lab/skills`` — the project's root (``project``);
3. ``settings.skills.roots`` (``settings``);
4. skill packages registered under the entry-point group ``robot_lab.skills``
   (``entry-point:<name>``). The entry point may name a path string, a ``Path``, a module
   (its ``skills/`` sub-folder if it has one, else its own folder), or a callable
   returning one path or a list of paths.

A missing root is an empty root. A directory without ``SKILL.md`` is skipped silently, unless
it has a lowercase ``skill.md`` (which skills-ref accepts): that one is skipped as a problem
saying to rename it, so it never vanishes from ``skills list`` unexplained. A
bad bundle is skipped with a warning naming it (and kept in :attr:`SkillCatalog.problems`),
and never stops the others. ``find(name)`` looks up the front-matter name, then the same
name with ``_``/``-`` and case folded (``find("check_style")`` finds ``check-style``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.skills.skill import SKILL_FILE, AgentSkill, lowercase_hint

log = get_logger("robot_lab.skills.catalog")

ENTRY_POINT_GROUP = "robot_lab.skills"
USER_ROOT = "~/.prompts/skills"
PROJECT_ROOT = ".robot_lab/skills"


@dataclass(frozen=True, slots=True)
class Root:
    """A folder of skill bundles and where it came from."""

    path: Path
    label: str


@dataclass(frozen=True, slots=True)
class Problem:
    """A bundle that did not load, or a duplicate that lost to an earlier root."""

    path: Path
    message: str


def _fold(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _paths_from(value: Any) -> list[Path]:
    if callable(value) and not isinstance(value, ModuleType):
        value = value()
    if isinstance(value, ModuleType):
        files = getattr(value, "__file__", None)
        if files is None and getattr(value, "__path__", None):
            base = Path(list(value.__path__)[0])
        elif files is not None:
            base = Path(files).parent
        else:
            return []
        return [base / "skills" if (base / "skills").is_dir() else base]
    if isinstance(value, (str, os.PathLike)):
        return [Path(value)]
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in _paths_from(item)]
    raise ConfigurationError(f"expected a path, a module or a list of paths, got {type(value).__name__}")


def entry_point_roots(group: str = ENTRY_POINT_GROUP) -> list[Root]:
    """Roots contributed by installed packages; a broken entry point is warned and skipped."""
    roots: list[Root] = []
    for ep in metadata.entry_points(group=group):
        try:
            for path in _paths_from(ep.load()):
                roots.append(Root(Path(path).expanduser(), f"entry-point:{ep.name}"))
        except Exception as exc:
            log.warning("skills.entry_point_failed", entry_point=f"{ep.name} = {ep.value}",
                        error=f"{type(exc).__name__}: {exc}")
    return roots


def _bundles_in(folder: Path) -> int:
    """How many bundles (``<child>/SKILL.md``) a folder holds."""
    try:
        return sum(1 for child in folder.iterdir() if child.is_dir() and (child / SKILL_FILE).exists())
    except OSError:
        return 0


def default_roots(settings: Any = None, *, entry_points: bool = True) -> list[Root]:
    """The standard root order (see the module docstring)."""
    if settings is None:
        settings = get_settings()
    roots = [
        Root(Path(USER_ROOT).expanduser(), "user"),
        Root(Path.cwd() / PROJECT_ROOT, "project"),
        *(Root(Path(p).expanduser(), "settings") for p in settings.skills.roots),
    ]
    if entry_points:
        roots += entry_point_roots()
    return roots


class SkillCatalog:
    """Registry of the skills under some roots. Construction does no I/O."""

    def __init__(
        self,
        roots: Sequence[str | os.PathLike[str] | Root] | None = None,
        *,
        settings: Any = None,
        entry_points: bool = True,
    ) -> None:
        self._given_roots = roots
        self._settings = settings
        self._entry_points = entry_points
        self._lock = threading.Lock()
        self._loaded = False
        self._skills: dict[str, AgentSkill] = {}
        self._folded: dict[str, AgentSkill] = {}
        self.roots: list[Root] = []
        self.problems: list[Problem] = []
        # dot-folders of a root that hold bundles (not scanned): (folder, number of bundles)
        self.hidden: list[tuple[Path, int]] = []

    # --- scanning ------------------------------------------------------------------------
    def _resolve_roots(self) -> list[Root]:
        if self._given_roots is None:
            return default_roots(self._settings, entry_points=self._entry_points)
        roots = []
        for item in self._given_roots:
            roots.append(item if isinstance(item, Root) else Root(Path(item).expanduser(), "given"))
        return roots

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._scan()
            self._loaded = True

    def _scan(self) -> None:
        skills: dict[str, AgentSkill] = {}
        problems: list[Problem] = []
        hidden: list[tuple[Path, int]] = []
        roots = self._resolve_roots()
        for root in roots:
            if not root.path.is_dir():
                continue
            try:
                entries = sorted(root.path.iterdir())
            except OSError as exc:
                log.warning("skills.root_unreadable", root=str(root.path), error=str(exc))
                continue
            for entry in entries:
                if entry.name.startswith(".") and entry.is_dir():
                    count = _bundles_in(entry)
                    if count:  # openai/skills keeps its bundles in skills/.curated, .system ...
                        hidden.append((entry, count))
                    continue
                if entry.name.startswith(".") or not entry.is_dir():
                    continue
                if not (entry / SKILL_FILE).exists() and not (entry / SKILL_FILE).is_symlink():
                    hint = lowercase_hint(entry)
                    if hint:
                        problems.append(Problem(entry, f"{entry}: no {SKILL_FILE}{hint}"))
                        log.warning("skills.bundle_skipped", bundle=str(entry), root=root.label, error=hint[2:])
                    continue
                try:
                    skill = AgentSkill(entry, root=root.label, settings=self._settings, root_path=root.path)
                except ConfigurationError as exc:
                    problems.append(Problem(entry, str(exc)))
                    log.warning("skills.bundle_skipped", bundle=str(entry), root=root.label, error=str(exc))
                    continue
                except Exception as exc:  # an unexpected failure still must not stop the catalog
                    message = f"{entry}: {type(exc).__name__}: {exc}"
                    problems.append(Problem(entry, message))
                    log.warning("skills.bundle_skipped", bundle=str(entry), root=root.label, error=message)
                    continue
                earlier = skills.get(skill.name)
                if earlier is not None:
                    message = (f"duplicate skill name {skill.name!r}: {skill.path} ({root.label}) is shadowed by "
                               f"{earlier.path} ({earlier.root})")
                    problems.append(Problem(entry, message))
                    log.warning("skills.duplicate", skill=skill.name, kept=str(earlier.path), skipped=str(skill.path))
                    continue
                skills[skill.name] = skill
        self.roots = roots
        self._skills = skills
        self._folded = {}
        for skill in skills.values():
            self._folded.setdefault(_fold(skill.name), skill)
        self.problems = problems
        self.hidden = hidden
        log.debug("skills.scanned", count=len(skills), skipped=len(problems), roots=[str(r.path) for r in roots])

    def reload(self) -> None:
        """Scan again (robot_lab never rescans; here ``skills list`` and tests may)."""
        with self._lock:
            self._scan()
            self._loaded = True

    # --- lookup ----------------------------------------------------------------------------
    def all(self) -> list[AgentSkill]:
        self._ensure_loaded()
        return list(self._skills.values())

    def names(self) -> list[str]:
        self._ensure_loaded()
        return list(self._skills)

    def find(self, name: str) -> AgentSkill | None:
        """The skill whose front-matter name is ``name`` (then hyphen/underscore/case-folded)."""
        self._ensure_loaded()
        name = str(name)
        return self._skills.get(name) or self._folded.get(_fold(name))

    def get(self, name: str) -> AgentSkill:
        """Like :meth:`find` but raises ConfigurationError listing what exists."""
        skill = self.find(name)
        if skill is None:
            available = ", ".join(sorted(self.names())) or "none"
            raise ConfigurationError(f"no skill named {name!r} (available: {available})")
        return skill

    def select(self, names: Sequence[str]) -> list[AgentSkill]:
        """The AgentSkills among ``names`` in that order; other names (template skills) are ignored."""
        found: list[AgentSkill] = []
        for name in names:
            skill = self.find(name)
            if skill is not None and skill not in found:
                found.append(skill)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[AgentSkill]:
        return iter(self.all())

    def __len__(self) -> int:
        return len(self.all())


_default: SkillCatalog | None = None
_default_settings: Any = None
_default_lock = threading.Lock()


def default_catalog() -> SkillCatalog:
    """The process-wide catalog over :func:`default_roots` (the Ruby gem's ``instance``).
    Rebuilt when the process's settings object is replaced (``configure``,
    ``reload_settings``), so new ``skills.roots`` take effect instead of a stale scan."""
    global _default, _default_settings

    settings = get_settings()
    with _default_lock:
        if _default is None or _default_settings is not settings:
            _default = SkillCatalog(settings=settings)
            _default_settings = settings
        return _default


def reset_default_catalog() -> None:
    """Forget the process-wide catalog (the Ruby gem's ``reset!``); the next use rescans."""
    global _default, _default_settings
    with _default_lock:
        _default = None
        _default_settings = None
