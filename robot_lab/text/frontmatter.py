"""YAML front matter (``---`` ... ``---``), parsed one way for prompt templates and SKILL.md.

Works on bytes so callers can read only a file's head (skills scan hundreds of bundles at
start-up and read a body later from :attr:`FrontMatter.body_offset`). Rules:

* the first line (after a UTF-8 BOM) must be exactly ``---``; otherwise there is no front
  matter (``required=True`` makes that an error);
* the block closes at the next ``---`` or ``...`` line; an unclosed block is an error;
* the block must be UTF-8 YAML that loads to a mapping (or nothing);
* a key given twice in one mapping keeps its last value (PyYAML's rule) and is named in
  :attr:`FrontMatter.duplicates`, so callers can warn instead of silently losing a value.

Every failure is a :class:`~robot_lab.errors.ConfigurationError` that starts with
``<source>:<line>:`` where a line is known, so a user can jump straight to the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from robot_lab.errors import ConfigurationError

_BOM = b"\xef\xbb\xbf"
_FENCE = b"---"
_CLOSERS = (b"---", b"...")


@dataclass(frozen=True, slots=True)
class FrontMatter:
    """Parsed front matter and where the body starts in the bytes given to :func:`parse`."""

    data: dict[str, Any]
    body_offset: int  # byte offset of the first body byte
    body_line: int  # 1-based line number of the first body line
    present: bool  # False when the text has no front matter at all
    duplicates: tuple[str, ...] = ()  # keys given more than once in one mapping, first-seen order


def _strip_eol(line: bytes) -> bytes:
    return line.rstrip(b"\r\n").rstrip()


def parse(raw: bytes, source: str, *, required: bool = False, truncated: bool = False) -> FrontMatter:
    """Parse the front matter at the start of ``raw``.

    ``truncated`` says ``raw`` is only a file's head: an unclosed block is then reported as
    "not closed within the first N bytes" rather than "never closed".
    """
    offset = len(_BOM) if raw.startswith(_BOM) else 0
    lines = raw[offset:].splitlines(keepends=True)
    if not lines or _strip_eol(lines[0]) != _FENCE:
        if required:
            raise ConfigurationError(
                f"{source}:1: no YAML front matter: the file must start with a '---' line, then "
                "'name:' and 'description:', then a closing '---'"
            )
        return FrontMatter(data={}, body_offset=offset, body_line=1, present=False)
    closing = next((i for i, line in enumerate(lines[1:], start=1) if _strip_eol(line) in _CLOSERS), None)
    if closing is None:
        if truncated:
            raise ConfigurationError(f"{source}: front matter not closed within the first {len(raw)} bytes")
        raise ConfigurationError(f"{source}:1: front matter opened with '---' but never closed")
    block = b"".join(lines[1:closing])
    data, duplicates = _load_mapping(block, source)
    return FrontMatter(
        data=data,
        body_offset=offset + sum(len(line) for line in lines[: closing + 1]),
        body_line=closing + 2,
        present=True,
        duplicates=duplicates,
    )


def _loader(duplicates: list[str]) -> Any:
    """A safe loader (libyaml's when PyYAML has it: ~10x faster on a catalog of hundreds)
    that appends every key seen twice in one mapping to ``duplicates``."""
    import yaml  # lazy: start-up time (a prompt without front matter never needs it)

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            for key_node, _ in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None and key in seen and key not in duplicates:
                    duplicates.append(key)
                if key is not None:
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _load_mapping(block: bytes, source: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = block[: exc.start].count(b"\n") + 2
        raise ConfigurationError(f"{source}:{line}: front matter is not UTF-8 text ({exc.reason})") from exc
    import yaml  # lazy: start-up time (a prompt without front matter never needs it)

    duplicates: list[str] = []
    try:
        data = yaml.load(text, Loader=_loader(duplicates))  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 2 if mark is not None else 1  # +1 for 1-based, +1 for the '---' line
        context = exc.context
        if context and exc.context_mark is not None and exc.context_mark.line + 2 != line:
            context = f"{context} (started on line {exc.context_mark.line + 2})"
        problem = " ".join(p for p in (context, exc.problem) if p)
        raise ConfigurationError(f"{source}:{line}: malformed YAML front matter: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{source}: malformed YAML front matter: {exc}") from exc
    if data is None:
        return {}, tuple(duplicates)
    if not isinstance(data, dict):
        raise ConfigurationError(
            f"{source}:2: front matter must be a mapping of keys (name:, description:, ...), "
            f"got {type(data).__name__}"
        )
    return {str(k): v for k, v in data.items()}, tuple(duplicates)


def split_front_matter(text: str, source: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a whole Markdown text; ``({}, text)`` when it has no front matter."""
    raw = text.encode("utf-8")
    parsed = parse(raw, source)
    if not parsed.present:
        return {}, text
    return parsed.data, raw[parsed.body_offset :].decode("utf-8")


__all__ = ["FrontMatter", "parse", "split_front_matter"]
