"""AgentSkill: one ``SKILL.md`` bundle (front matter + Markdown body, optional ``scripts/``,
``references/``, ``assets/``), loaded leniently.

Construction reads only the front matter. ``name`` and ``description`` are required
(ConfigurationError naming the file otherwise); everything else is kept as is, unknown keys
included (``front_matter``). The agentskills.io rules (name 1-64 lowercase letters, digits
and hyphens equal to the directory name; description <= 1024; compatibility <= 500; the
allowed keys) become ``warnings`` here and errors only in ``robot-lab skills validate
--strict`` (:func:`validate`).

``instructions`` and ``scripts`` are read on first use. Files that resolve outside the
skill directory (symlinks) are refused: ``SKILL.md`` with an error, a script with a warning.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.sandbox.capabilities import Capabilities
from robot_lab.skills.skill_file import SkillHead, read_body, read_head
from robot_lab.skills.script_tool import ScriptPlan, ScriptTool, plan_script
from robot_lab.sandbox.trust import TrustReview, review

log = get_logger("robot_lab.skills")

SKILL_FILE = "SKILL.md"
# skills-ref (the reference validator) also accepts this name; robot-lab loads only SKILL_FILE
# and names a bundle that has only this one as skipped, so it never vanishes silently.
LOWERCASE_SKILL_FILE = "skill.md"
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
# agentskills.io keys, then robot-lab's capability keys (documented in docs/skills.md).
SPEC_KEYS = frozenset({"name", "description", "license", "compatibility", "metadata", "allowed-tools"})
ROBOT_LAB_KEYS = frozenset({"fs_read", "fs_write", "network", "timeout", "trust", "env", "secrets"})
KNOWN_KEYS = SPEC_KEYS | ROBOT_LAB_KEYS
_IGNORED_SCRIPT_NAMES = frozenset({"__init__.py"})
_IGNORED_SCRIPT_SUFFIXES = frozenset({".pyc", ".pyo", ".md", ".txt", ".json", ".yaml", ".yml", ".lock"})


@dataclass(frozen=True, slots=True)
class Issue:
    """A rule a bundle breaks: ``level`` is "error" (never loads) or "warning" (strict only)."""

    level: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _allowed_tools(value: Any) -> tuple[str, ...] | None:
    """``allowed-tools`` as a list or a space/comma separated string; ``Bash(git:*)`` -> ``Bash``."""
    if value is None:
        return None
    items = value.replace(",", " ").split() if isinstance(value, str) else [str(v) for v in value]
    return tuple(dict.fromkeys(item.split("(", 1)[0].strip() for item in items if item.strip()))


def _settings(settings: Any) -> Any:
    if settings is None:
        return get_settings().skills
    return getattr(settings, "skills", settings)


class AgentSkill:
    """One skill bundle. ``AgentSkill(path)`` takes the skill directory or its ``SKILL.md``."""

    def __init__(self, path: str | os.PathLike[str], *, root: str | None = None, settings: Any = None,
                 root_path: str | os.PathLike[str] | None = None) -> None:
        given = Path(path).expanduser()
        skill_md = given / SKILL_FILE if given.is_dir() else given
        if not skill_md.exists() and not skill_md.is_symlink():
            raise ConfigurationError(f"{skill_md}: no {SKILL_FILE} here" + lowercase_hint(skill_md.parent))
        self.path = Path(os.path.realpath(skill_md.parent))  # the skill directory
        self.skill_md = self.path / skill_md.name
        self.root = root
        self.root_path = Path(root_path) if root_path is not None else self.path.parent
        self._given_settings = settings
        real_md = Path(os.path.realpath(self.skill_md))
        if not _inside(real_md, self.path):
            raise ConfigurationError(
                f"{self.skill_md}: is a symlink to {real_md}, outside the skill directory {self.path}; refused"
            )
        if not real_md.is_file():
            raise ConfigurationError(f"{self.skill_md}: not a regular file")
        head: SkillHead = read_head(real_md)
        self._head = head
        fm = head.front_matter
        self.front_matter: dict[str, Any] = fm
        self.name = self._required_text(fm, "name")
        self.description = self._required_text(fm, "description")
        self.license = fm.get("license")
        self.compatibility = fm.get("compatibility")
        self.metadata: Mapping[str, Any] = fm.get("metadata") if isinstance(fm.get("metadata"), Mapping) else {}
        self.allowed_tools: tuple[str, ...] | None = _allowed_tools(fm.get("allowed-tools"))
        self.capabilities = Capabilities.from_front_matter(fm)
        self.extra = {k: v for k, v in fm.items() if k not in KNOWN_KEYS}
        self.description_digest = hashlib.sha256(self.description.encode("utf-8")).hexdigest()
        self.warnings: list[str] = [issue.message for issue in self.spec_issues()]
        # robot-lab's own limits and skipped files: reported, but never spec errors.
        self.notes: list[str] = []
        self._lock = threading.Lock()
        self._instructions: str | None = None
        self._scripts: list[Path] | None = None
        self._scripts_stamp: tuple[int, ...] | None = None
        self._tools_cache: dict[str, tuple[tuple[int, ...], list[ScriptTool]]] = {}
        for message in self.warnings:  # kept on the skill; `skills validate` / `list` say them, once
            log.debug("skill.warning", skill=self.name, path=str(self.skill_md), warning=message)

    @property
    def _skills_settings(self) -> Any:
        """The given settings, else the process's *current* ones (a worker's own operator
        settings decide, even for a skill loaded before they were configured)."""
        return _settings(self._given_settings)

    def review(self, *, sandbox: Any = None) -> TrustReview:
        """What this skill asks for, what the operator's ceiling grants it, and why not the rest."""
        if sandbox is None:
            sandbox = get_settings().sandbox
        return review(self.name, self.capabilities, sandbox=sandbox, skills=self._skills_settings)

    def _required_text(self, fm: Mapping[str, Any], key: str) -> str:
        value = fm.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ConfigurationError(f"{self.skill_md}: front matter is missing '{key}' (required)")
        if not isinstance(value, (str, int, float)):
            raise ConfigurationError(
                f"{self.skill_md}: front matter '{key}' must be text, got {type(value).__name__}"
            )
        return str(value).strip()

    # --- the agentskills.io rules ------------------------------------------------------------
    def spec_issues(self) -> list[Issue]:
        """Everything that breaks the agentskills.io specification (warnings when loading)."""
        issues: list[Issue] = []
        for key in self._head.duplicates:
            issues.append(Issue("warning", f"front-matter key {key!r} is given more than once; "
                                           "the last value is used"))
        name = self.name
        if len(name) > MAX_NAME:
            issues.append(Issue("warning", f"name is {len(name)} characters; the limit is {MAX_NAME}"))
        if not NAME_RE.match(name):
            issues.append(Issue("warning", f"name {name!r} should be lowercase letters, digits and single "
                                           "hyphens, not starting or ending with a hyphen"))
        if name != self.path.name:
            issues.append(Issue("warning", f"name {name!r} does not match the directory name {self.path.name!r}"))
        if len(self.description) > MAX_DESCRIPTION:
            issues.append(Issue("warning", f"description is {len(self.description)} characters; "
                                           f"the limit is {MAX_DESCRIPTION}"))
        if self.compatibility is not None and len(str(self.compatibility)) > MAX_COMPATIBILITY:
            issues.append(Issue("warning", f"compatibility is {len(str(self.compatibility))} characters; "
                                           f"the limit is {MAX_COMPATIBILITY}"))
        if "metadata" in self.front_matter and not isinstance(self.front_matter["metadata"], Mapping):
            issues.append(Issue("warning", "metadata should be a mapping of string keys to string values"))
        for key in self.front_matter:
            if key not in KNOWN_KEYS:
                issues.append(Issue("warning", f"unknown front-matter key {key!r} (kept; allowed: "
                                               f"{', '.join(sorted(KNOWN_KEYS))})"))
        trust = self.front_matter.get("trust")
        if trust is not None and str(trust).strip().lower() not in ("core", "external"):
            issues.append(Issue("warning", f"trust {trust!r} is not 'core' or 'external'; treated as external"))
        return issues

    # --- lazy parts ----------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        """The body below the front matter, stripped; cut at ``skills.max_instructions_chars``."""
        if self._instructions is None:
            with self._lock:
                if self._instructions is None:
                    limit = int(self._skills_settings.max_instructions_chars)
                    # Re-read the head: the file may have been edited since the scan.
                    head = read_head(self.skill_md)
                    text, truncated = read_body(self.skill_md, head.body_offset, limit)
                    if truncated:
                        message = f"instructions truncated to {limit} characters (skills.max_instructions_chars)"
                        self.warnings.append(message)
                        self.notes.append(message)
                        log.warning("skill.instructions_truncated", skill=self.name, path=str(self.skill_md),
                                    limit=limit)
                    self._instructions = text
        return self._instructions

    @property
    def scripts(self) -> list[Path]:
        """Files directly inside ``scripts/``, sorted; entries resolving outside are dropped.
        Rescanned when the folder changes (a file added or removed)."""
        stamp = self._folder_stamp()
        if self._scripts is None or stamp != self._scripts_stamp:
            with self._lock:
                if self._scripts is None or stamp != self._scripts_stamp:
                    self._scripts = self._scan_scripts()
                    self._scripts_stamp = stamp
        return self._scripts

    def _folder_stamp(self) -> tuple[int, ...]:
        try:
            return (os.stat(self.path / "scripts").st_mtime_ns,)
        except OSError:
            return (0,)

    @property
    def python(self) -> str | None:
        """The Python for this skill's scripts: ``skills.root_python`` for its root, else
        ``skills.python``, else None (the interpreter robot-lab runs under)."""
        per_root = getattr(self._skills_settings, "root_python", None) or {}
        if per_root:
            here = os.path.realpath(self.root_path)
            for root, python in per_root.items():
                if os.path.realpath(os.path.expanduser(root)) == here:
                    return python
        return getattr(self._skills_settings, "python", None)

    def script_plans(self) -> list[tuple[Path, ScriptPlan]]:
        """Every file of ``scripts/`` and how it runs (tools, library modules, data files)."""
        python = self.python
        return [(script, plan_script(script, python)) for script in self.scripts]

    def _scan_scripts(self) -> list[Path]:
        folder = self.path / "scripts"
        if not folder.is_dir():
            return []
        if not _inside(Path(os.path.realpath(folder)), self.path):
            self._warn("scripts/ is a symlink outside the skill directory; no scripts loaded")
            return []
        found: list[Path] = []
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or entry.name in _IGNORED_SCRIPT_NAMES:
                continue
            if entry.suffix.lower() in _IGNORED_SCRIPT_SUFFIXES:
                continue
            real = Path(os.path.realpath(entry))
            if not _inside(real, self.path):
                self._warn(f"scripts/{entry.name} resolves to {real}, outside the skill directory; skipped")
                continue
            if real.is_file():
                found.append(entry)
        return found

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
        if message not in self.notes:
            self.notes.append(message)
        log.warning("skill.warning", skill=self.name, path=str(self.path), warning=message)

    def script_tools(self, ceiling: Capabilities | None = None, *, sandbox: Any = None) -> list[ScriptTool]:
        """One tool per runnable script (at most ``skills.max_scripts``), under ``ceiling``.

        ``ceiling`` defaults to this skill's operator ceiling: ``settings.sandbox`` (or
        ``sandbox``) widened by ``skills.grants[name]`` and ``skills.core_trusted``.
        Library modules and data files are not tools; scripts whose interpreter is missing
        are skipped with a warning, so are duplicate names. Cached per ceiling and sandbox
        until a script changes (building them reads every script's head).
        """
        if ceiling is None:
            ceiling = Capabilities.ceiling(sandbox, skill=self.name, skills=self._skills_settings)
        key = f"{ceiling!r}|{sandbox!r}|{self.python}"
        scripts = self.scripts
        stamp = (*self._scripts_stamp_or_empty(), *self._mtimes(scripts))
        cached = self._tools_cache.get(key)
        if cached is not None and cached[0] == stamp:
            return list(cached[1])
        tools = self._build_tools(scripts, ceiling, sandbox)
        with self._lock:
            if len(self._tools_cache) > 16:
                self._tools_cache.clear()
            self._tools_cache[key] = (stamp, tools)
        return list(tools)

    def _scripts_stamp_or_empty(self) -> tuple[int, ...]:
        return self._scripts_stamp or ()

    @staticmethod
    def _mtimes(paths: list[Path]) -> list[int]:
        stamps = []
        for path in paths:
            try:
                st = os.stat(path)
                stamps += [st.st_mtime_ns, st.st_mode]
            except OSError:
                stamps.append(-1)
        return stamps

    def _build_tools(self, scripts: list[Path], ceiling: Capabilities, sandbox: Any) -> list[ScriptTool]:
        limit = int(self._skills_settings.max_scripts)
        python = self.python
        tools: list[ScriptTool] = []
        names: set[str] = set()
        for script in scripts:
            plan = plan_script(script, python)
            if plan.kind in ("library", "data", "not-a-program"):  # a server or browser JS: not a tool either
                continue
            if plan.kind == "unrunnable":
                log.warning("script_tool.skipped", script=str(script), skill=self.name, reason=plan.why)
                self._warn(f"scripts/{script.name}: skipped: {plan.why}")
                continue
            if len(tools) >= limit:
                self._warn(f"more than {limit} runnable scripts; only the first {limit} become tools "
                           "(skills.max_scripts)")
                break
            tool = ScriptTool.from_path(
                script,
                capabilities=self.capabilities,
                skill_dir=self.path,
                ceiling=ceiling,
                sandbox=sandbox,
                skill_name=self.name,
                python=python,
                plan=plan,
            )
            if tool is None:
                continue
            if tool.name in names:
                self._warn(f"scripts/{script.name}: tool name {tool.name!r} already taken in this skill; skipped")
                continue
            names.add(tool.name)
            tools.append(tool)
        return tools

    @property
    def references(self) -> list[Path]:
        return self._listing("references")

    @property
    def assets(self) -> list[Path]:
        return self._listing("assets")

    def _listing(self, sub: str) -> list[Path]:
        folder = self.path / sub
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.rglob("*") if p.is_file() and _inside(Path(os.path.realpath(p)), self.path))

    def __repr__(self) -> str:
        return f"<AgentSkill {self.name} {self.path}>"


def lowercase_hint(folder: Path) -> str:
    """``"; it has skill.md: rename it to SKILL.md"`` when ``folder`` holds only the lowercase
    file (on a case-sensitive file system), else ``""``: the one fix, named where it is refused."""
    try:
        names = set(os.listdir(folder))
    except OSError:
        return ""
    if LOWERCASE_SKILL_FILE in names and SKILL_FILE not in names:
        return f"; it has {LOWERCASE_SKILL_FILE}: rename it to {SKILL_FILE} (robot-lab loads only {SKILL_FILE})"
    return ""


def validate(path: str | os.PathLike[str], *, strict: bool = False, settings: Any = None) -> tuple[AgentSkill | None, list[Issue]]:
    """Load one bundle and list its issues. With ``strict`` the agentskills.io rules and
    requests beyond the operator's ceiling (:func:`trust_issues`) become errors; robot-lab's
    own limits (the instructions cap, skipped scripts) stay warnings, since they are not
    spec rules. Data files and library modules in ``scripts/`` are fine.

    Also reads the body and scripts, so size limits and unsafe symlinks are reported.
    """
    try:
        skill = AgentSkill(path, settings=settings)
    except ConfigurationError as exc:
        return None, [Issue("error", str(exc))]
    level = "error" if strict else "warning"
    issues = [Issue(level, issue.message) for issue in skill.spec_issues()]
    skill.instructions  # noqa: B018 - loads, and records truncation
    if not skill.instructions:
        issues.append(Issue("warning", "the body (instructions) is empty"))
    skill.script_tools(ceiling=skill.capabilities)  # records scripts that cannot run
    known = {issue.message for issue in issues}
    for message in skill.warnings:
        if message not in known:
            issues.append(Issue("warning" if message in skill.notes else level, message))
    issues += trust_issues(skill.review(sandbox=getattr(settings, "sandbox", None)), strict=strict)
    return skill, issues


def trust_issues(checked: TrustReview, *, strict: bool = False) -> list[Issue]:
    """A request the operator's ceiling denies: a warning, an error with ``strict`` (the
    skill would not run as its SKILL.md says here); granted core trust: a warning."""
    level = "error" if strict else "warning"
    issues = [Issue(level, f"asks for more than this operator grants: {d.line()}") for d in checked.denied]
    if checked.grant.core:
        issues.append(Issue("warning", "trust: core is granted (skills.core_trusted): its scripts run unconfined"))
    return issues
