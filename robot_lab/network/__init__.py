"""The DAG engine: networks of robots run as rq jobs over a run's state in Redis.

:mod:`.dsl` (the Network builder users write), :mod:`.dag` (validation and the compiled
graph), :mod:`.run_state` (the run's state in Redis), :mod:`.graphs` (compiled graphs,
cached per process), :mod:`.transitions` (the Lua scripts that move a run forward),
:mod:`.enqueue` (runnable tasks onto rq queues), :mod:`.coordinator` (submit, wait, collect,
sweep), :mod:`.serializer` (the data-only rq job format), :mod:`.embedded` (in-process rq
workers for the server-less mode), :mod:`.task_job` (the rq job that runs one task),
:mod:`.lease` (its lease heartbeat and text.delta stream) and :mod:`.routing` (which
optional tasks a result activates).
"""

from __future__ import annotations

from robot_lab.network.dsl import Network, create_network

__all__ = ["Network", "create_network"]
