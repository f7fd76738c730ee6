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

from typing import TYPE_CHECKING

from robot_lab.lazy import lazy_exports

__all__ = ["Network", "create_network"]

# the DSL loads on first use: a process that only names a run's queues or reads its state
# (``robot-lab status``, a worker's sweep) does not build networks
__getattr__, __dir__ = lazy_exports("robot_lab.network", dict.fromkeys(__all__, "robot_lab.network.dsl"),
                                    globals(), __all__)


if TYPE_CHECKING:  # pragma: no cover
    from robot_lab.network.dsl import Network, create_network  # noqa: F401
