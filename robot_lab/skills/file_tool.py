"""``read_skill_file``: the model reads a bundle's own files (progressive disclosure, complete).

Skills say "read FORMS.md" or "see references/api.md"; the instructions alone are not
enough. This tool returns such a file's text, confined to the bundle (the path is resolved
with symlinks and must stay inside the skill folder) and capped at
``skills.max_file_read_bytes`` (64 KiB; the cut is marked, and ``offset`` reads on).
A folder (``references``) lists its files; a binary file is described, not dumped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robot_lab.settings import get_settings
from robot_lab.sandbox.capabilities import is_under
from robot_lab.skills.skill import AgentSkill
from robot_lab.sandbox.tool_shape import ToolShape

TOOL_NAME = "read_skill_file"


class SkillFileTool(ToolShape):
    """Duck-typed tool (``name``, ``description``, ``parameters``, ``call``) over some skills."""

    def __init__(self, skills: Sequence[AgentSkill], *, max_bytes: int | None = None) -> None:
        self.skills: dict[str, AgentSkill] = {s.name: s for s in skills}
        if max_bytes is None:
            max_bytes = int(get_settings().skills.max_file_read_bytes)
        self.max_bytes = max_bytes
        self.name = TOOL_NAME
        self.description = (
            "Read a file of an active skill's bundle (for example FORMS.md, reference.md or "
            "references/api.md) when its instructions point to one. Give a folder to list its files.")
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {
                "skill": {"type": "string", "description": "The skill's name.", "enum": list(self.skills)},
                "path": {"type": "string", "description": "Path inside the skill folder, e.g. FORMS.md."},
                "offset": {"type": "integer", "description": "Byte offset to start from (to read on)."},
            },
            "required": ["skill", "path"],
        }

    def call(self, arguments: dict[str, Any] | None = None) -> str:
        """The file's text, a folder listing, or an ``Error (read_skill_file): ...`` text."""
        arguments = arguments or {}
        name = str(arguments.get("skill") or "").strip()
        skill = self.skills.get(name)
        if skill is None and len(self.skills) == 1 and not name:
            skill = next(iter(self.skills.values()))
        if skill is None:
            return f"Error ({self.name}): unknown skill {name!r}; active skills: {', '.join(self.skills) or 'none'}"
        relative = str(arguments.get("path") or "").strip().lstrip("/") or "."
        root = os.path.realpath(skill.path)
        target = _case_insensitive(root, os.path.realpath(os.path.join(root, relative)))
        if not is_under(target, root):
            return f"Error ({self.name}): {relative!r} is outside the {skill.name} skill folder"
        if os.path.isdir(target):
            return self._listing(skill, root, target)
        if not os.path.isfile(target):
            return (f"Error ({self.name}): no file {relative!r} in the {skill.name} skill. "
                    + self._listing(skill, root, root))
        try:
            offset = max(0, int(arguments.get("offset") or 0))
        except (TypeError, ValueError):
            offset = 0
        size = os.path.getsize(target)
        with open(target, "rb") as handle:
            handle.seek(offset)
            raw = handle.read(self.max_bytes)
        if b"\x00" in raw[:8192]:
            return (f"{relative} is a binary file ({size} bytes); it cannot be shown as text. "
                    f"Scripts can read it at {target}.")
        text = raw.decode("utf-8", errors="replace")
        end = offset + len(raw)
        if end < size:
            text += (f"\n[... cut at {self.max_bytes} bytes: bytes {offset}-{end} of {size} shown; call again "
                     f"with offset={end} to read on]")
        return text

    def _listing(self, skill: AgentSkill, root: str, folder: str) -> str:
        entries: list[str] = []
        for base, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for file in sorted(files):
                full = os.path.join(base, file)
                if not file.startswith(".") and is_under(os.path.realpath(full), root):
                    entries.append(os.path.relpath(full, root))
            if len(entries) > 200:
                break
        where = os.path.relpath(folder, root)
        return f"Files in {skill.name}/{'' if where == '.' else where + '/'}: " + (", ".join(entries[:200]) or "(none)")

    __call__ = call

    def __repr__(self) -> str:
        return f"<SkillFileTool {list(self.skills)}>"


def _case_insensitive(root: str, target: str) -> str:
    """``target``, or the one file of the bundle whose path matches it ignoring case (a
    SKILL.md says FORMS.md, the file is forms.md); unchanged when none or several match."""
    if os.path.exists(target) or not is_under(target, root):
        return target
    want = os.path.relpath(target, root).lower()
    found = [os.path.join(base, name) for base, _, names in os.walk(root) for name in names
             if os.path.relpath(os.path.join(base, name), root).lower() == want]
    return os.path.realpath(found[0]) if len(found) == 1 else target


def bundle_files(skill: AgentSkill) -> list[str]:
    """The readable files of a bundle besides SKILL.md and scripts/ (for the prompt)."""
    root = Path(os.path.realpath(skill.path))
    found: list[str] = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (Path(base) == root and d == "scripts"))
        for file in sorted(files):
            if file.startswith(".") or (Path(base) == root and file == "SKILL.md"):
                continue
            found.append(os.path.relpath(os.path.join(base, file), root))
            if len(found) >= 30:
                return found
    return found
