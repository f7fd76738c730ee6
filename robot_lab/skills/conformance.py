"""The agentskills.io specification exactly as skills-ref (its reference validator) reads it.

robot-lab loads bundles leniently (:class:`~robot_lab.skills.skill.AgentSkill`: YAML 1.1
types, robot-lab's own capability keys, duplicate keys warned). ``robot-lab skills validate
--spec`` answers a different question: would skills-ref accept this bundle? So this module
follows skills-ref's rules, not robot-lab's:

* the file is ``SKILL.md``, else ``skill.md``; it must be UTF-8 and start with ``---``; the
  front matter ends at the next ``---`` anywhere in the text (skills-ref splits on it);
* the front matter is StrictYAML: every scalar is a string, and flow collections
  (``[a, b]``, ``{}``), anchors, aliases, explicit tags and duplicate keys are refused;
* only ``name``, ``description``, ``license``, ``allowed-tools``, ``metadata`` and
  ``compatibility`` are allowed (robot-lab's ``timeout``, ``network`` ... are not);
* ``name``: non-empty, NFKC-normalised, at most 64 characters, lowercase, letters (any
  script), digits and single hyphens, not at either end, equal to the directory name;
* ``description``: non-empty, at most 1024 characters; ``compatibility``: a string of at
  most 500 characters.

The parser is PyYAML's event stream, so no StrictYAML dependency at run time;
``tests/test_skills_spec.py`` checks the verdicts against skills-ref on a corpus of bundles.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

SPEC_FIELDS = frozenset({"name", "description", "license", "allowed-tools", "metadata", "compatibility"})
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
SKILL_FILES = ("SKILL.md", "skill.md")


class SpecError(ValueError):
    """The front matter is not what skills-ref can read (the bundle's one error)."""


def skill_file(folder: Path) -> Path | None:
    """``SKILL.md``, else ``skill.md`` (skills-ref's order), else None."""
    for name in SKILL_FILES:
        if (folder / name).exists():
            return folder / name
    return None


def spec_errors(path: str | Path) -> list[str]:
    """What breaks the spec in the bundle at ``path`` (its folder or its SKILL.md); [] = valid."""
    folder = Path(path)
    if folder.is_file() and folder.name.lower() == "skill.md":
        folder = folder.parent
    if not folder.exists():
        return [f"path does not exist: {folder}"]
    if not folder.is_dir():
        return [f"not a directory: {folder}"]
    found = skill_file(folder)
    if found is None:
        return ["missing required file: SKILL.md"]
    try:
        raw = found.read_bytes()
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text() reads
    except UnicodeDecodeError as exc:
        return [f"{found.name} is not UTF-8 text (byte {exc.start}: {exc.reason})"]
    except OSError as exc:
        return [f"{found.name}: cannot read: {exc.strerror or exc}"]
    try:
        metadata = parse_front_matter(text)
    except SpecError as exc:
        return [str(exc)]
    return metadata_errors(metadata, folder)


def parse_front_matter(text: str) -> dict[str, Any]:
    """The front matter as StrictYAML reads it (every scalar a string); SpecError otherwise."""
    if not text.startswith("---"):
        raise SpecError("SKILL.md must start with YAML front matter (---)")
    parts = text.split("---", 2)
    if len(parts) < 3:
        raise SpecError("SKILL.md front matter is not closed with ---")
    data = _strict_load(parts[1])
    if not isinstance(data, dict):
        raise SpecError("SKILL.md front matter must be a YAML mapping")
    if isinstance(data.get("metadata"), dict):  # skills-ref keeps metadata as string -> string
        data["metadata"] = {str(k): str(v) for k, v in data["metadata"].items()}
    return data


def _strict_load(text: str) -> Any:
    """Load YAML the StrictYAML way from PyYAML's events."""
    import yaml  # lazy: start-up time

    try:
        events = list(yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML in front matter: {exc}") from None
    position = 0

    def node() -> Any:
        nonlocal position
        event = events[position]
        position += 1
        line = event.start_mark.line + 2 if event.start_mark is not None else 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise SpecError(f"line {line}: anchors and aliases are not allowed (StrictYAML)")
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent) and event.tag is not None:
            raise SpecError(f"line {line}: explicit tags are not allowed (StrictYAML)")
        if isinstance(event, yaml.CollectionStartEvent) and event.flow_style:
            raise SpecError(f"line {line}: flow style ([...] or {{...}}) is not allowed (StrictYAML): "
                            "write one item a line")
        if isinstance(event, yaml.ScalarEvent):
            return event.value
        if isinstance(event, yaml.SequenceStartEvent):
            items = []
            while not isinstance(events[position], yaml.SequenceEndEvent):
                items.append(node())
            position += 1
            return items
        if isinstance(event, yaml.MappingStartEvent):
            mapping: dict[str, Any] = {}
            while not isinstance(events[position], yaml.MappingEndEvent):
                key_line = events[position].start_mark.line + 2
                key = node()
                if not isinstance(key, str):
                    raise SpecError(f"line {key_line}: a key must be a plain string")
                if key in mapping:
                    raise SpecError(f"line {key_line}: duplicate key {key!r} (StrictYAML refuses duplicate keys)")
                mapping[key] = node()
            position += 1
            return mapping
        raise SpecError(f"line {line}: unexpected YAML {type(event).__name__}")

    # StreamStart, DocumentStart?, node, DocumentEnd?, StreamEnd
    while position < len(events) and isinstance(events[position], (yaml.StreamStartEvent, yaml.DocumentStartEvent)):
        position += 1
    if position >= len(events) or isinstance(events[position], (yaml.StreamEndEvent, yaml.DocumentEndEvent)):
        return ""  # an empty document: not a mapping
    return node()


def metadata_errors(metadata: dict[str, Any], folder: Path) -> list[str]:
    """skills-ref's field rules on parsed front matter."""
    errors: list[str] = []
    extra = sorted(set(metadata) - SPEC_FIELDS)
    if extra:
        errors.append(f"unexpected front-matter keys: {', '.join(extra)} (the spec allows only "
                      f"{', '.join(sorted(SPEC_FIELDS))})")
    if "name" not in metadata:
        errors.append("missing required front-matter key: name")
    else:
        errors += _name_errors(metadata["name"], folder)
    description = metadata.get("description")
    if "description" not in metadata:
        errors.append("missing required front-matter key: description")
    elif not isinstance(description, str) or not description.strip():
        errors.append("'description' must be a non-empty string")
    elif len(description) > MAX_DESCRIPTION:
        errors.append(f"description is {len(description)} characters; the limit is {MAX_DESCRIPTION}")
    if "compatibility" in metadata:
        compatibility = metadata["compatibility"]
        if not isinstance(compatibility, str):
            errors.append("'compatibility' must be a string")
        elif len(compatibility) > MAX_COMPATIBILITY:
            errors.append(f"compatibility is {len(compatibility)} characters; the limit is {MAX_COMPATIBILITY}")
    return errors


def _name_errors(value: Any, folder: Path) -> list[str]:
    if not isinstance(value, str) or not value.strip():
        return ["'name' must be a non-empty string"]
    name = unicodedata.normalize("NFKC", value.strip())
    errors = []
    if len(name) > MAX_NAME:
        errors.append(f"name {name!r} is {len(name)} characters; the limit is {MAX_NAME}")
    if name != name.lower():
        errors.append(f"name {name!r} must be lowercase")
    if name.startswith("-") or name.endswith("-"):
        errors.append(f"name {name!r} must not start or end with a hyphen")
    if "--" in name:
        errors.append(f"name {name!r} must not contain consecutive hyphens")
    if not all(c.isalnum() or c == "-" for c in name):
        errors.append(f"name {name!r} may hold only letters, digits and hyphens")
    if unicodedata.normalize("NFKC", folder.name) != name:
        errors.append(f"name {name!r} does not match the directory name {folder.name!r}")
    return errors
