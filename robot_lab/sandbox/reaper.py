"""Find and kill every process one unconfined script call started, ``setsid`` ones included.

Under bwrap the call's pid namespace does this: when the script exits or is killed, the
kernel kills everything left in the namespace. Unconfined calls (``trust: core``, or
``sandbox.when_unavailable = unconfined``) have no namespace, and a child that calls
``setsid`` leaves the script's process group and session, so ``killpg`` misses it. Where
the call has a pids cgroup (``limits.CallCgroup``) its member list is exact and is used
instead. Otherwise the call carries a random token in its environment
(``ROBOT_LAB_SCRIPT_CALL``), inherited by every descendant that does not scrub its
environment, and at the end the reaper kills every process of this user started since the
call whose environment holds the token (the caller kills the process group as well). A
process that scrubs its environment *and* calls ``setsid`` escapes the token.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable

TOKEN_NAME = "ROBOT_LAB_SCRIPT_CALL"


def new_token() -> str:
    return secrets.token_hex(12)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def now_ticks() -> int:
    """Clock ticks since boot, the unit of a process's start time in /proc/<pid>/stat."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def _stat(pid: str) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of ``pid`` (the name may hold spaces and ``)``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


def _environ(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def members(token: str, since: int = 0) -> list[int]:
    """Live processes carrying the call's token in their environment, among those started
    at or after ``since`` (ticks, :func:`now_ticks` when the call began, so the environment
    of older processes is never read). Zombies are skipped: they are dead already. Matching
    by token, not by process group, cannot hit another call whose leader reused a pid."""
    marker = f"{TOKEN_NAME}={token}".encode()
    own = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        stat = _stat(entry)
        if stat is None or stat[0] in ("Z", "X") or stat[1] < since:
            continue
        if marker in _environ(entry):
            found.append(int(entry))
    return found


def kill_until_gone(members: Callable[[], list[int]], rounds: int = 50) -> int:
    """SIGKILL what ``members()`` lists until it lists nothing (a member that forks between
    two rounds is caught by the next); how many signals were sent."""
    killed = 0
    for _ in range(rounds):
        pids = members()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
    return killed


def kill_call(token: str, since: int = 0) -> int:
    """SIGKILL every process carrying the call's token (started since ``since``), until none
    is left."""
    return kill_until_gone(lambda: members(token, since))
