"""A submit is all or nothing: a run is either fully created (record, graph, index, first rq
jobs) or not visible at all.

:meth:`Coordinator.submit <robot_lab.network.coordinator.Coordinator.submit>` writes the run in
steps that live in different cluster slots (the indexes, the run's own keys, rq's jobs), so no
one transaction can hold them. Instead the run record carries ``submitting`` until the last
step (the first jobs enqueued) succeeded, and the submit then removes the field with ``HDEL``,
which Redis runs even when it is out of memory. A step that fails makes the submit remove
what it wrote (:func:`discard`: deletions are allowed under ``maxmemory`` too) and raise. When
even that fails (Redis went away), every sweeper removes a run still ``submitting`` after
:data:`GRACE` seconds, and index entries with no run behind them (:func:`sweep_leftover`), so
a failed submit never leaves a half-written run that some worker starts later.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.network.transitions import RUN_KEY_SUFFIXES
from robot_lab.rq_connection import rq_connection

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.network.submit")

SUBMITTING = "submitting"  # run-record field while a submit is in progress
GRACE = 60.0  # seconds after which a run still submitting is a failed submit's leftover


def discard(connection: RedisClient, keys: Keys, run_id: str, job_ids: list[str]) -> None:
    """Remove every trace of a run whose submit failed: its keys, its index entries and the
    rq jobs already enqueued for it (each removed from its queue)."""
    run = keys.run(run_id)
    job_ids = sorted({*job_ids, *(_s(j) for j in connection.hvals(run + ":jobs"))})
    pipe = connection.pipeline(transaction=False)
    for suffix in (*RUN_KEY_SUFFIXES, ":tool_calls"):
        pipe.delete(run + suffix)
    pipe.srem(keys.runs_active(), run_id)
    pipe.zrem(keys.runs_index(), run_id)
    pipe.execute()
    if job_ids:
        from rq.job import Job  # lazy: start-up time

        from robot_lab.network.serializer import JobSerializer  # lazy: start-up time

        rq = rq_connection(connection)
        for job in Job.fetch_many(job_ids, connection=rq, serializer=JobSerializer):
            if job is not None:
                job.delete()
    log.warning("run.submit_discarded", run_id=run_id, jobs=len(job_ids))


def sweep_leftover(connection: RedisClient, keys: Keys, run_id: str, status: str | None, submitting: str | None) -> bool:
    """Remove ``run_id`` when a failed submit left it (True): a record (``status``) still
    ``submitting`` (the time its submit began) after :data:`GRACE`, or index entries older
    than that with no record."""
    if status is None:
        created = connection.zscore(keys.runs_index(), run_id)
        if created is not None and time.time() - float(created) < GRACE:
            return False  # indexed a moment ago; its record is being written
    elif submitting is None or time.time() - float(submitting) < GRACE:
        return False
    discard(connection, keys, run_id, [])
    return True


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
