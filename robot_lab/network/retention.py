"""What a finished run leaves in Redis, and for how long.

When a run ends, its own keys get the run TTL (``RunStore.finish_housekeeping``); so does its
default memory scope (``mem:run:<id>`` and its version, change stream and cursors: the scope
the task job binds unless the network names another), and the ``runs`` index drops every
entry older than the TTL, whose records have expired by then. A network that names its own
memory scope (``network:<name>``, shared across runs) keeps it: that scope outlives runs by
design. ``bench/run_retention.py`` shows keys and bytes per finished run before and after.
"""

from __future__ import annotations

import time
from typing import Any

from robot_lab.keys import Keys
from robot_lab.memory.scope import ScopeKeys


def expire_finished_run(pipe: Any, keys: Keys, run_id: str, ttl: int) -> None:
    """Queue on ``pipe``: the run's default memory scope expires with the run, and index
    entries past ``ttl`` (their runs' records are gone) leave the ``runs`` index."""
    for key in ScopeKeys.of(keys, f"run:{run_id}").stored:
        pipe.expire(key, ttl)
    pipe.zremrangebyscore(keys.runs_index(), "-inf", time.time() - ttl)
