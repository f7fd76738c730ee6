"""Waiting for a process the test told to stop (SIGTERM): the one bound every such test uses."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

# A warm stop finishes the work in hand first (a task, a reply, a model call of a second or
# two) and then tears down; on a loaded 2-core machine that has taken tens of seconds. The
# bound is how long a stop may take before the test calls it hung, not how long it should.
STOP_WITHIN = 120.0


def stopped(proc: subprocess.Popen[Any], timeout: float = STOP_WITHIN) -> int:
    """``proc``'s exit status once it has exited, within ``timeout`` s of now.

    A process still running then fails the test with what it was doing: how long it was
    waited for, and the tail of its log (``proc.log_path``, as tests/worker_procs.py's
    ``Processes.start`` records it), rather than a bare ``TimeoutExpired``."""
    started = time.monotonic()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    log_path = getattr(proc, "log_path", None)
    tail = Path(log_path).read_text(errors="replace")[-3000:] if log_path else "(no log recorded)"
    raise AssertionError(
        f"{' '.join(map(str, proc.args)) if isinstance(proc.args, list) else proc.args} (pid {proc.pid}) "
        f"still running {time.monotonic() - started:.0f} s after it was told to stop; its log ends:\n{tail}")
