"""Find and kill every process one unconfined script call started, ``setsid`` ones included.

Under bwrap the call's pid namespace does this: when the script exits or is killed, the
kernel kills everything left in the namespace. Unconfined calls (``trust: core``, or
``sandbox.when_unavailable = unconfined``) have no namespace, and a child that calls
``setsid`` leaves the script's process group and session, so ``killpg`` misses it. Each
such call therefore carries a random token in its environment (``ROBOT_LAB_SCRIPT_CALL``),
inherited by every descendant that does not scrub its environment, and at the end the
reaper kills every process of this user whose environment holds the token (the caller
kills the process group as well). A process that scrubs its environment *and* calls
``setsid`` escapes this; only a pids cgroup catches it. A pids cgroup (``limits.CallCgroup``), where one
can be made, is exact and is used as well.
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


def _state(pid: str) -> str | None:
    """The state letter of ``pid`` from /proc/<pid>/stat (the name may hold spaces and ``)``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    return fields[0].decode("ascii", "replace") if fields else None


def _environ(pid: str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def members(token: str) -> list[int]:
    """Live processes carrying the call's token in their environment (zombies are skipped:
    they are dead already). Matching by token, not by process group, cannot hit another
    call whose leader reused a pid."""
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
        state = _state(entry)
        if state is None or state in ("Z", "X"):
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


def kill_call(token: str) -> int:
    """SIGKILL every process carrying the call's token, until none is left."""
    return kill_until_gone(lambda: members(token))
