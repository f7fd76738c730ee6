"""Each runnable file in a skill's ``scripts/`` folder becomes a tool the model can call.

Duck-typed like ``robot_lab.runtime.tools.Tool`` (``name``, ``description``, ``parameters``,
``call(arguments) -> str``) because ``robot_lab.skills`` must not import the runtime.

How a script is run (robot_lab always ran ``bash <script>``, which breaks the Python
scripts that real published skills ship, often without the executable bit or the ``#!``):

1. a ``#!`` line naming Python (``#!/usr/bin/env python3``, ``#!/usr/bin/python``) runs with
   the skill's Python: the interpreter robot-lab runs under, or ``skills.python`` /
   ``skills.root_python`` for the skill's root, so the packages robot-lab has are there;
2. another ``#!`` line: the file itself when executable (the kernel reads the line), else
   that interpreter with the file;
3. no ``#!`` line (executable or not): by extension, ``.py`` with the skill's Python,
   ``.sh``/``.bash`` with bash, ``.js``/``.mjs``/``.cjs`` with node;
4. an executable file with no ``#!`` and no known extension (a compiled program): itself.

Not tools: Python library modules (no ``#!``, no ``__main__`` guard and only definitions at
top level, such as ``utils.py``), and data files (not executable, no ``#!``, no known
extension: ``template.pdf``, ``fields.csv``). A script whose interpreter is missing (node)
is skipped with a warning.

Tool names are namespaced by the skill (``pdf__fill_form``) so they are unique across
skills and never shadow a robot tool. The single optional ``args`` string is split like a
shell (``shlex.split``) and appended. The result is the combined output, or ``Error (...)``
text, never an exception.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import re
import shlex
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.sandbox.capabilities import Capabilities
from robot_lab.sandbox.sandbox import Outcome, python_executable, run_script
from robot_lab.sandbox.tool_shape import ToolShape
from robot_lab.sandbox.workspace import changed_files, snapshot

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
    """``check-deploy.sh`` -> ``check_deploy`` (the Ruby gem's rule), at most 64 characters."""
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


_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


def names_python(bang: list[str]) -> bool:
    """``#!/usr/bin/env python3``, ``#!/usr/bin/python``, ``#!/usr/bin/env -S python3 -u``."""
    exe = Path(bang[0]).name
    if exe == "env" and len(bang) > 1:
        words = [w for w in bang[1].split() if not w.startswith("-")]
        return bool(words) and bool(_PYTHON_RE.match(Path(words[0]).name))
    return bool(_PYTHON_RE.match(exe))


def is_library_module(path: Path, text: str | None = None) -> bool:
    """A Python file only imported by other scripts: it defines a function or class, and has
    no ``__main__`` guard and nothing but imports, definitions, assignments and a docstring
    at top level."""
    text = _read_text_head(path, 262_144) if text is None else text
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    inert = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
             ast.AnnAssign, ast.Pass)
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body):
        return False
    for node in tree.body:
        if isinstance(node, inert):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        if isinstance(node, ast.Try) and all(isinstance(n, inert) for n in node.body):
            continue  # try: import x / except ImportError
        return False
    return True


@dataclass(frozen=True, slots=True)
class ScriptPlan:
    """How (and whether) a file in ``scripts/`` runs.

    ``kind``: "tool", "library" (an importable module), "data" (not a program),
    "not-a-program" (a foreground server, browser JavaScript) or "unrunnable" (a program
    whose interpreter is missing: warned about).
    """

    kind: str
    command: list[str] | None = None
    python: str | None = None  # the Python it runs with, when it does
    why: str = ""


def _by_extension(path: Path, python: str) -> ScriptPlan | None:
    kind = EXTENSION_INTERPRETERS.get(path.suffix.lower())
    if kind == "python":
        return ScriptPlan("tool", [python, str(path)], python)
    if kind == "bash":
        return ScriptPlan("tool", [shutil.which("bash") or "/bin/bash", str(path)])
    if kind == "node":
        node = shutil.which("node")
        if node is None:
            return ScriptPlan("unrunnable", why="node is not installed")
        return ScriptPlan("tool", [node, str(path)])
    return None


_BROWSER_RE = re.compile(r"\b(?:document\.|window\.|typeof window\b|addEventListener\()")
_JS_SERVER_RE = re.compile(r"\.listen\(")
_PY_SERVER_RE = re.compile(r"\b(?:serve_forever|uvicorn\.run|app\.run|mcp\.run|web\.run_app)\(")


def not_a_program(path: Path, python_script: bool) -> str:
    """Why a script should not be offered as a tool although it could be started: a
    foreground server (it never returns, the call would only time out) or JavaScript for a
    browser page. Empty when it is a program."""
    text = _read_text_head(path, 262_144)
    suffix = path.suffix.lower()
    if suffix in (".js", ".mjs", ".cjs") or (not python_script and "node" in (shebang(path) or [""])[-1]):
        if _JS_SERVER_RE.search(text) and ("createServer" in text or "express(" in text):
            return "a server that runs in the foreground (it listens and never returns)"
        if _BROWSER_RE.search(text) and "process.argv" not in text:
            return "JavaScript for a browser page (it uses window/document)"
    elif python_script and _PY_SERVER_RE.search(text):
        return "a server that runs in the foreground (it serves and never returns)"
    return ""


def plan_script(path: Path, python: str | None = None) -> ScriptPlan:
    """Decide how ``path`` runs (see the module docstring); ``python`` is the skill's Python."""
    plan = _plan_script(path, python)
    if plan.kind == "tool":
        why = not_a_program(path, plan.python is not None)
        if why:
            return ScriptPlan("not-a-program", why=why)
    return plan


def _plan_script(path: Path, python: str | None = None) -> ScriptPlan:
    python = python_executable(python)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return ScriptPlan("unrunnable", why=f"cannot stat: {exc.strerror or exc}")
    executable = bool(mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
    bang = shebang(path)
    if bang:
        if names_python(bang):
            if is_library_module(path):  # a helper module that happens to carry a #! line
                return ScriptPlan("library", why="a Python module (#! line, but no __main__ guard and no top-level code)")
            return ScriptPlan("tool", [python, str(path)], python)
        if executable:
            return ScriptPlan("tool", [str(path)])
        return ScriptPlan("tool", [*bang, str(path)])
    if path.suffix.lower() == ".py" and is_library_module(path):
        return ScriptPlan("library", why="a Python module with no __main__ guard and no top-level code")
    by_ext = _by_extension(path, python)
    if by_ext is not None:
        return by_ext
    if executable:
        return ScriptPlan("tool", [str(path)])
    return ScriptPlan("data", why="not executable, no #! line and no known extension (.py, .sh, .bash, .js)")


_TOOL_NAME_RE = re.compile(r"[^A-Za-z0-9_-]+")
NAMESPACE_SEPARATOR = "__"


def namespaced_name(skill: str, script: str) -> str:
    """``pdf`` + ``fill_form`` -> ``pdf__fill_form``: at most 64 characters of
    ``[A-Za-z0-9_-]`` (what OpenAI and Anthropic accept), a hash keeping long ones unique."""
    prefix = _TOOL_NAME_RE.sub("_", skill).strip("_") or "skill"
    name = f"{prefix}{NAMESPACE_SEPARATOR}{script}"
    if len(name) <= 64:
        return name
    tag = hashlib.sha1(name.encode()).hexdigest()[:6]
    keep = 64 - len(tag) - 1
    return f"{name[:keep]}_{tag}"


class ScriptTool(ToolShape):
    """One script as a tool. Build with :meth:`from_path`; call with ``{"args": "..."}``.

    The tool a skill builds is shared (cached on the skill); :meth:`in_workspace` gives a
    copy that runs in one conversation's working directory.
    """

    parameters: dict[str, Any] = ARGS_SCHEMA

    def __init__(
        self,
        path: Path,
        command: list[str],
        *,
        skill_dir: Path,
        grant: Capabilities,
        python: str | None = None,
        sandbox: Any = None,
        skill_name: str = "",
        name: str | None = None,
        description: str | None = None,
        workspace: Path | None = None,
    ) -> None:
        self.path = path
        self.command = command
        self.skill_dir = skill_dir
        self.grant = grant
        self.python = python
        self.sandbox = sandbox
        self.skill_name = skill_name
        self.script_name = derive_name(path)
        self.name = name or (namespaced_name(skill_name, self.script_name) if skill_name else self.script_name)
        self.description = description or extract_description(path)
        self.parameters = dict(ARGS_SCHEMA)
        self.workspace = workspace
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
        python: str | None = None,
        plan: ScriptPlan | None = None,
    ) -> ScriptTool | None:
        """A tool for ``path``, or None when it is not a runnable script (a library module or a
        data file; a missing interpreter is warned about).

        ``capabilities`` (the skill's request) is intersected with ``ceiling`` (default: the
        ceiling of ``skill_name`` from the settings, see :meth:`Capabilities.ceiling`) and
        bounded by ``timeout_cap`` (None: the ceiling's ``sandbox.timeout`` alone).
        """
        path = Path(path)
        plan = plan or plan_script(path, python)
        if plan.kind != "tool" or plan.command is None:
            if plan.kind == "unrunnable":
                log.warning("script_tool.skipped", script=str(path), skill=skill_name, reason=plan.why)
            return None
        declared = capabilities or Capabilities()
        if ceiling is None:
            ceiling = Capabilities.ceiling(sandbox, skill=skill_name or None)
        grant = declared.intersect(ceiling)
        grant = grant.with_timeout_cap(timeout_cap)
        denied = declared.denied(grant)
        if denied:
            log.warning("script_tool.capabilities_reduced", script=str(path), skill=skill_name, denied=denied,
                        note="SKILL.md asks; the operator's ceiling (settings.sandbox, skills.grants, "
                             "skills.core_trusted) decides")
        return cls(
            path,
            plan.command,
            skill_dir=Path(skill_dir) if skill_dir else path.parent,
            grant=grant,
            python=plan.python,
            sandbox=sandbox,
            skill_name=skill_name,
        )

    def in_workspace(self, workspace: str | Path | None) -> ScriptTool:
        """A copy of this tool that runs in ``workspace`` (mounted read-write, the cwd)."""
        clone = copy.copy(self)
        clone.workspace = Path(workspace) if workspace is not None else None
        clone.last_outcome = None
        return clone

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
        before = snapshot(self.workspace)
        try:
            outcome = run_script(
                [*self.command, *args],
                grant=self.grant,
                skill_dir=str(self.skill_dir),
                sandbox=self.sandbox,
                python=self.python,
                workspace=str(self.workspace) if self.workspace is not None else None,
                label=f"{self.skill_name}/{self.path.name}",
                extra_env={"PYTHONPATH": str(self.skill_dir)},  # ``from scripts.x import ...`` works
            )
        except Exception as exc:  # never let a sandbox bug reach the model loop as an exception
            log.error("script_tool.failed", script=str(self.path), error=f"{type(exc).__name__}: {exc}")
            return f"Error ({self.name}): {type(exc).__name__}: {exc}"
        self.last_outcome = outcome
        log.info("script_tool.ran", script=self.path.name, skill=self.skill_name, mode=outcome.mode,
                 returncode=outcome.returncode, timed_out=outcome.timed_out, elapsed=round(outcome.elapsed, 3))
        text = outcome.text(self.grant.timeout)
        written = changed_files(before, snapshot(self.workspace))
        if written:
            text += f"\n[files written to the working directory: {', '.join(written)}]"
        return text

    __call__ = call

    def __repr__(self) -> str:
        return f"<ScriptTool {self.name} ({self.path})>"
