"""File and shell tools over a conversation's workspace, run inside the skill sandbox.

Published skills are written for an agent that has file and shell tools (the gencode
proposal's ``allowed-tools: [Bash, Read, Write, ...]``): "write ``field_values.json``, then
run ``python scripts/fill_fillable_fields.py``". These four tools give a model that:

* ``read_file(path, offset?)`` -- text, or base64 for a binary file, capped at
  ``skills.max_file_read_bytes`` with an offset to read on;
* ``write_file(path, content, encoding?)`` -- text, or ``encoding: "base64"`` for bytes;
* ``list_files(path?)`` -- files and folders with their sizes;
* ``run_command(command)`` -- a ``bash -c`` line (``python -c ...``, a script, a pipeline).

None of them touches the host's file system from the worker process: each call is a
program run by :func:`robot_lab.sandbox.sandbox.run_script` under the same policy and limits
as a skill script (bwrap, the operator's ceiling, the scrubbed environment, process and
memory limits, the timeout, the output cap). Their cwd is the workspace (read-write); the
bundles of the skills in play are mounted read-only at their own paths, which the system
prompt states, and are on ``PYTHONPATH``; ``python``/``python3`` are the skills' Python
(its ``bin`` folder first on ``PATH``), so robot-lab's packages are importable.

A skill's ``allowed-tools`` names the seed's tools; :data:`ALIASES` maps them onto these
(``Read`` -> ``read_file``, ``Bash`` -> ``run_command`` ...), so a skill that allows only
``Read`` gets ``read_file`` and no shell.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.sandbox.capabilities import Capabilities
from robot_lab.sandbox.sandbox import Outcome, run_script
from robot_lab.sandbox.sandbox import python_executable
from robot_lab.sandbox.workspace import changed_files, snapshot
from robot_lab.sandbox.tool_shape import ToolShape
from robot_lab.settings import get_settings

log = get_logger("robot_lab.sandbox.workspace_tools")

WORKSPACE_TOOL_NAMES = ("read_file", "write_file", "list_files", "run_command")
# The seed's (Claude Code's) tool names in ``allowed-tools`` -> the workspace tools they allow.
ALIASES: dict[str, tuple[str, ...]] = {
    "read": ("read_file",),
    "write": ("write_file",),
    "edit": ("write_file", "read_file"),
    "multiedit": ("write_file", "read_file"),
    "notebookedit": ("write_file",),
    "bash": ("run_command",),
    "shell": ("run_command",),
    "glob": ("list_files",),
    "ls": ("list_files",),
    "grep": ("list_files", "read_file"),
}
MAX_LISTED = 500

_READER = r"""
import base64, os, sys
path, offset, limit, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if os.path.isdir(path):
    print(f"{path} is a folder; list it with list_files"); sys.exit(2)
size = os.path.getsize(path)
with open(path, "rb") as handle:
    handle.seek(offset)
    data = handle.read(limit)
end = offset + len(data)
text = None
if mode != "base64" and b"\x00" not in data:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(data) - 3 and end < size:  # a character cut at the end of the window
            data = data[:exc.start]; end = offset + len(data); text = data.decode("utf-8")
if text is None:
    data = data[: limit * 3 // 4]; end = offset + len(data)  # its base64 fits the output cap
    sys.stdout.write(f"[binary file, {size} bytes; bytes {offset}-{end} as base64]\n")
    sys.stdout.write(base64.b64encode(data).decode("ascii"))
else:
    sys.stdout.write(text)
if end < size:
    sys.stdout.write(f"\n[... cut at {len(data)} bytes: bytes {offset}-{end} of {size} shown; "
                     f"call again with offset={end} to read on]")
"""

_WRITER = r"""
import os, sys
source, target, append = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
folder = os.path.dirname(target)
if folder:
    os.makedirs(folder, exist_ok=True)
data = open(source, "rb").read()
if append:
    with open(target, "ab") as handle:
        handle.write(data)
else:
    tmp = f"{target}.robot_lab-tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, target)
print(f"Wrote {len(data)} bytes to {target}")
"""

_LISTER = r"""
import os, sys
top, limit = sys.argv[1], int(sys.argv[2])
if not os.path.isdir(top):
    print(f"{top} is not a folder"); sys.exit(2)
shown = 0
for root, dirs, files in os.walk(top):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(files):
        full = os.path.join(root, name)
        rel = os.path.relpath(full, top)
        try:
            size = os.lstat(full).st_size
        except OSError:
            continue
        print(f"{rel}\t{size}")
        shown += 1
        if shown >= limit:
            print(f"[... more files: the first {limit} shown]"); sys.exit(0)
if not shown:
    print("(no files)")
"""


def _guarded(body: str) -> str:
    """``body`` with an OSError turned into one line (``No such file or directory: x.pdf``)."""
    inner = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return ("import sys\ndef main():\n" + inner + "\ntry:\n    main()\nexcept OSError as exc:\n"
            "    print(f'{exc.strerror or exc}: {exc.filename}'); sys.exit(1)\n")


_READER, _WRITER, _LISTER = _guarded(_READER), _guarded(_WRITER), _guarded(_LISTER)


def expand_allowed(allowed: Iterable[str] | None) -> set[str] | None:
    """``allowed-tools`` patterns plus the workspace tools the seed's names stand for."""
    if allowed is None:
        return None
    out: set[str] = set()
    for pattern in allowed:
        out.add(pattern)
        out.update(ALIASES.get(pattern.lower(), ()))
    return out


class WorkspaceTool(ToolShape):
    """One of the four tools, bound to a workspace and the bundles in play."""

    needs_workspace = True  # the Robot binds an unbound one to the conversation's workspace

    def __init__(self, name: str, description: str, parameters: dict[str, Any], *, workspace: Path | None,
                 bundles: Sequence[Path] = (), sandbox: Any = None, settings: Any = None) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters
        self.workspace = Path(workspace) if workspace is not None else None
        self.bundles = [Path(b) for b in bundles]
        self.sandbox = sandbox
        self.settings = settings
        self.last_outcome: Outcome | None = None

    # --- how every call runs ------------------------------------------------------------------
    def _skills_settings(self) -> Any:
        if self.settings is None:
            self.settings = get_settings()
        return getattr(self.settings, "skills", None)

    def _sandbox(self) -> Any:
        if self.sandbox is None:
            self.sandbox = getattr(self.settings, "sandbox", None) if self.settings is not None else None
        if self.sandbox is None:
            self.sandbox = get_settings().sandbox
        return self.sandbox

    def _grant(self) -> Capabilities:
        """The workspace and the bundles only (no fs grants, never core trust, no skill's
        own grants: a workspace tool acts for no single skill), the network when
        ``sandbox.network`` allows every skill, bounded by ``sandbox.timeout``."""
        sandbox = self._sandbox()
        ceiling = Capabilities.ceiling(sandbox)
        asked = Capabilities(network=ceiling.network, timeout=ceiling.timeout)
        return asked.intersect(ceiling)

    def python(self) -> str:
        return python_executable(getattr(self._skills_settings(), "python", None))

    def _run(self, command: list[str], *, extra_ro: Sequence[str] = ()) -> Outcome:
        python = self.python()
        bundles = [str(b) for b in self.bundles]
        env = {"PATH": f"{os.path.dirname(python)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        if bundles:
            env["PYTHONPATH"] = os.pathsep.join(bundles)
        outcome = run_script(command, grant=self._grant(), skill_dir=str(self.workspace), sandbox=self._sandbox(),
                             python=python, workspace=str(self.workspace), label=f"workspace/{self.name}",
                             extra_ro=[*bundles, *extra_ro], extra_env=env)
        self.last_outcome = outcome
        log.info("workspace_tool.ran", tool=self.name, mode=outcome.mode, returncode=outcome.returncode,
                 timed_out=outcome.timed_out, elapsed=round(outcome.elapsed, 3))
        return outcome

    def _result(self, outcome: Outcome, before: Any) -> str:
        text = outcome.text(self._grant().timeout)
        if outcome.returncode not in (0, None) and not text.startswith("Error ("):
            text = f"Error ({self.name}): {text}"
        written = changed_files(before, snapshot(self.workspace))
        if written:
            text += f"\n[files written to the working directory: {', '.join(written)}]"
        return text

    # --- the four tools -------------------------------------------------------------------------
    def in_workspace(self, workspace: str | os.PathLike[str]) -> WorkspaceTool:
        """A copy bound to ``workspace`` (what a run offers)."""
        return WorkspaceTool(self.name, self.description, self.parameters, workspace=Path(workspace),
                             bundles=self.bundles, sandbox=self.sandbox, settings=self.settings)

    def call(self, arguments: dict[str, Any] | None = None) -> str:
        """Run the tool; its text, or ``Error (...)`` text. Never raises."""
        if self.workspace is None:
            return f"Error ({self.name}): no working directory (the tool was called outside a robot's run)"
        args = dict(arguments or {})
        try:
            return getattr(self, f"_{self.name}")(args)
        except _BadArgs as exc:
            return f"Error (bad args): {exc}"
        except Exception as exc:  # a sandbox bug must not reach the model loop as an exception
            log.error("workspace_tool.failed", tool=self.name, error=f"{type(exc).__name__}: {exc}")
            return f"Error ({self.name}): {type(exc).__name__}: {exc}"

    __call__ = call

    def _read_file(self, args: dict[str, Any]) -> str:
        path = _required(args, "path")
        offset = _int(args.get("offset", 0), "offset")
        limit = int(getattr(self._skills_settings(), "max_file_read_bytes", 64 * 1024))
        output_cap = int(self._sandbox().max_output_bytes)
        limit = max(4, min(limit, output_cap - 512))
        mode = "base64" if str(args.get("encoding", "")).lower() == "base64" else "auto"
        outcome = self._run([self.python(), "-c", _READER, path, str(offset), str(limit), mode])
        return self._result(outcome, None)

    def _write_file(self, args: dict[str, Any]) -> str:
        path = _required(args, "path")
        content = args.get("content")
        if content is None:
            raise _BadArgs("write_file needs 'content'")
        if str(args.get("encoding", "")).lower() == "base64":
            try:
                data = base64.b64decode(str(content), validate=True)
            except ValueError as exc:
                raise _BadArgs(f"content is not base64: {exc}") from exc
        else:
            data = str(content).encode("utf-8")
        limit = int(getattr(self._sandbox(), "max_attachment_bytes", 50 * 1024 * 1024))
        if len(data) > limit:
            raise _BadArgs(f"{len(data)} bytes is more than sandbox.max_attachment_bytes ({limit})")
        staging = tempfile.mkdtemp(prefix="robot_lab-write-")
        try:
            source = os.path.join(staging, "content")
            with open(source, "wb") as handle:
                handle.write(data)
            before = snapshot(self.workspace)
            outcome = self._run([self.python(), "-c", _WRITER, source, path, "1" if args.get("append") else "0"],
                                extra_ro=[staging])
            return self._result(outcome, before)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _list_files(self, args: dict[str, Any]) -> str:
        path = str(args.get("path") or ".")
        return self._result(self._run([self.python(), "-c", _LISTER, path, str(MAX_LISTED)]), None)

    def _run_command(self, args: dict[str, Any]) -> str:
        command = _required(args, "command")
        before = snapshot(self.workspace)
        return self._result(self._run([shutil.which("bash") or "/bin/bash", "-c", command]), before)

    def __repr__(self) -> str:
        return f"<WorkspaceTool {self.name} ({self.workspace})>"


class _BadArgs(ValueError):
    pass


def _required(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if value is None or not str(value).strip():
        raise _BadArgs(f"missing '{key}'")
    return str(value)


def _int(value: Any, key: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise _BadArgs(f"'{key}' must be a whole number, not {value!r}") from exc
    if number < 0:
        raise _BadArgs(f"'{key}' must not be negative")
    return number


_PATH = {"type": "string", "description": "A path relative to the working directory (or absolute inside it)."}
SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "read_file": (
        "Read a file of the working directory (or of a skill's folder). Text comes back as it is; a binary "
        "file as base64. Long files are cut: call again with the offset given.",
        {"type": "object", "properties": {
            "path": _PATH,
            "offset": {"type": "integer", "description": "Byte offset to start reading at (default 0)."},
            "encoding": {"type": "string", "enum": ["text", "base64"], "description": "base64 forces base64 output."},
        }, "required": ["path"]},
    ),
    "write_file": (
        "Write a file in the working directory (folders are created). Text by default; set encoding to base64 "
        "to write bytes.",
        {"type": "object", "properties": {
            "path": _PATH,
            "content": {"type": "string", "description": "The file's content (text, or base64 with encoding=base64)."},
            "encoding": {"type": "string", "enum": ["text", "base64"]},
            "append": {"type": "boolean", "description": "Append instead of replacing the file."},
        }, "required": ["path", "content"]},
    ),
    "list_files": (
        "List the files under a folder of the working directory (default: all of it), with their sizes in bytes.",
        {"type": "object", "properties": {"path": _PATH}, "required": []},
    ),
    "run_command": (
        "Run a shell command (bash -c) in the working directory, sandboxed: python and the skills' scripts are "
        "available, the network is not unless the operator allows it. Returns its output and exit status.",
        {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line, e.g. python script.py in.pdf out.json"},
        }, "required": ["command"]},
    ),
}


def workspace_tools(workspace: str | os.PathLike[str], bundles: Iterable[str | os.PathLike[str]] = (), *,
                    names: Iterable[str] = WORKSPACE_TOOL_NAMES, sandbox: Any = None,
                    settings: Any = None) -> list[WorkspaceTool]:
    """The workspace tools named in ``names`` over ``workspace``, with ``bundles`` mounted
    read-only and on ``PYTHONPATH``."""
    folders = [Path(os.path.realpath(b)) for b in bundles]
    return [WorkspaceTool(name, *SPECS[name], workspace=Path(workspace), bundles=folders, sandbox=sandbox,
                          settings=settings)
            for name in names if name in SPECS]


# Unbound tools a robot may list by import path without any skill
# (``local_tools=["robot_lab.sandbox.workspace_tools:run_command"]``): each run binds them to
# its conversation's workspace, where attachments land.
read_file, write_file, list_files, run_command = (WorkspaceTool(name, *SPECS[name], workspace=None)
                                                  for name in WORKSPACE_TOOL_NAMES)


def bundles_prompt(skills: Sequence[Any]) -> str:
    """The system-prompt line stating where each skill's bundle is mounted."""
    if not skills:
        return ""
    where = "; ".join(f"{s.name}: {os.path.realpath(s.path)}" for s in skills)
    return (f"Skill folders (read-only, on PYTHONPATH; run their scripts with run_command, e.g. "
            f"python <folder>/scripts/<script>.py): {where}")


__all__ = ["ALIASES", "WORKSPACE_TOOL_NAMES", "WorkspaceTool", "bundles_prompt", "expand_allowed", "list_files",
           "read_file", "run_command", "workspace_tools", "write_file"]
