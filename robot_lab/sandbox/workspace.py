"""A working directory per conversation (or network run) where skill scripts see the user's
files and leave theirs.

Bundles in the wild declare no ``fs_read``/``fs_write`` grants and expect to work on "the
user's files" in their current directory, passing results from one script to the next
(extract -> JSON -> fill). So each conversation gets one folder under
``skills.workspace_root`` (default ``<tmp>/robot_lab-workspaces-<uid>``), named by the
conversation (or network run): mounted read-write in the sandbox, the scripts' cwd, and kept across the
conversation's calls. The model is told its path (the gencode proposal's "Working
Directory" line) and which files are in it.

Files reach it as *attachments* (:meth:`Workspace.attach`): bytes with a name, or a path on
the machine that runs the robot. Operator ceilings apply: ``sandbox.workspace = false``
mounts nothing, a path must lie under ``sandbox.attach_from`` (default: none, so only bytes),
and each file is capped at ``sandbox.max_attachment_bytes``.

On the bus an attachment travels in the envelope's top-level ``attachments`` list (an
extension field: older workers keep it untouched): ``{"name": ..., "content_base64": ...}``
or ``{"path": ...}``; :func:`envelope_attachments` builds it.

Workspaces are plain folders with a quota (``sandbox.workspace_max_bytes``, ``_max_files``:
a script that writes past it is stopped, sandbox/quota.py); one untouched for
``sandbox.workspace_ttl`` (7 days) is removed when another workspace is opened. A conversation continued on another host needs ``workspace_root`` on a
shared volume to see the same files.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import mimetypes
import os
import posixpath
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.settings import get_settings
from robot_lab.schemas.messages import ResultFile
from robot_lab.sandbox.capabilities import expand_path, is_under
from robot_lab.sandbox.quota import remove_stale

log = get_logger("robot_lab.sandbox.workspace")

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_LISTED = 50


def _segment(text: str) -> str:
    """A folder name from any id: readable prefix plus a short hash (no collisions, no '..')."""
    cleaned = _SAFE.sub("_", text).strip("._")[:48] or "x"
    return f"{cleaned}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _sandbox(sandbox: Any) -> Any:
    if sandbox is None:
        return get_settings().sandbox
    return sandbox


def workspace_root(settings: Any = None) -> Path:
    """``skills.workspace_root``, else ``<tmp>/robot_lab-workspaces-<uid>``."""
    if settings is None:
        settings = get_settings()
    skills = getattr(settings, "skills", settings)
    configured = getattr(skills, "workspace_root", None)
    if configured:
        return Path(configured).expanduser()
    return Path(tempfile.gettempdir()) / f"robot_lab-workspaces-{os.getuid()}"


def _check_owner(folder: Path) -> None:
    """A workspace folder someone else owns (a pre-made one in a shared /tmp) is refused:
    they could read the user's files."""
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigurationError(f"workspace folder {folder} is a symlink or belongs to another user; refusing it "
                                 "(set skills.workspace_root to a folder of your own)")


class Workspace:
    """One conversation's working directory."""

    def __init__(self, path: str | os.PathLike[str], *, sandbox: Any = None) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_owner(path)
        self.path = Path(os.path.realpath(path))
        self.sandbox = sandbox

    @classmethod
    def for_scope(cls, scope: str, *, settings: Any = None, sandbox: Any = None) -> Workspace:
        """The workspace of ``scope``: a conversation id, or a network run id (shared by the
        run's robots, so one robot's output is the next one's input)."""
        root = workspace_root(settings)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_owner(root)
        workspace = cls(root / _segment(scope), sandbox=sandbox)
        remove_stale(root, float(getattr(_sandbox(sandbox), "workspace_ttl", 0) or 0), keep=workspace.path)
        return workspace

    # --- attachments -------------------------------------------------------------------------
    def attach(self, item: Any, name: str | None = None) -> Path:
        """Put one attachment here and return its path.

        ``item``: a path (``str``/``Path``), ``bytes`` (``name`` required), a ``(name,
        bytes)`` pair, or a mapping ``{"name", "content_base64" | "content" | "path"}`` as
        sent in an envelope. Raises ConfigurationError naming the problem (the caller's
        mistake, not a crash).
        """
        if isinstance(item, tuple) and len(item) == 2:
            return self.attach(item[1], str(item[0]))
        if isinstance(item, Mapping):
            name = item.get("name") or name
            if item.get("path"):
                return self.attach(Path(str(item["path"])), name)
            if item.get("content_base64") is not None:
                try:
                    data = base64.b64decode(str(item["content_base64"]), validate=True)
                except ValueError as exc:
                    raise ConfigurationError(f"attachment {name!r}: content_base64 is not base64: {exc}") from exc
                return self.attach(data, name)
            if item.get("content") is not None:
                return self.attach(str(item["content"]).encode("utf-8"), name)
            raise ConfigurationError(f"attachment {name!r} has no path, content_base64 or content")
        limit = int(getattr(_sandbox(self.sandbox), "max_attachment_bytes", 50 * 1024 * 1024))
        if isinstance(item, (bytes, bytearray, memoryview)):
            if not name:
                raise ConfigurationError("an attachment given as bytes needs a name")
            data = bytes(item)
            if len(data) > limit:
                raise ConfigurationError(f"attachment {name!r} is {len(data)} bytes; the limit is {limit} "
                                         "(sandbox.max_attachment_bytes)")
            target = self._target(name)
            _write_new(target, data)
            log.info("workspace.attached", file=target.name, bytes=len(data), workspace=str(self.path))
            return target
        if isinstance(item, (str, os.PathLike)):
            return self._attach_path(Path(item), name, limit)
        raise ConfigurationError(f"cannot attach a {type(item).__name__}: give a path, bytes or a mapping")

    def _attach_path(self, source: Path, name: str | None, limit: int) -> Path:
        real = expand_path(str(source))
        roots = [expand_path(p) for p in getattr(_sandbox(self.sandbox), "attach_from", [])]
        if not any(is_under(real, r) for r in roots):
            raise ConfigurationError(
                f"attachment {source} is outside the folders files may be attached from "
                f"({', '.join(roots) or 'none'}; sandbox.attach_from)")
        if not os.path.isfile(real):
            raise ConfigurationError(f"attachment {source} is not a file")
        size = os.path.getsize(real)
        if size > limit:
            raise ConfigurationError(f"attachment {source} is {size} bytes; the limit is {limit} "
                                     "(sandbox.max_attachment_bytes)")
        target = self._target(name or source.name)
        with open(real, "rb") as handle:
            _write_new(target, handle.read(limit + 1)[:limit])
        log.info("workspace.attached", file=target.name, bytes=size, workspace=str(self.path))
        return target

    def _target(self, name: str) -> Path:
        base = Path(str(name).replace("\\", "/")).name  # no folders, no '..'
        if base in ("", ".", ".."):
            raise ConfigurationError(f"attachment name {name!r} is not a file name")
        return self.path / base

    def attach_all(self, items: Iterable[Any] | None) -> list[Path]:
        return [self.attach(item) for item in (items or ())]

    # --- what the model is told ----------------------------------------------------------------
    def files(self) -> list[str]:
        """Files here (relative paths, hidden ones skipped), at most a few dozen."""
        found: list[str] = []
        for root, dirs, names in os.walk(self.path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                if not name.startswith("."):
                    found.append(os.path.relpath(os.path.join(root, name), self.path))
                    if len(found) >= MAX_LISTED:
                        return found
        return found

    def prompt(self) -> str:
        """The system-prompt lines naming the working directory and its files."""
        files = self.files()
        listed = ", ".join(files) if files else "(empty)"
        more = " ..." if len(files) >= MAX_LISTED else ""
        return (f"Working Directory: {self.path}\n"
                f"Skill scripts run in this directory and may read and write files here; pass file names "
                f"relative to it. Files: {listed}{more}")

    def __repr__(self) -> str:
        return f"<Workspace {self.path}>"


def _write_new(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` without following a symlink a script left there
    (robot-lab writes unconfined: a link to ``~/.bashrc`` must not be written through)."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        raise ConfigurationError(f"cannot attach {target.name}: a folder of that name is in the workspace")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


_SNAPSHOT_LIMIT = 2_000


def snapshot(folder: Path | None) -> dict[str, tuple[int, int]] | None:
    """(mtime_ns, size) of the files under ``folder`` (at most a few thousand)."""
    if folder is None or not folder.is_dir():
        return None
    seen: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)  # a link a script made is not followed
            except OSError:
                continue
            seen[os.path.relpath(full, folder)] = (st.st_mtime_ns, st.st_size)
            if len(seen) >= _SNAPSHOT_LIMIT:
                return seen
    return seen


# What a turn leaves beside its work and no user asked for: office lock and owner files
# (LibreOffice's ``.~lock.<name>#``, Word's ``~$<name>``), editor backups and swap files,
# temp files, Python bytecode. They stay in the workspace but are never returned (one docx
# edit came back as 18 files); ``sandbox.result_ignore`` adds patterns.
IGNORED_OUTPUTS = (".~lock.*#", "~$*", "*~", ".#*", "*.swp", "*.swo", "*.tmp", "*.temp", "*.pyc", "*.pyo",
                   ".DS_Store", "Thumbs.db", "desktop.ini")


def ignored_output(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether ``name`` (relative to the workspace, ``/``-separated) is litter, by glob on its
    file name or on the whole relative path."""
    base = posixpath.basename(name)
    return any(fnmatch.fnmatchcase(base, pattern) or fnmatch.fnmatchcase(name, pattern)
               for pattern in (*IGNORED_OUTPUTS, *extra))


def changed_files(before: dict[str, tuple[int, int]] | None, after: dict[str, tuple[int, int]] | None) -> list[str]:
    """The files written or changed between two :func:`snapshot` s, less lock and temp files."""
    if before is None or after is None:
        return []
    extra = get_settings().sandbox.result_ignore
    return sorted(name for name, stamp in after.items()
                  if before.get(name) != stamp and not ignored_output(name.replace(os.sep, "/"), extra))


def result_files(folder: Path | None, before: dict[str, tuple[int, int]] | None) -> list[ResultFile]:
    """What changed in ``folder`` since ``before`` (a :func:`snapshot`), with sizes, digests
    and media types: a run's :attr:`RobotResult.files`. Links are not followed."""
    if folder is None or before is None:
        return []
    out: list[ResultFile] = []
    for name in changed_files(before, snapshot(folder)):
        full = folder / name
        try:
            if full.is_symlink() or not full.is_file():
                continue
            digest = hashlib.sha256()
            with open(full, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            size = full.stat().st_size
        except OSError:
            continue
        media = mimetypes.guess_type(name)[0] or "application/octet-stream"
        out.append(ResultFile(path=name, size=size, sha256=digest.hexdigest(), media_type=media))
    return out


def envelope_attachments(items: Iterable[Any]) -> list[dict[str, str]]:
    """The envelope's ``attachments`` list: ``(name, bytes)`` pairs become base64 content,
    paths stay paths (resolved on the worker, under its ``sandbox.attach_from``)."""
    out: list[dict[str, str]] = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            name, data = item
            raw = data if isinstance(data, (bytes, bytearray)) else str(data).encode("utf-8")
            out.append({"name": str(name), "content_base64": base64.b64encode(bytes(raw)).decode("ascii")})
        elif isinstance(item, Mapping):
            out.append({str(k): str(v) for k, v in item.items()})
        else:
            out.append({"path": str(item)})
    return out


__all__ = ["IGNORED_OUTPUTS", "Workspace", "changed_files", "envelope_attachments", "ignored_output", "result_files", "snapshot", "workspace_root"]
