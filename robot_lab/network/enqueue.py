"""Putting a run's runnable tasks on rq queues: one job per task attempt.

The transitions (:mod:`.transitions`) decide *which* tasks run and name each attempt's job
(``rl-<run>-<task>-<attempt>``); this module only turns those ``(task, job_id, robot)``
triples into rq jobs on queue ``robot:<robot>``. A crash between the two is repaired by
``RunStore.repair_queued``, and a duplicate job is harmless because claims are checked in
Lua. Jobs name their function by import path (``JOB_FUNC``), so the network layer never
imports the workers that run them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_lab.keys import Keys
from robot_lab.network.serializer import JobSerializer

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient
    from robot_lab.network.dag import Graph

JOB_FUNC = "robot_lab.workers.run_task"
BUILD_META = "robot_lab_build"  # rq job meta: the build of the run the task belongs to (network/builds.py)
DEFAULT_JOB_TIMEOUT = 600
# Jobs per round trip when a task's end enqueues many (a fan-out): building 1000 rq jobs takes
# ~0.1 s of CPU, and in one pipeline every other worker waited for all of them
# (bench/dag.py (e)). A crash between chunks leaves the rest queued in the run and not in
# rq, which the sweeper's repair of queued tasks re-enqueues (as for a crash before any).
ENQUEUE_CHUNK = 64


def enqueue_jobs(connection: RedisClient, keys: Keys, run_id: str, items: list[tuple[str, str, str]],
                 graph: Graph | None = None, build: str | None = None) -> None:
    """Put one rq job per (task, job_id, robot) on queue ``robot:<robot>``.

    The job carries everything a plain ``rq worker robot:<robot>`` needs: the key
    prefix, the run id, the task and the attempt's job id (the robot spec and app path are in
    the run record). Data-only serializer (JobSerializer), function by import path, signed
    by the coordinator's key when this process has one (network/job_signing.py). ``build``:
    the run's build (read from the run record when not given), carried in the job's meta
    (``robot_lab_build``) for whoever looks at the queue; the task job's check reads the run.
    """
    if not items:
        return
    if build is None:
        recorded = connection.hget(keys.run(run_id), "build")
        build = (recorded.decode() if isinstance(recorded, bytes) else recorded) or ""
    from rq import Queue, Retry  # lazy: start-up time

    from robot_lab.rq_connection import rq_connection  # lazy: start-up time
    from robot_lab.network.job_signing import job_signature_meta  # lazy: start-up time

    connection = rq_connection(connection)  # on Redis Cluster: the node of rq's slot
    pipe = connection.pipeline()
    queued = 0
    # One Queue per robot queue: each rq Queue asks the server's version once (an INFO), so a
    # Queue per task would cost a 200-wide fan-out 200 extra round trips.
    queues: dict[str, Queue] = {}
    for task, job_id, robot in items:
        spec = graph.tasks.get(task) if graph is not None else None
        retries = spec.retries if spec is not None else 2
        timeout = int(spec.timeout) if spec is not None and spec.timeout else DEFAULT_JOB_TIMEOUT
        queue = queues.get(robot)
        if queue is None:
            queue = queues[robot] = Queue(queue_name(robot), connection=connection, serializer=JobSerializer)
        args = [keys.prefix, run_id, task, job_id]
        queue.enqueue_call(
            func=JOB_FUNC,
            args=args,
            # signed under signing.keys.coordinator; the build is not signed: it routes nothing
            meta={**job_signature_meta(job_id, JOB_FUNC, args), **({BUILD_META: build} if build else {})},
            job_id=job_id,
            timeout=timeout,
            result_ttl=300,
            failure_ttl=86_400,
            retry=Retry(max=retries) if retries > 0 else None,
            description=f"robot-lab task {task} of run {run_id} ({robot}{f', build {build}' if build else ''})",
            pipeline=pipe,
        )
        queued += 1
        if queued % ENQUEUE_CHUNK == 0:  # the first jobs of a wide fan-out run while the rest are built
            pipe.execute()
    pipe.execute()


def queue_name(robot: str) -> str:
    """The rq queue of a robot (a name users see: ``robot:billing``)."""
    return f"robot:{robot}"
