"""Settings module for the plain rq CLI: ``rq worker -c robot_lab.workers.rq_config robot:billing``
(or ``RQ_CONFIG=robot_lab.workers.rq_config``).

rq imports this module in the worker's main process before it starts, so:

* the robot runtime and litellm are imported (and warmed up) once, before rq forks a work
  horse per job -- without it every job pays litellm's multi-second import in its horse;
* ``REDIS_URL`` is taken from the environment, so ``--url`` can be left out;
* ``ROBOT_LAB_APP`` (if set) is imported, so its robots' scripts and tools are ready.

No ``-S`` flag is needed: jobs are written with pickle's data-only subset, which rq's
default serializer reads (see :mod:`robot_lab.network.serializer`). Add
``-w robot_lab.network.job_policy.RobotLabWorker`` so the worker runs only robot-lab's task
job (docs/security.md, section 6).
"""

from __future__ import annotations

import os

from robot_lab.workers.process import warm_up

REDIS_URL = os.environ.get("REDIS_URL") or os.environ.get("ROBOT_LAB_REDIS_URL") or "redis://localhost:6379/0"

warm_up()
if os.environ.get("ROBOT_LAB_APP"):
    from robot_lab.app import load_app

    load_app(os.environ["ROBOT_LAB_APP"])
