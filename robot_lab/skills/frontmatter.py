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

import yaml

from robot_lab.errors import ConfigurationError

# libyaml's loader when PyYAML was built with it: ~10x faster on a catalog of hundreds.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Front matter larger than this is not a skill header but a mistake (or an attack).
MAX_FRONT_MATTER_BYTES = 64 * 1024
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SkillHead:
    """The parsed front matter and where the body starts."""

    front_matter: dict[str, Any]
    body_offset: int  # byte offset of the first body byte
    body_line: int  # 1-based line number of the first body line
    file_size: int


def _closing_fence(lines: list[bytes]) -> int | None:
    """Index of the line that closes the front matter (``---`` or ``...``), if any."""
    for index, line in enumerate(lines[1:], start=1):
        if line.rstrip(b"\r\n").rstrip() in (b"---", b"..."):
            return index
    return None


def read_head(path: Path) -> SkillHead:
    """Parse the front matter of ``path``; raise ConfigurationError naming file and line."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(MAX_FRONT_MATTER_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if b"\x00" in head[:8192]:
        raise ConfigurationError(f"{path}: not a text file (contains NUL bytes); SKILL.md must be UTF-8 Markdown")
    offset = len(_BOM) if head.startswith(_BOM) else 0
    lines = head[offset:].splitlines(keepends=True)
    if not lines or lines[0].rstrip(b"\r\n").rstrip() != b"---":
        raise ConfigurationError(
            f"{path}:1: no YAML front matter: the file must start with a '---' line, then "
            "'name:' and 'description:', then a closing '---'"
        )
    closing = _closing_fence(lines)
    if closing is None:
        if len(head) > MAX_FRONT_MATTER_BYTES:
            raise ConfigurationError(
                f"{path}: front matter not closed within the first {MAX_FRONT_MATTER_BYTES} bytes"
            )
        raise ConfigurationError(f"{path}:1: front matter opened with '---' but never closed")
    raw = b"".join(lines[1:closing])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 2
        raise ConfigurationError(f"{path}:{line}: front matter is not UTF-8 text ({exc.reason})") from exc
    try:
        data = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 2 if mark is not None else 1  # +1 for 1-based, +1 for the '---' line
        context = exc.context
        if context and exc.context_mark is not None and exc.context_mark.line + 2 != line:
            context = f"{context} (started on line {exc.context_mark.line + 2})"
        problem = " ".join(p for p in (context, exc.problem) if p)
        raise ConfigurationError(f"{path}:{line}: malformed YAML front matter: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path}: malformed YAML front matter: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"{path}:2: front matter must be a mapping of keys (name:, description:, ...), "
            f"got {type(data).__name__}"
        )
    body_offset = offset + sum(len(line) for line in lines[: closing + 1])
    return SkillHead(
        front_matter={str(k): v for k, v in data.items()},
        body_offset=body_offset,
        body_line=closing + 2,
        file_size=size,
    )


def read_body(path: Path, offset: int, max_chars: int) -> tuple[str, bool]:
    """The body text (stripped) and whether it was cut at ``max_chars`` characters.

    Reads at most ``4 * (max_chars + 1)`` bytes (UTF-8 is at most 4 bytes a character), so a
    huge body never lands in memory whole. Undecodable bytes and NULs are replaced.
    """
    limit = 4 * (max_chars + 1)
    with path.open("rb") as handle:
        handle.seek(offset)
        raw = handle.read(limit + 1)
    more_on_disk = len(raw) > limit
    text = raw[:limit].decode("utf-8", errors="replace").replace("\x00", "\ufffd").strip()
    truncated = more_on_disk or len(text) > max_chars
    if len(text) > max_chars:
        text = text[:max_chars].rstrip()
    return text, truncated
