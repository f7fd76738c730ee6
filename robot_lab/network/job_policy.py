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
* under ``signing.verify=require`` for the robot of the queue the worker took the job from
  (never the job's own ``origin``: whoever wrote the job wrote that too), a signature by a
  key of the job signer (``coordinator``, :mod:`.job_signing`) over the job id, function and
  arguments; under ``warn`` a missing or bad one is logged;
* its data can be read at all: a job hash whose ``data`` is missing, garbage or a pickle of
  anything but plain values is read as an *unreadable* job (never an exception out of rq's
  dequeue, which ended the worker's loop) and refused here.

A refused job fails (reason ``JobRefused: ...`` in rq's failed registry, never retried), a
``security.job_refused`` event is logged, and the worker goes on to its next job.
"""

from __future__ import annotations

import datetime
import functools
import re
from typing import Any

from robot_lab.bus.keyring import verify_mode
from robot_lab.logging import get_logger
from robot_lab.network.enqueue import JOB_FUNC
from robot_lab.network.job_signing import signature_problem
from robot_lab.network.serializer import JobSerializer
from robot_lab.settings import get_settings

log = get_logger("robot_lab.security")

# Every function robot-lab puts in an rq job (grep enqueue: network/enqueue.py only).
JOB_FUNCTIONS = frozenset({JOB_FUNC})
_CALLBACKS = ("_success_callback_name", "_failure_callback_name", "_stopped_callback_name")


class JobRefused(Exception):
    """A job this worker will not run (the reason says why)."""


def _queue_robot(queue: str) -> str:
    return queue.split(":", 1)[1] if queue.startswith("robot:") else queue


_STRICTNESS = {"off": 0, "warn": 1, "require": 2}


def _verify_mode(job: Any) -> str:
    """The signing mode for ``job``: its robot's, the robot of the queue a worker took it
    from (``taken_from``, stamped by :class:`PolicedWorker`). A job performed by no such
    worker gets the strictest mode configured for any robot: its ``origin`` is the job's
    own claim and proves nothing."""
    taken_from = getattr(job, "taken_from", None)
    if taken_from is not None:
        return verify_mode(_queue_robot(taken_from))
    signing = get_settings().signing
    return max([signing.verify, *signing.robots.values()], key=lambda mode: _STRICTNESS.get(mode, 2))


def refusal(job: Any) -> str | None:
    """Why this worker must not run ``job`` (None: it may). Reads only data: nothing the job
    names is imported."""
    unreadable = getattr(job, "unreadable", None)
    if unreadable:
        return f"job data cannot be read ({unreadable})"
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
    mode = _verify_mode(job)
    if mode != "off":
        problem = signature_problem(str(job.id), func, list(args), job.meta)
        if problem and mode == "require":
            return problem
        if problem:
            log.warning("security.job_unsigned", job_id=job.id, queue=_queue_of(job), error=problem, mode=mode)
    return None


def _queue_of(job: Any) -> str:
    """The queue a worker took ``job`` from, for log lines (else the job's own ``origin``)."""
    return str(getattr(job, "taken_from", None) or job.origin or "")


def check_job(job: Any) -> None:
    """Raise :class:`JobRefused` (after disarming the job's retries and callbacks and logging
    ``security.job_refused``) unless ``job`` may run."""
    reason = refusal(job)
    if reason is None:
        return
    for name in _CALLBACKS:  # rq's failure path would import them
        setattr(job, name, None)
    job.retries_left = None
    log.error("security.job_refused", job_id=job.id, queue=_queue_of(job), reason=reason)
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
    from rq.job import Job  # lazy: start-up time

    class RobotLabJob(Job):
        """An rq job that runs only if :func:`check_job` lets it (see the module docstring)."""

        taken_from: str | None = None  # the queue a PolicedWorker took it from
        unreadable: str | None = None  # why its hash cannot be read as a job (then it is refused)

        def perform(self) -> Any:
            check_job(self)
            return super().perform()

        def restore(self, raw_data: Any) -> Any:
            """rq's restore, with the timestamps in rq's own form parsed by
            :func:`rq_timestamp` (same values; any other form goes through rq's parse), and
            the job's data decoded now rather than on first use. A hash that cannot be read
            (``data`` missing, garbage, a pickle of code) becomes an unreadable job that
            :func:`refusal` fails: raised here, the error ended rq's work loop."""
            try:
                result = self._restore(raw_data)
                self._deserialize_data()
            except Exception as exc:  # noqa: BLE001 - any undecodable hash is one refused job
                self._restore_unreadable(raw_data, exc)
                return None
            return result

        def _restore_unreadable(self, raw_data: Any, exc: Exception) -> None:
            """Just enough of the hash for rq to fail the job: its origin, and its data kept
            as it was (rq writes the failed job back)."""
            cause = exc.__cause__ or exc
            origin = raw_data.get(b"origin", raw_data.get("origin", b""))
            origin = origin.decode(errors="replace") if isinstance(origin, bytes) else str(origin)
            data = raw_data.get(b"data", raw_data.get("data"))
            Job.restore(self, {"data": data if isinstance(data, bytes) and data else b"", "origin": origin})
            self._func_name, self._instance, self._args, self._kwargs = None, None, (), {}
            self.unreadable = ("the job hash has no data" if data is None
                               else f"{type(cause).__name__}: {str(cause)[:200]}")

        def _restore(self, raw_data: Any) -> Any:
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


class PolicedWorker:
    """rq worker mixin (first among the bases) of every robot-lab worker class: jobs are
    fetched as ``RobotLabJob``, and each job is stamped with the queue the worker took it
    from before it runs, so the policy decides a job's signing mode by that queue's robot."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.job_class = job_class()

    def execute_job(self, job: Any, queue: Any) -> Any:
        job.taken_from = queue.name
        return super().execute_job(job, queue)  # type: ignore[misc]


@functools.cache
def plain_worker_class() -> type:
    """rq's forking worker with the job policy, for ``rq worker -w``."""
    from rq.worker import Worker  # lazy: start-up time

    class RobotLabWorker(PolicedWorker, Worker):
        """``rq worker -w robot_lab.network.job_policy.RobotLabWorker robot:billing``: jobs
        are fetched as ``RobotLabJob`` and always decoded with the data-only serializer
        (rq's default pickle would run code hidden in a job's ``meta`` as it is read)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["serializer"] = JobSerializer
            kwargs["job_class"] = job_class()  # whatever rq's -j names
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
