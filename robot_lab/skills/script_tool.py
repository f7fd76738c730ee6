"""Each file in a skill's ``scripts/`` folder becomes a tool the model can call.

Duck-typed like ``robot_lab.runtime.tools.Tool`` (``name``, ``description``, ``parameters``,
``call(arguments) -> str``) because ``robot_lab.skills`` must not import the runtime.

How a script is run (robot_lab always ran ``bash <script>``, which breaks the Python
scripts that real published skills ship, usually without the executable bit):

1. executable bit set: run the file itself (the kernel reads its shebang);
2. else a ``#!`` line: run that interpreter with the file;
3. else by extension: ``.py`` with the Python running robot-lab, ``.sh``/``.bash`` with
   bash, ``.js``/``.mjs``/``.cjs`` with node;
4. else: skipped with a warning (no tool).

The single optional ``args`` string is split like a shell (``shlex.split``) and appended.
The result is the combined output, or ``Error (exit N):`` / ``Error (timed out):`` text,
never an exception.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.observability import hooks as observe
from robot_lab.skills.capabilities import Capabilities
from robot_lab.skills.sandbox import Outcome, run_script

log = get_logger("robot_lab.skills.script_tool")

EXTENSION_INTERPRETERS: dict[str, str] = {
    ".py": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "node",
    ".mjs": "node",
    ".cjs": "node",
}
_NAME_RE = re.compile(r"[^A-Za-z0-9]+")
ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "args": {
            "type": "string",
            "description": "Optional command-line arguments, split like a shell (quotes group words).",
        }
    },
    "required": [],
}


def derive_name(path: str | Path) -> str:
    """``check-deploy.sh`` -> ``check_deploy`` (robot_lab's rule), at most 64 characters."""
    stem = Path(path).name
    if "." in stem.lstrip("."):
        stem = stem[: stem.rfind(".")]
    name = _NAME_RE.sub("_", stem).strip("_")
    return (name or "script")[:64]


def _read_text_head(path: Path, limit: int = 16_384) -> str:
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit)
    except OSError:
        return ""
    if b"\x00" in raw:
        return ""
    return raw.decode("utf-8", errors="replace")


def extract_description(path: str | Path) -> str:
    """The first comment line (``#`` or ``//``, not the shebang or a coding line), or for
    Python the first line of the module docstring; else ``Run <name>``."""
    path = Path(path)
    text = _read_text_head(path)
    if path.suffix == ".py" and text:
        try:
            doc = ast.get_docstring(ast.parse(text))
        except (SyntaxError, ValueError):
            doc = None
        if doc and doc.strip():
            return doc.strip().splitlines()[0].strip()
    for index, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if index == 0 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        for marker in ("#", "//"):
            if stripped.startswith(marker):
                comment = stripped[len(marker):].strip().lstrip("#/").strip()
                if comment and not re.match(r"-\*-.*coding", comment) and not comment.startswith("!"):
                    return comment
                break
        else:
            break  # first code line: no leading comment
    return f"Run {derive_name(path)}"


def shebang(path: Path) -> list[str] | None:
    """The interpreter command of a ``#!`` line, split like the kernel does (one argument)."""
    text = _read_text_head(path, 512)
    if not text.startswith("#!"):
        return None
    line = text[2:].splitlines()[0].strip() if text[2:] else ""
    if not line:
        return None
    exe, _, arg = line.partition(" ")
    return [exe, arg.strip()] if arg.strip() else [exe]


def resolve_command(path: Path) -> tuple[list[str] | None, bool, str]:
    """``(command, uses_current_python, why_not)`` for a script file."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return None, False, f"cannot stat: {exc.strerror or exc}"
    if mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
        return [str(path)], False, ""
    bang = shebang(path)
    if bang:
        return [*bang, str(path)], False, ""
    kind = EXTENSION_INTERPRETERS.get(path.suffix.lower())
    if kind == "python":
        return [sys.executable, str(path)], True, ""
    if kind == "bash":
        bash = shutil.which("bash") or "/bin/bash"
        return [bash, str(path)], False, ""
    if kind == "node":
        node = shutil.which("node")
        if node is None:
            return None, False, "node is not installed"
        return [node, str(path)], False, ""
    return None, False, "not executable, no #! line and no known extension (.py, .sh, .bash, .js)"


class ScriptTool:
    """One script as a tool. Build with :meth:`from_path`; call with ``{"args": "..."}``."""

    parameters: dict[str, Any] = ARGS_SCHEMA

    def __init__(
        self,
        path: Path,
        command: list[str],
        *,
        skill_dir: Path,
        grant: Capabilities,
        uses_current_python: bool = False,
        sandbox: Any = None,
        skill_name: str = "",
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.path = path
        self.command = command
        self.skill_dir = skill_dir
        self.grant = grant
        self.uses_current_python = uses_current_python
        self.sandbox = sandbox
        self.skill_name = skill_name
        self.name = name or derive_name(path)
        self.description = description or extract_description(path)
        self.parameters = dict(ARGS_SCHEMA)
        self.last_outcome: Outcome | None = None

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        capabilities: Capabilities | None = None,
        skill_dir: str | Path | None = None,
        ceiling: Capabilities | None = None,
        sandbox: Any = None,
        timeout_cap: float | None = None,
        skill_name: str = "",
    ) -> ScriptTool | None:
        """A tool for ``path``, or None (with a warning) when it has no known interpreter.

        ``capabilities`` (the skill's declaration) is intersected with ``ceiling`` (default:
        ``settings.sandbox``) and bounded by ``timeout_cap`` (``settings.skills.script_timeout``).
        """
        path = Path(path)
        command, uses_python, why = resolve_command(path)
        if command is None:
            log.warning("script_tool.skipped", script=str(path), skill=skill_name, reason=why)
            return None
        declared = capabilities or Capabilities()
        grant = declared.intersect(ceiling if ceiling is not None else Capabilities.ceiling(sandbox))
        grant = grant.with_timeout_cap(timeout_cap)
        denied = declared.denied(grant)
        if denied and not declared.core:
            log.warning("script_tool.capabilities_reduced", script=str(path), skill=skill_name, denied=denied)
        return cls(
            path,
            command,
            skill_dir=Path(skill_dir) if skill_dir else path.parent,
            grant=grant,
            uses_current_python=uses_python,
            sandbox=sandbox,
            skill_name=skill_name,
        )

    @observe.skill_script
    def call(self, arguments: dict[str, Any] | None = None) -> str:
        """Run the script; the output, or an ``Error (...)`` text. Never raises."""
        raw = (arguments or {}).get("args")
        if raw is None:
            args: list[str] = []
        elif isinstance(raw, list):
            args = [str(a) for a in raw]
        else:
            try:
                args = shlex.split(str(raw))
            except ValueError as exc:
                return f"Error (bad args): {exc}: {raw!r}"
        try:
            outcome = run_script(
                [*self.command, *args],
                grant=self.grant,
                skill_dir=str(self.skill_dir),
                sandbox=self.sandbox,
                uses_current_python=self.uses_current_python,
                label=f"{self.skill_name}/{self.path.name}",
            )
        except Exception as exc:  # never let a sandbox bug reach the model loop as an exception
            log.error("script_tool.failed", script=str(self.path), error=f"{type(exc).__name__}: {exc}")
            return f"Error ({self.name}): {type(exc).__name__}: {exc}"
        self.last_outcome = outcome
        log.info("script_tool.ran", script=self.path.name, skill=self.skill_name, mode=outcome.mode,
                 returncode=outcome.returncode, timed_out=outcome.timed_out, elapsed=round(outcome.elapsed, 3))
        return outcome.text(self.grant.timeout)

    __call__ = call

    def to_json_schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.to_json_schema()}

    def __repr__(self) -> str:
        return f"<ScriptTool {self.name} ({self.path})>"
