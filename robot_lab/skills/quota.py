"""How much a conversation's workspace may hold, and when an old one is removed.

A skill script writes into its conversation's workspace (skills/workspace.py) without any
other bound than the disk: a loop that writes forever fills the worker's volume for every
robot on it. :func:`usage_over` measures a workspace against ``sandbox.workspace_max_bytes``
and ``sandbox.workspace_max_files``; ``sandbox.execute`` calls it a few times a second while
a script runs and stops the script when it is over, with a tool result that says so. Old
workspaces (untouched for ``sandbox.workspace_ttl`` seconds) are removed when a new one is
opened (:func:`remove_stale`), at most once a minute per process.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from robot_lab.logging import get_logger

log = get_logger("robot_lab.skills.quota")

_last_sweep: dict[str, float] = {}
SWEEP_EVERY = 60.0


def usage_over(folder: str, max_bytes: int, max_files: int) -> str | None:
    """Why ``folder`` is over its quota (None: it is not). Stops counting once over."""
    size = files = 0
    for root, dirs, names in os.walk(folder):
        files += len(names) + len(dirs)
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
        if (max_bytes and size > max_bytes) or (max_files and files > max_files):
            return (f"the working directory holds over {min(size, max_bytes + 1) if max_bytes else size} bytes in "
                    f"{files} files; the quota is {max_bytes or 'unlimited'} bytes and {max_files or 'unlimited'} "
                    "files (sandbox.workspace_max_bytes, sandbox.workspace_max_files)")
    return None


def quota_watch(folder: str | None, sandbox: Any) -> Callable[[], str | None] | None:
    """The check ``execute`` polls while a script runs in ``folder`` (None: no quota)."""
    max_bytes = int(getattr(sandbox, "workspace_max_bytes", 0) or 0)
    max_files = int(getattr(sandbox, "workspace_max_files", 0) or 0)
    if folder is None or not (max_bytes or max_files):
        return None
    return lambda: usage_over(folder, max_bytes, max_files)


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
