"""Process and memory limits of one script call: rlimits through a wrapper, and a pids cgroup.

Two mechanisms, because neither works everywhere:

* **rlimits**, set by ``prlimit`` (util-linux) just before the script starts: ``RLIMIT_DATA``
  (each process's heap and anonymous memory, in every mode) and, inside bwrap only,
  ``RLIMIT_NPROC``. The kernel counts ``RLIMIT_NPROC`` per user *in a user namespace*, and
  bwrap gives every call a new one, so the limit counts that call's processes alone, not
  every process of the worker's uid. The kernel does not apply it to root (uid 0 outside
  the namespace), which is why there is a second mechanism.
* **a pids cgroup** per call, where this process may create one (root with a writable
  cgroup v1 ``pids`` hierarchy, or a delegated ``sandbox.cgroup_parent``): ``pids.max``
  bounds the whole call, whatever the uid, and its member list lets the caller kill every
  process of the call at the end, including ones that left the session (``setsid``).

:func:`limit_status` says which of them apply here, for ``skills show`` and the docs.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.sandbox.reaper import kill_until_gone

log = get_logger("robot_lab.sandbox.limits")

_JOIN = 'echo $$ > "$0" || exit 125; exec "$@"'
_counter = itertools.count()
_probe_lock = threading.Lock()
_probe: dict[str, tuple[str | None, str]] = {}


@dataclass(frozen=True, slots=True)
class Limits:
    """``processes``: most processes and threads of one call; ``memory_mb``: RLIMIT_DATA of
    each of its processes, in MiB. 0 means no limit."""

    processes: int = 0
    memory_mb: int = 0

    @classmethod
    def from_sandbox(cls, sandbox: Any) -> Limits:
        return cls(int(getattr(sandbox, "max_processes", 0) or 0), int(getattr(sandbox, "max_memory_mb", 0) or 0))

    def note(self) -> str:
        """The line appended to a failed call's text, naming the settings to raise."""
        parts = []
        if self.processes:
            parts.append(f"{self.processes} processes (sandbox.max_processes)")
        if self.memory_mb:
            parts.append(f"{self.memory_mb} MiB of memory per process (sandbox.max_memory_mb)")
        return f"[limits of this call: {', '.join(parts)}]" if parts else ""


def rlimit_prefix(limits: Limits, *, nproc: bool) -> list[str]:
    """``prlimit --data=B [--nproc=N] --`` (empty when nothing is limited or prlimit is missing)."""
    args = []
    if limits.memory_mb:
        args.append(f"--data={limits.memory_mb * 1024 * 1024}")
    if nproc and limits.processes:
        args.append(f"--nproc={limits.processes}")
    exe = shutil.which("prlimit")
    if not args or exe is None:
        return []
    return [exe, *args, "--"]


# --- cgroups --------------------------------------------------------------------------------


def _own_cgroup_dirs() -> list[str]:
    """Where this process's pids cgroup lives: v1 ``pids`` hierarchy first, then v2."""
    found: list[str] = []
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            found.append(os.path.join("/sys/fs/cgroup/pids", path.lstrip("/")))
    for line in lines:
        if line.startswith("0::"):
            path = line[3:].lstrip("/")
            found += [os.path.join("/sys/fs/cgroup", path), os.path.join("/sys/fs/cgroup/unified", path)]
    return found


def _try_parent(parent: str) -> str | None:
    """None when a per-call pids cgroup can be made under ``parent``, else why not."""
    if not os.path.isdir(parent):
        return f"{parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable by this process"
    probe = os.path.join(parent, f"robot_lab-probe-{os.getpid()}-{next(_counter)}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return f"cannot create a cgroup in {parent}: {exc.strerror or exc}"
    try:
        if not os.path.exists(os.path.join(probe, "pids.max")):
            return f"the pids controller is not enabled in {parent}"
        # a process must be able to move itself in (cgroup v2 also asks for write access to
        # the common ancestor), exactly as every call's join prefix will
        try:
            moved = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$0"', os.path.join(probe, "cgroup.procs")],
                                   capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot move a process into a cgroup under {parent}: {exc}"
        if moved.returncode != 0:
            err = moved.stderr.decode("utf-8", "replace").strip()
            return f"cannot move a process into a cgroup under {parent}: {err or moved.returncode}"
        return None
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def cgroup_parent(sandbox: Any) -> tuple[str | None, str]:
    """The folder per-call cgroups go in (or None) and why; probed once per setting."""
    mode = getattr(sandbox, "cgroup", "auto")
    configured = getattr(sandbox, "cgroup_parent", None)
    key = f"{mode}|{configured}"
    with _probe_lock:
        if key in _probe:
            return _probe[key]
        if mode == "off":
            result: tuple[str | None, str] = (None, "sandbox.cgroup is off")
        else:
            candidates = [configured] if configured else _own_cgroup_dirs()
            reasons = []
            result = (None, "no cgroup hierarchy found")
            for candidate in candidates:
                why = _try_parent(candidate)
                if why is None:
                    result = (candidate, f"a pids cgroup per call under {candidate}")
                    _remove_stale(candidate)
                    break
                reasons.append(why)
            else:
                if reasons:
                    result = (None, "; ".join(reasons))
        _probe[key] = result
        return result


def _remove_stale(parent: str) -> None:
    """Empty per-call cgroups left by a worker that died (their pid is gone)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith("robot_lab-call-"):
            continue
        try:
            pid = int(name.split("-")[2])
            os.kill(pid, 0)
            continue  # its worker is alive
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            pass


class CallCgroup:
    """One script call's pids cgroup: join it before exec, kill everything in it, remove it."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls, sandbox: Any, limits: Limits) -> CallCgroup | None:
        parent, _ = cgroup_parent(sandbox)
        if parent is None:
            return None
        path = os.path.join(parent, f"robot_lab-call-{os.getpid()}-{next(_counter)}")
        try:
            os.mkdir(path)
            if limits.processes:
                with open(os.path.join(path, "pids.max"), "w", encoding="ascii") as handle:
                    handle.write(str(limits.processes))
        except OSError as exc:
            log.warning("sandbox.cgroup_failed", path=path, error=str(exc))
            try:
                os.rmdir(path)
            except OSError:
                pass
            return None
        return cls(path)

    def join_prefix(self) -> list[str]:
        """A ``sh`` that moves itself into the cgroup, then execs the command (no race with
        the command's first fork, unlike moving it from outside)."""
        return ["/bin/sh", "-c", _JOIN, os.path.join(self.path, "cgroup.procs")]

    def members(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs"), encoding="ascii") as handle:
                return [int(line) for line in handle.read().split()]
        except (OSError, ValueError):
            return []

    def hit_limit(self) -> bool:
        """Whether a fork failed because of ``pids.max``."""
        try:
            with open(os.path.join(self.path, "pids.events"), encoding="ascii") as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "max" and int(value) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self) -> int:
        """SIGKILL every member until none is left."""
        return kill_until_gone(self.members, rounds=100)

    def remove(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                self.kill_all()
                time.sleep(0.01)
        log.warning("sandbox.cgroup_left", path=self.path)


def limit_status(sandbox: Any, *, bwrap: bool) -> dict[str, str]:
    """How each limit is enforced on this machine (``skills show``)."""
    limits = Limits.from_sandbox(sandbox)
    parent, why = cgroup_parent(sandbox)
    prlimit = shutil.which("prlimit") is not None
    root = os.geteuid() == 0
    if not limits.processes:
        processes = "no limit (sandbox.max_processes = 0)"
    elif parent is not None:
        processes = f"at most {limits.processes}: {why}"
    elif bwrap and prlimit and not root:
        processes = f"at most {limits.processes}: RLIMIT_NPROC in the call's user namespace"
    else:
        missing = "prlimit is not installed" if not prlimit else (
            "the kernel ignores RLIMIT_NPROC for root" if root else "RLIMIT_NPROC is only set inside bwrap")
        processes = f"NOT enforced here: {missing}, and no pids cgroup ({why})"
    if not limits.memory_mb:
        memory = "no limit (sandbox.max_memory_mb = 0)"
    elif prlimit:
        memory = f"at most {limits.memory_mb} MiB per process (RLIMIT_DATA)"
    else:
        memory = "NOT enforced here: prlimit (util-linux) is not installed"
    return {"processes": processes, "memory": memory}

