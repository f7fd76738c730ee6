"""MCP connections shared by a process: one manager per robot and server set, reused by every
run of that robot in the process, closed when idle, when the pool is full, or at shutdown.

Why: a worker builds a fresh Robot for each network task (the spec recorded with the run) and
one per in-flight slot for served messages. Each Robot connecting its own MCP servers started
a stdio server process per task, never stopped (~70 MB each). Runs borrow a manager here
instead (:meth:`MCPPool.lease`); a manager is closed only while no run holds it:

* ``idle_timeout`` (setting ``mcp_idle_timeout``, default 300 s): a manager no run has used for
  that long is closed by the pool's reaper thread (its servers stop); the next run connects
  again.
* ``max_size`` (setting ``mcp_pool_size``, default 32): at most that many managers are kept;
  past it the least recently used idle one is closed. When every manager is in use a new one
  is still made (a run never waits for a connection) and trimmed as soon as it is released.
* :func:`close_shared` closes them all (``robot-lab worker`` on shutdown; also at exit).

A manager is thread-safe and its clients take concurrent requests, so runs on several
in-flight threads share it.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.runtime.mcp.servers import MCPManager
from robot_lab.settings import get_settings

_log = get_logger("robot_lab.mcp")

DEFAULT_POOL_SIZE = 32
DEFAULT_IDLE_TIMEOUT = 300.0


@dataclass
class _Entry:
    manager: MCPManager
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)


class MCPPool:
    """Managers by (owner, server configs), leased per run."""

    def __init__(self, max_size: int = DEFAULT_POOL_SIZE, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.max_size = max(1, max_size)
        self.idle_timeout = idle_timeout
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()

    @staticmethod
    def _key(owner: str, servers: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
        return owner, json.dumps([dict(s) for s in servers], sort_keys=True, default=str)

    @contextmanager
    def lease(self, owner: str, servers: Sequence[Mapping[str, Any]]) -> Iterator[MCPManager]:
        """The shared manager of ``owner``'s ``servers`` for the duration of one run."""
        key = self._key(owner, servers)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(MCPManager(servers, owner=owner))
                if len(self._entries) > self.max_size and all(e.users for e in self._entries.values()):
                    _log.warning("mcp.pool_full", robot=owner, size=len(self._entries), max_size=self.max_size)
            entry.users += 1
            self._start_reaper()
        try:
            yield entry.manager
        finally:
            with self._lock:
                entry.users -= 1
                entry.last_used = time.monotonic()
                closing = self._trim()
            self._close(closing)

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> list[_Entry]:
        """Under the lock: drop idle entries past the timeout, then the least recently used
        idle ones past ``max_size``; returns them (closed outside the lock)."""
        now = time.monotonic()
        drop = [k for k, e in self._entries.items() if not e.users and now - e.last_used >= self.idle_timeout]
        idle = sorted((e.last_used, k) for k, e in self._entries.items() if not e.users and k not in drop)
        excess = len(self._entries) - len(drop) - self.max_size
        drop += [k for _, k in idle[:max(excess, 0)]]
        return [self._entries.pop(k) for k in drop]

    @staticmethod
    def _close(entries: list[_Entry]) -> None:
        for entry in entries:
            try:
                entry.manager.close()
            except Exception as exc:  # closing is best effort; the server process gets EOF anyway
                _log.warning("mcp.close_failed", robot=entry.manager.owner, error=f"{type(exc).__name__}: {exc}")

    def _start_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._stop.clear()
            self._reaper = threading.Thread(target=self._reap, name="mcp-pool-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        every = min(max(self.idle_timeout / 4, 0.05), 30.0)
        while not self._stop.wait(every):
            with self._lock:
                closing = self._trim()
            self._close(closing)

    def close(self) -> None:
        """Close every manager (runs still holding one keep it until they end)."""
        self._stop.set()
        with self._lock:
            closing, self._entries = list(self._entries.values()), {}
        self._close(closing)


_pool: MCPPool | None = None
_pool_lock = threading.Lock()


def shared_pool() -> MCPPool:
    """The process's pool, sized from the settings on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            settings = get_settings()
            _pool = MCPPool(settings.mcp_pool_size, settings.mcp_idle_timeout)
        return _pool


def close_shared() -> None:
    """Close the process's MCP connections (a worker's shutdown; also run at exit)."""
    with _pool_lock:
        pool = _pool
    if pool is not None:
        pool.close()


atexit.register(close_shared)

__all__ = ["DEFAULT_IDLE_TIMEOUT", "DEFAULT_POOL_SIZE", "MCPPool", "close_shared", "shared_pool"]
