"""Worker heartbeats that mean something: a healthy beat is written only while every loop
of the worker makes progress, so a dead or wedged loop fails the probe.

Each ``robot-lab worker`` process (and each rq child with ``--concurrency N``) runs one
:class:`WorkerHeartbeat` thread. Every ``interval`` seconds it asks its checks whether the
process is healthy and writes

* ``<prefix>:worker:<name>`` -- only when healthy: JSON record, ``PX`` = 3 intervals (read by
  ``robot-lab status``: a killed worker disappears within three beats), indexed in the zset
  ``<prefix>:workers``;
* ``<health dir>/<name>.json`` -- the same record in a local file whose age and ``problem``
  the liveness probe ``robot-lab health`` checks (no Redis needed: a Redis outage must not
  restart every worker pod).

"Healthy" for the rq loop (:func:`rq_loop_problem`): idle, the loop came back from its
blocking dequeue within ``dequeue_timeout`` + slack; busy, the job in hand is not past its rq
timeout + slack (rq's death penalty should have stopped it). For every other loop (bus
pollers, sweeper, spawn watcher, rq child processes) see :mod:`.supervision`: a loop that
died or stopped making progress is named in the file's ``problem`` and fails the probe.
The file is written on every tick, healthy or not; a wedged heartbeat thread lets it age.
A Redis outage does not fail liveness (the loops ride it out, see :mod:`robot_lab.outage`);
the beat then only skips the Redis record, and ``--ready`` fails.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.network.builds import process_build
from robot_lab.outage import OutageTracker, is_oom, is_outage
from robot_lab.settings import get_settings
from robot_lab.workers.supervision import on_the_way_out, stop_time_left

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.health")

# rq's idle loop returns from its blocking dequeue every worker_ttl - 15 s and heartbeats.
RQ_WORKER_TTL = 45
LOOP_SLACK = 30.0
JOB_SLACK = 60.0
# rq's bookkeeping of a busy worker (LoopProgress): its key beaten, its suspension flag read,
# at most this often (seconds).
BEAT_EVERY = 1.0
SUSPENSION_EVERY = 1.0

Check = Callable[[], "str | None"]


def health_dir() -> Path:
    """``ROBOT_LAB_HEALTH_DIR``, else ``<tmp>/robot-lab-health-<user>/<key prefix>``: one
    folder per user and worker group (key prefix), so a probe on a shared host judges only
    its own workers, never another user's or another prefix's."""
    settings = get_settings()
    if settings.health_dir:
        return Path(settings.health_dir)
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    prefix = "".join(c if c.isalnum() or c in "-_." else "_" for c in settings.key_prefix)
    return Path(tempfile.gettempdir()) / f"robot-lab-health-{user}" / prefix


class LoopProgress:
    """Mixin for rq workers: remember when the work loop last came around and which job it
    holds, so a heartbeat thread can tell "busy" from "wedged".

    It also keeps rq's per-job bookkeeping of the worker itself sparse (as the in-flight
    worker does, workers/inflight.py): rq beats the worker key three times per job (an HSET
    and two EXPIREs each, one round trip apiece), writes ``state idle`` before every dequeue
    although the job's end just wrote it, and reads the suspension flag before every job --
    11 of a robot-lab worker's ~17 round trips per no-op task, and what made 4 worker
    processes on 2 cores 1.8-2x raw rq (bench/dag.py (e)). Here the key is beaten at most
    every ``BEAT_EVERY`` seconds (it lives ``worker_ttl`` + 60 s), the state is written when
    it changes, and ``rq suspend`` is seen within ``SUSPENSION_EVERY`` seconds."""

    loop_beat: float = 0.0
    busy: tuple[str, float, float | None] | None = None
    _key_beaten: float = float("-inf")  # when the worker key was last beaten (monotonic)
    _state_written: str | None = None
    _suspension_checked: float = float("-inf")

    def heartbeat(self, timeout: Any = None, pipeline: Any = None) -> Any:
        now = time.monotonic()
        self.loop_beat = now
        if timeout is None and pipeline is None:
            if now - self._key_beaten < BEAT_EVERY:
                return None
            self._key_beaten = now
        return super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]

    def set_state(self, state: Any, pipeline: Any = None) -> Any:
        if state == self._state_written:
            self._state = state  # type: ignore[attr-defined]
            return None
        self._state_written = state
        return super().set_state(state, pipeline=pipeline)  # type: ignore[misc]

    def check_for_suspension(self, burst: bool) -> Any:
        now = time.monotonic()
        if now - self._suspension_checked < SUSPENSION_EVERY:
            return None
        self._suspension_checked = now
        return super().check_for_suspension(burst)  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Any) -> Any:
        timeout = job.timeout if isinstance(job.timeout, (int, float)) and job.timeout > 0 else None
        self.busy = (job.id, time.monotonic(), timeout)
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        finally:
            self.busy = None
            self.loop_beat = time.monotonic()

    def progress(self) -> dict[str, Any]:
        if self.busy:
            return {"state": "busy", "job": self.busy[0], "busy_for": round(time.monotonic() - self.busy[1], 1)}
        return {"state": "idle"}


def rq_loop_problem(worker: Any) -> str | None:
    """Why ``worker`` (a LoopProgress rq worker) looks wedged, or None. A worker with jobs
    on threads (workers/inflight.py) answers for itself."""
    own = getattr(worker, "loop_problem", None)
    if callable(own):
        return own()
    now = time.monotonic()
    if worker.busy:
        job_id, since, timeout = worker.busy
        if timeout is not None and now - since > timeout + JOB_SLACK:
            return f"job {job_id} running {now - since:.0f}s, past its {timeout:.0f}s timeout"
        return None
    if not worker.loop_beat:
        return None  # still starting (bootstrap registers and beats first)
    limit = worker.dequeue_timeout + LOOP_SLACK
    if now - worker.loop_beat > limit:
        return f"rq loop silent for {now - worker.loop_beat:.0f}s (limit {limit:.0f}s)"
    return None


class WorkerHeartbeat:
    """The beat thread of one worker process (see the module docstring)."""

    def __init__(self, connection: RedisClient, keys: Keys, name: str, robots: list[str], *, role: str,
                 checks: list[Check] | None = None, info: Callable[[], dict[str, Any]] | None = None,
                 interval: float | None = None, directory: Path | None = None) -> None:
        self.connection = connection
        self.keys = keys
        self.name = name
        self.robots = list(robots)
        self.role = role
        self.checks = list(checks or [])
        self.info = info
        self.interval = float(interval if interval is not None else get_settings().worker_heartbeat)
        self.directory = directory or health_dir()
        self.started_at = time.time()
        self.problem: str | None = None
        self.outage = OutageTracker(f"heartbeat-{name}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def file(self) -> Path:
        return self.directory / f"{self.name}.json"

    def record(self) -> dict[str, Any]:
        data = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(), "role": self.role,
                "robots": self.robots, "started_at": self.started_at, "beat": time.time(),
                "interval": self.interval, "build": process_build()}  # network/builds.py
        if self.info is not None:
            data.update(self.info())
        return data

    def beat(self) -> bool:
        """One tick: run the checks; write the local file always (with the problem, if any,
        so the probe names the dead or stuck loop) and the Redis record only when healthy.
        Returns whether the beat was healthy."""
        problem = None
        for check in self.checks:
            problem = check()
            if problem:
                break
        if problem and problem != self.problem:
            starting = problem.startswith("starting: ")  # supervision.STARTING: not serving yet
            (log.info if starting else log.error)("worker.unhealthy", worker=self.name, problem=problem)
        elif not problem and self.problem:
            recovered = not self.problem.startswith("starting: ")
            (log.warning if recovered else log.info)("worker.serving", worker=self.name)
        self.problem = problem
        data = self.record()
        if problem:
            data["problem"] = problem
        else:
            try:
                pipe = self.connection.pipeline(transaction=False)
                pipe.set(self.keys.worker(self.name), json.dumps(data), px=max(1, int(self.interval * 3000)))
                pipe.zadd(self.keys.workers(), {self.name: data["beat"]})
                pipe.execute()
                self.outage.back()
            except Exception as exc:
                # Redis away: the loops ride it out, so liveness stays green (restarting the
                # worker would not bring Redis back); readiness (--ready) asks Redis itself.
                if not is_outage(exc):
                    raise
                self.outage.lost(exc)
                data["redis"] = "out of memory" if is_oom(exc) else "unreachable"
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.file)
        return problem is None and "redis" not in data

    def start(self) -> WorkerHeartbeat:
        prune_dead_files(self.directory)
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except Exception as exc:
                log.warning("worker.heartbeat_error", worker=self.name, error=f"{type(exc).__name__}: {exc}")
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        """A clean exit: stop beating and withdraw the record and the file."""
        self._stop.set()
        if self._thread is not None:  # a beat in progress; one blocked on Redis is left behind
            self._thread.join(stop_time_left())  # (None: no stop signal, a beat takes milliseconds)

        def withdraw() -> None:
            self.connection.delete(self.keys.worker(self.name))
            self.connection.zrem(self.keys.workers(), self.name)

        try:
            on_the_way_out("health-record", withdraw)  # never waits on a Redis that does not answer
        except Exception:  # noqa: BLE001 - Redis away: the record expires with its TTL
            pass
        self.file.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


pid_alive = _pid_alive  # public name, for `robot-lab status` (stale rq registrations)


def prune_dead_files(directory: Path) -> None:
    """Remove heartbeat files of this host's processes that no longer exist (a previous
    container incarnation, a killed dev worker), so they do not fail the next probe."""
    if not directory.is_dir():
        return
    host = socket.gethostname()
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("host") == host and not _pid_alive(int(data.get("pid", 0))):
            path.unlink(missing_ok=True)


def check_health(directory: Path | None = None, *, worker: str | None = None,
                 max_age: float | None = None) -> tuple[bool, list[str]]:
    """The liveness verdict from the heartbeat files: (ok, one line per worker/problem).

    ``worker`` limits the check to names containing it. Unhealthy: no file of a live process
    at all, or a file older than ``max_age`` (default 6 beats, at least 30 s). The file of a
    process of this host that is gone (a killed dev worker, a previous container) is
    reported once and removed; it does not fail the probe of the workers still alive.
    """
    directory = directory or health_dir()
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    lines: list[str] = []
    ok = True
    found = 0
    host = socket.gethostname()
    for path in files:
        try:
            data = json.loads(path.read_text())
            age = time.time() - path.stat().st_mtime
        except (OSError, ValueError):
            continue
        name = str(data.get("name", path.stem))
        if worker and worker not in name:
            continue
        found += 1
        limit = max_age if max_age is not None else max(30.0, 6 * float(data.get("interval", 5.0)))
        if data.get("host") == host and not _pid_alive(int(data.get("pid", 0))):
            # reported once, then gone: a dead neighbour must not fail the live workers' probe
            found -= 1
            path.unlink(missing_ok=True)
            lines.append(f"{name}: process {data.get('pid')} is gone (its heartbeat file is removed)")
        elif data.get("problem") and age <= limit:
            ok = False
            lines.append(f"{name}: unhealthy: {data['problem']}")
        elif age > limit:
            ok = False
            lines.append(f"{name}: no healthy beat for {age:.0f}s (limit {limit:.0f}s)")
        else:
            redis_state = f"; redis: {data['redis']}" if data.get("redis") else ""
            lines.append(f"{name}: ok ({data.get('role')}, {data.get('state', 'up')}, beat {age:.1f}s ago){redis_state}")
    if not found:
        ok = False
        what = f"matching {worker!r} " if worker else ""
        lines.append(f"no worker heartbeat {what}in {directory}")
    return ok, lines
