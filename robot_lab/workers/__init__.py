"""Workers: the processes that serve robots.

``RobotWorker`` (:mod:`.process`) is ``robot-lab worker``: an rq loop for the robots' network
tasks, a bus poller per robot, the lost-work sweeper and graceful shutdown; :mod:`.inflight`
runs many tasks and messages at once in one process (``--in-flight N``, :class:`RobotPool`).
``robot_lab.workers.run_task`` is the name every task job carries (the job itself is
:func:`robot_lab.network.task_job.run_task`), so ``rq worker robot:<name>`` executes a
robot's tasks with nothing but this package importable.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RobotPool", "run_task"]


def __getattr__(name: str) -> Any:
    # lazy: start-up time -- `robot-lab status` imports workers.status, not the robot runtime
    if name == "run_task":
        from robot_lab.network.task_job import run_task  # lazy: start-up time

        return run_task
    if name == "RobotPool":
        from robot_lab.workers.inflight import RobotPool  # lazy: start-up time

        return RobotPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
