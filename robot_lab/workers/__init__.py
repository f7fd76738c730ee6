"""Workers: rq job functions for network tasks, the robot registry, and ``robot-lab worker``.

``robot_lab.workers.run_task`` is the function every task job names (by import path, plain
data only: :mod:`.serializer`), so ``rq worker robot:<name>`` executes a robot's tasks with nothing but
this package importable. ``RobotWorker`` (:mod:`.process`) adds the robot's bus poller, the
lost-work sweeper and graceful shutdown; :mod:`.inflight` runs many tasks and messages at
once in one process (``--in-flight N``, :class:`RobotPool`); :mod:`.embedded` runs workers as
threads on the in-process fakeredis.
"""

from __future__ import annotations

from robot_lab.workers.inflight import RobotPool
from robot_lab.workers.jobs import run_task

__all__ = ["RobotPool", "run_task"]
