"""Prompt templates: ``.md`` files with YAML front matter, rendered with Jinja2.

Kept from robot_lab (prompt_manager): ``parameters:`` entries whose value is null are
required; front-matter keys ``model temperature top_p top_k max_tokens presence_penalty
frequency_penalty stop`` are run config, ``tools mcp robot_name description skills`` are
extras. Template skills expand depth-first with cycle detection, bodies joined with a blank
line in the order skill1 ... main template. Changed from robot_lab: ERB ``<%= x %>``
becomes Jinja2 ``{{ x }}``, and a missing required parameter at run time is a
ConfigurationError naming the parameters and the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.text.frontmatter import split_front_matter

log = get_logger("robot_lab.templates")

FRONT_MATTER_CONFIG_KEYS = ("model", "temperature", "top_p", "top_k", "max_tokens", "presence_penalty", "frequency_penalty", "stop")
FRONT_MATTER_EXTRA_KEYS = ("tools", "mcp", "robot_name", "description", "skills")



@lru_cache(maxsize=1)
def _jinja() -> Any:
    """The jinja2 environment, made when the first template renders: a run without a
    template (``robot-lab chat "hi"``, a first run) does not import jinja2."""
    import jinja2  # lazy: start-up time

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


@dataclass
class Template:
    name: str
    path: Path | None
    body: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> dict[str, Any]:
        params = self.metadata.get("parameters") or {}
        if not isinstance(params, dict):
            raise ConfigurationError(f"template {self.name!r} ({self.path}): 'parameters' must be a mapping")
        return params

    @property
    def required(self) -> list[str]:
        return [k for k, v in self.parameters.items() if v is None]

    @property
    def config(self) -> dict[str, Any]:
        return {k: self.metadata[k] for k in FRONT_MATTER_CONFIG_KEYS if k in self.metadata}

    @property
    def skills(self) -> list[str]:
        value = self.metadata.get("skills") or []
        return [value] if isinstance(value, str) else [str(s) for s in value]

    def missing(self, context: Mapping[str, Any]) -> list[str]:
        return [k for k in self.required if k not in context or context[k] is None]

    def render(self, context: Mapping[str, Any] | None = None) -> str:
        """Render with defaults from ``parameters`` under ``context``."""
        context = dict(context or {})
        missing = self.missing(context)
        if missing:
            raise ConfigurationError(
                f"Missing required parameters: {', '.join(missing)} for template {self.name!r}"
                + (f" ({self.path})" if self.path else "")
            )
        values = {k: v for k, v in self.parameters.items() if v is not None}
        values.update(context)
        import jinja2  # lazy: start-up time (already loaded by _jinja)

        try:
            return _jinja().from_string(self.body).render(**values).strip()
        except jinja2.TemplateError as exc:
            raise ConfigurationError(f"template {self.name!r} ({self.path}): {exc}") from exc


def template_dirs() -> list[Path]:
    return [Path(p).expanduser() for p in get_settings().template_path]


@lru_cache(maxsize=256)
def _load_cached(path: str, mtime: float) -> tuple[dict[str, Any], str]:
    return split_front_matter(Path(path).read_text(encoding="utf-8"), path)


def find_template(name: str, dirs: Iterable[Path] | None = None) -> Path | None:
    candidate = Path(name)
    if candidate.suffix == ".md" and candidate.is_file():
        return candidate
    for base in dirs if dirs is not None else template_dirs():
        for path in (base / f"{name}.md", base / name / "index.md"):
            if path.is_file():
                return path
    return None


def load_template(name: str, dirs: Iterable[Path] | None = None) -> Template:
    dirs = list(dirs) if dirs is not None else template_dirs()
    path = find_template(name, dirs)
    if path is None:
        searched = ", ".join(str(d) for d in dirs) or "(no template_path)"
        raise ConfigurationError(f"template {name!r} not found (searched {searched})")
    try:
        metadata, body = _load_cached(str(path), path.stat().st_mtime)
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"template {name!r} ({path}): not UTF-8 text") from exc
    return Template(name=name, path=path, body=body, metadata=dict(metadata))


def expand_skills(names: Iterable[str], dirs: Iterable[Path] | None = None) -> list[Template]:
    """Depth-first expansion of template skills: nested skills come before their parent;
    a cycle is logged (robot_lab: "skill cycle detected at 'x', skipping") and cut."""
    dirs = list(dirs) if dirs is not None else template_dirs()
    ordered: list[Template] = []
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            log.warning("template.skill_cycle", skill=name, message=f"skill cycle detected at '{name}', skipping")
            return
        if name in done:
            return
        template = load_template(name, dirs)
        for child in template.skills:
            visit(child, (*stack, name))
        done.add(name)
        ordered.append(template)

    for name in names:
        visit(name, ())
    return ordered
