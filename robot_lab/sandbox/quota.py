"""How much a conversation's workspace may hold, and when an old one is removed.

A skill script writes into its conversation's workspace (sandbox/workspace.py) without any
other bound than the disk: a loop that writes forever fills the worker's volume for every
robot on it. A :class:`Quota` measures a workspace against ``sandbox.workspace_max_bytes``
and ``sandbox.workspace_max_files``, counting each file's allocated blocks as well as its
size; ``sandbox.execute`` polls it a few times a second while a script runs and stops the
script when it is over, with a tool result that says so. A poll comes too late for one
``fallocate`` (gigabytes in one system call), so after the call :meth:`Quota.trim` takes
back what the call added (its new files, the growth of old ones) until the workspace is
within the quota again: no call leaves it over. Old workspaces (untouched for
``sandbox.workspace_ttl`` seconds) are removed when a new one is opened
(:func:`remove_stale`), at most once a minute per process."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from robot_lab.logging import get_logger

log = get_logger("robot_lab.sandbox.quota")

_last_sweep: dict[str, float] = {}
SWEEP_EVERY = 60.0


def _footprint(st: os.stat_result) -> int:
    """The bytes a file counts for: its allocated blocks (``fallocate`` takes disk without
    writing, and ``fallocate -n`` past the end without growing the size) or its size (a
    sparse file is read in full when a run's files are returned), whichever is larger."""
    return max(st.st_size, st.st_blocks * 512)


def usage_past(folder: str, max_bytes: int, max_files: int) -> tuple[int, int] | None:
    """(bytes, files) counted so far once ``folder`` is past either limit (None: it is
    not). Stops counting once past."""
    size = files = 0
    for root, dirs, names in os.walk(folder):
        files += len(names) + len(dirs)
        for name in names:
            try:
                size += _footprint(os.lstat(os.path.join(root, name)))
            except OSError:
                continue
        if (max_bytes and size > max_bytes) or (max_files and files > max_files):
            return size, files
    return None


def _entries(folder: str) -> dict[str, tuple[int, int, bool]]:
    """Every file and folder under ``folder``: relative path -> (size, footprint, is_dir)."""
    found: dict[str, tuple[int, int, bool]] = {}
    for root, dirs, names in os.walk(folder):
        for name in (*names, *dirs):
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            found[os.path.relpath(full, folder)] = (st.st_size, _footprint(st), stat.S_ISDIR(st.st_mode))
    return found


class Quota:
    """One call's view of its workspace quota: polled while the script runs
    (:meth:`over`), then used to bring the workspace back under it (:meth:`trim`).

    The limits are ``sandbox.workspace_max_bytes`` / ``_max_files``, or what the workspace
    held when the call started when that is more (a quota the operator lowered): such a
    call may delete files but not make the workspace hold more.
    """

    def __init__(self, folder: str, max_bytes: int, max_files: int) -> None:
        self.folder = folder
        self.start = _entries(folder)
        held = sum(footprint for _, footprint, _ in self.start.values())
        self.max_bytes = max(max_bytes, held) if max_bytes else 0
        self.max_files = max(max_files, len(self.start)) if max_files else 0
        self.quota = (max_bytes, max_files)

    @classmethod
    def of(cls, folder: str | None, sandbox: Any) -> Quota | None:
        """The quota of a call in ``folder`` (None: no workspace, or no quota)."""
        max_bytes = int(getattr(sandbox, "workspace_max_bytes", 0) or 0)
        max_files = int(getattr(sandbox, "workspace_max_files", 0) or 0)
        if folder is None or not (max_bytes or max_files):
            return None
        return cls(folder, max_bytes, max_files)

    def over(self) -> str | None:
        """Why the workspace is over (None: it is not)."""
        past = usage_past(self.folder, self.max_bytes, self.max_files)
        if past is None:
            return None
        size, files = past
        max_bytes, max_files = self.quota
        held = "" if (self.max_bytes, self.max_files) == self.quota else \
            ", and it may not hold more than when the call started"
        return (f"the working directory holds over {min(size, self.max_bytes + 1) if self.max_bytes else size} "
                f"bytes in {files} files; the quota is {max_bytes or 'unlimited'} bytes and "
                f"{max_files or 'unlimited'} files (sandbox.workspace_max_bytes, sandbox.workspace_max_files){held}")

    def trim(self) -> list[str]:
        """Undo this call's growth until the workspace is within its limits again: files
        it made are removed, files it grew are cut back to their size at the start, the
        largest growth first; then folders it made. Files of earlier calls are untouched.
        Returns what was removed or cut, for the tool result."""
        now = _entries(self.folder)
        total = sum(footprint for _, footprint, _ in now.values())
        count = len(now)

        def fits() -> bool:
            return (not self.max_bytes or total <= self.max_bytes) and (not self.max_files or count <= self.max_files)

        if fits():
            return []
        grown = sorted(((footprint - self.start[rel][1] if rel in self.start else footprint, rel)
                        for rel, (_, footprint, is_dir) in now.items()
                        if not is_dir and (rel not in self.start or footprint > self.start[rel][1])), reverse=True)
        done: list[str] = []
        for growth, rel in grown:
            if fits():
                break
            full = os.path.join(self.folder, rel)
            try:
                if rel in self.start:
                    size = self.start[rel][0]
                    fd = os.open(full, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
                    try:
                        os.ftruncate(fd, size)
                    finally:
                        os.close(fd)
                    done.append(f"{rel} (cut back to {size} bytes)")
                else:
                    os.unlink(full)
                    count -= 1
                    done.append(f"{rel} ({now[rel][1]} bytes)")
            except OSError:
                continue
            total -= growth
        made = sorted((rel for rel, (_, _, is_dir) in now.items() if is_dir and rel not in self.start),
                      key=lambda rel: rel.count(os.sep), reverse=True)
        for rel in made:
            if fits():
                break
            shutil.rmtree(os.path.join(self.folder, rel), ignore_errors=True)
            done.append(f"{rel}/")
            left = _entries(self.folder)
            total, count = sum(footprint for _, footprint, _ in left.values()), len(left)
        if done:
            log.warning("workspace.trimmed", folder=self.folder, removed=done)
        return done


def remove_stale(root: Path, ttl: float, keep: Path | None = None) -> int:
    """Remove workspaces under ``root`` not modified for ``ttl`` seconds; returns how many."""
    now = time.time()
    key = str(root)
    if ttl <= 0 or now - _last_sweep.get(key, 0.0) < SWEEP_EVERY:
        return 0
    _last_sweep[key] = now
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        try:
            if keep is not None and Path(entry.path) == keep:
                continue
            if entry.is_dir(follow_symlinks=False) and now - entry.stat(follow_symlinks=False).st_mtime > ttl:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    if removed:
        log.info("workspace.stale_removed", root=key, removed=removed, ttl=ttl)
    return removed
