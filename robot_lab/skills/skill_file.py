"""Reading a ``SKILL.md``: YAML front matter now, the Markdown body later.

The catalog scans every bundle at start-up, so only the head of each file is read (up to
the closing ``---``, bounded by :data:`MAX_FRONT_MATTER_BYTES`); the body is read on first
use of ``AgentSkill.instructions`` from the byte offset recorded here. A 10 MB body thus
costs nothing at scan time, and reading it later is capped by the instructions limit.

Every failure is a :class:`~robot_lab.errors.ConfigurationError` whose message starts with
``<file>:<line>:`` where a line is known, so a user can jump straight to the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.text.frontmatter import parse

# Front matter larger than this is not a skill header but a mistake (or an attack).
MAX_FRONT_MATTER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class SkillHead:
    """The parsed front matter and where the body starts."""

    front_matter: dict[str, Any]
    body_offset: int  # byte offset of the first body byte
    body_line: int  # 1-based line number of the first body line
    file_size: int
    duplicates: tuple[str, ...] = ()  # front-matter keys given twice (the last value was kept)


def read_head(path: Path) -> SkillHead:
    """Parse the front matter of ``path`` (:mod:`robot_lab.text.frontmatter` rules, required);
    raise ConfigurationError naming file and line."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(MAX_FRONT_MATTER_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if b"\x00" in head[:8192]:
        raise ConfigurationError(f"{path}: not a text file (contains NUL bytes); SKILL.md must be UTF-8 Markdown")
    parsed = parse(head[:MAX_FRONT_MATTER_BYTES], str(path), required=True,
                   truncated=len(head) > MAX_FRONT_MATTER_BYTES)
    return SkillHead(front_matter=parsed.data, body_offset=parsed.body_offset, body_line=parsed.body_line,
                     file_size=size, duplicates=parsed.duplicates)


def read_body(path: Path, offset: int, max_chars: int) -> tuple[str, bool]:
    """The body text (stripped) and whether it was cut at ``max_chars`` characters.

    Reads at most ``4 * (max_chars + 1)`` bytes (UTF-8 is at most 4 bytes a character), so a
    huge body never lands in memory whole. Undecodable bytes and NULs are replaced. A cut
    body ends at a word boundary with a marker saying so, so the model knows text is missing.
    """
    limit = 4 * (max_chars + 1)
    with path.open("rb") as handle:
        handle.seek(offset)
        raw = handle.read(limit + 1)
    more_on_disk = len(raw) > limit
    text = raw[:limit].decode("utf-8", errors="replace").replace("\x00", "\ufffd").strip()
    truncated = more_on_disk or len(text) > max_chars
    if truncated:
        cut = text[:max_chars]
        space = max(cut.rfind(" "), cut.rfind("\n"))
        if space > max_chars - 200:
            cut = cut[:space]
        text = cut.rstrip() + CUT_MARKER.format(limit=max_chars, file=path.name)
    return text, truncated


CUT_MARKER = ("\n\n[... instructions cut here at {limit} characters (skills.max_instructions_chars); "
              "the rest is in {file}: read it with the read_skill_file tool]")
