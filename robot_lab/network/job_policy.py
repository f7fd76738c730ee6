"""Which rq jobs a robot worker runs: robot-lab's own task job, and only that.

rq stores a job's function as an import string and imports it when the job runs, so anyone
who can write ``rq:*`` could otherwise make a robot's worker call any importable function
with its credentials (``subprocess.getoutput`` on ``robot:technical``). Every robot-lab
worker (``robot-lab worker``, its in-flight worker, embedded workers, and plain ``rq worker
-w robot_lab.network.job_policy.RobotLabWorker``) fetches jobs as :class:`RobotLabJob`,
whose ``perform`` checks the job *before* rq imports anything it names:

* the function is one robot-lab enqueues (:data:`JOB_FUNCTIONS`), with no instance, four
  string arguments and no keyword arguments;
* no success/failure/stopped callback (each is an import string too);
* under ``signing.verify=require`` for the queue's robot, a signature by a key of the job
  signer (``coordinator``, :mod:`.job_signing`) over the job id, function and
  arguments; under ``warn`` a missing or bad one is logged.

A refused job fails (reason ``JobRefused: ...`` in rq's failed registry, never retried), a
``security.job_refused`` event is logged, and the worker goes on to its next job.
"""

from __future__ import annotations

import datetime
import functools
import re
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.network.enqueue import JOB_FUNC
from robot_lab.network.job_signing import signature_problem

log = get_logger("robot_lab.security")

# Every function robot-lab puts in an rq job (grep enqueue: network/enqueue.py only).
JOB_FUNCTIONS = frozenset({JOB_FUNC})
_CALLBACKS = ("_success_callback_name", "_failure_callback_name", "_stopped_callback_name")


class JobRefused(Exception):
    """A job this worker will not run (the reason says why)."""


def _queue_robot(job: Any) -> str:
    origin = str(job.origin or "")
    return origin.split(":", 1)[1] if origin.startswith("robot:") else origin


def refusal(job: Any) -> str | None:
    """Why this worker must not run ``job`` (None: it may). Reads only data: nothing the job
    names is imported."""
    try:
        func, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except Exception as exc:  # noqa: BLE001 - undecodable data is a refusal, not a crash
        return f"job data cannot be read ({type(exc).__name__}: {exc})"
    if func not in JOB_FUNCTIONS:
        return f"{func!r} is not a robot-lab job function (this worker runs only {', '.join(sorted(JOB_FUNCTIONS))})"
    if instance is not None:
        return f"job {job.id!r} calls {func!r} on an instance"
    if kwargs or not isinstance(args, (list, tuple)) or len(args) != 4 or not all(isinstance(a, str) for a in args):
        return f"job {job.id!r}: {func} takes four string arguments and no keyword arguments"
    callbacks = [getattr(job, name, None) for name in _CALLBACKS]
    if any(callbacks):
        return f"job {job.id!r} names callbacks ({', '.join(str(c) for c in callbacks if c)})"
    from robot_lab.bus.keyring import verify_mode

    mode = verify_mode(_queue_robot(job))
    if mode != "off":
        problem = signature_problem(str(job.id), func, list(args), job.meta)
        if problem and mode == "require":
            return problem
        if problem:
            log.warning("security.job_unsigned", job_id=job.id, queue=job.origin, error=problem, mode=mode)
    return None


def check_job(job: Any) -> None:
    """Raise :class:`JobRefused` (after disarming the job's retries and callbacks and logging
    ``security.job_refused``) unless ``job`` may run."""
    reason = refusal(job)
    if reason is None:
        return
    for name in _CALLBACKS:  # rq's failure path would import them
        setattr(job, name, None)
    job.retries_left = None
    log.error("security.job_refused", job_id=job.id, queue=job.origin, reason=reason)
    raise JobRefused(reason)


# The timestamps of rq's job hash, as rq writes them (rq.utils.utcformat: '%Y-%m-%dT%H:%M:%S.%fZ').
_JOB_DATES = ("created_at", "enqueued_at", "started_at", "ended_at", "last_heartbeat")
_RQ_TIMESTAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def rq_timestamp(value: Any) -> datetime.datetime | None:
    """``rq.utils.str_to_date(value)`` for a timestamp in the exact form rq writes, without
    ``strptime`` (~10 us each, two per job fetched: a tenth of the in-flight worker's batch
    fetch); None for anything else, which the caller leaves to rq."""
    raw = value.encode() if isinstance(value, str) else value
    if not isinstance(raw, bytes) or _RQ_TIMESTAMP.fullmatch(raw) is None:
        return None
    try:
        return datetime.datetime.fromisoformat(raw[:26].decode()).replace(tzinfo=datetime.timezone.utc)
    except ValueError:  # a month 13: rq's own parse raises the same way
        return None


@functools.cache
def job_class() -> type:
    """The policed rq job class (built once, on first use: rq is imported lazily)."""
    from rq.job import Job

    class RobotLabJob(Job):
        """An rq job that runs only if :func:`check_job` lets it (see the module docstring)."""

        def perform(self) -> Any:
            check_job(self)
            return super().perform()

        def restore(self, raw_data: Any) -> Any:
            """rq's restore, with the timestamps in rq's own form parsed by
            :func:`rq_timestamp` (same values; any other form goes through rq's parse)."""
            data, dates = dict(raw_data), {}
            for name in _JOB_DATES:
                for key in (name.encode(), name):
                    value = data.get(key)
                    if value:
                        parsed = rq_timestamp(value)
                        if parsed is not None:
                            dates[name] = parsed
                            del data[key]
            result = super().restore(data)
            for name, parsed in dates.items():
                setattr(self, name, parsed)
            return result

    RobotLabJob.__module__ = __name__
    return RobotLabJob


@functools.cache
def plain_worker_class() -> type:
    """rq's forking worker with the job policy, for ``rq worker -w``."""
    from rq.worker import Worker

    from robot_lab.network.serializer import JobSerializer

    class RobotLabWorker(Worker):
        """``rq worker -w robot_lab.network.job_policy.RobotLabWorker robot:billing``: jobs
        are fetched as ``RobotLabJob`` and always decoded with the data-only serializer
        (rq's default pickle would run code hidden in a job's ``meta`` as it is read)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["serializer"] = JobSerializer
            kwargs["job_class"] = job_class()
            super().__init__(*args, **kwargs)

    RobotLabWorker.__module__ = __name__
    return RobotLabWorker


def __getattr__(name: str) -> Any:
    """``RobotLabJob`` and ``RobotLabWorker`` by the names rq's ``-j``/``-w`` import."""
    if name == "RobotLabJob":
        return job_class()
    if name == "RobotLabWorker":
        return plain_worker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
