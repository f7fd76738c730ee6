"""What ``run`` / ``demo`` / ``watch`` tell their user while they wait on a run
(``RunHandle.wait``) and when it ends: which queue has no live worker, and, when the wait
times out, one line with the run id, what the run still waits on and what to do next; the
exit status of its end. (The verb, not the state ``waiting`` of a parked task:
docs/architecture.md, Words.)

Why: a newcomer who forgot to start workers saw nothing for two minutes and then a 30-line
``AwaitTimeout`` traceback. The facts come from the run's own state in Redis (tasks queued or
running, their leases) and from robot-lab's worker heartbeats (:mod:`robot_lab.workers.fleet_status`),
the same sources as ``robot-lab status``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

NOTE_EVERY = 5.0  # seconds between "still no live worker" notes
TIMEOUT_EXIT = 124  # like timeout(1): the wait gave up, the run itself may still finish
FAILED_TASKS_EXIT = 3  # the run finished, but at least one task failed (completed_with_errors)
RUN_NOT_DONE_EXIT = 1  # cancelled, or any status but a finish


def run_exit_code(status: str) -> int:
    """The exit status of ``run`` / ``demo`` / ``watch`` for a run that ended in ``status``:
    0 only for ``completed``, so a CI step or a Kubernetes Job fails when a task did."""
    if status == "completed":
        return 0
    return FAILED_TASKS_EXIT if status == "completed_with_errors" else RUN_NOT_DONE_EXIT


def failed_tasks_line(result: Any) -> str | None:
    """One line naming the failed tasks of a finished run and the first one's error."""
    failed = [name for name, state in result.states.items() if state == "failed"]
    if not failed:
        return None
    first = result.context.get(failed[0])
    error = " ".join(str(getattr(first, "error", "") or "").split())[:200]
    more = f" ({error})" if error else ""
    return (f"run {result.run_id}: {len(failed)} task(s) failed: {', '.join(failed)}{more}; "
            f"the run went on past them (status {result.status})")


def exit_for_result(result: Any) -> None:
    """Exit as :func:`run_exit_code` says, after one line on stderr naming the failed tasks."""
    import click  # lazy: start-up time

    line = failed_tasks_line(result)
    if line:
        click.echo(f"Error: {line}", err=True)
    code = run_exit_code(result.status)
    if code:
        sys.exit(code)


def serving(connection: RedisClient, keys: Any, robots: list[str]) -> dict[str, bool]:
    """For each robot: does a live worker (robot-lab heartbeat, or a registered plain rq
    worker that is not stale) serve its queue?"""
    from robot_lab.network.enqueue import queue_name  # lazy: start-up time
    from robot_lab.workers.fleet_status import live_workers, rq_registrations  # lazy: start-up time

    workers = live_workers(connection, keys)
    live = {w["name"] for w in workers}
    served = {r for w in workers if w.get("role") != "bus" for r in w.get("robots", [])}
    queues = [queue_name(r) for r in robots if r not in served]
    registered = rq_registrations(connection, queues, live, clean=False) if queues else {}
    return {r: r in served or bool(registered.get(queue_name(r), {}).get("live")) for r in robots}


def outstanding(handle: Any) -> list[str]:
    """What the run of ``handle`` waits on now, one phrase per robot queue: its queued and
    running tasks."""
    from robot_lab.network.graphs import graph_for  # lazy: start-up time

    store = handle.store
    states = store.states()
    graph = graph_for(store)
    queued: dict[str, list[str]] = {}
    running: dict[str, list[str]] = {}
    for task, state in states.items():
        robot = graph.tasks[task].robot if task in graph.tasks else "?"
        if state == "queued":
            queued.setdefault(robot, []).append(task)
        elif state == "running":
            running.setdefault(robot, []).append(task)
    live = serving(handle.coordinator.connection, handle.coordinator.keys, sorted({*queued, *running}))
    phrases = []
    for robot, tasks in sorted(queued.items()):
        what = f"task {', '.join(sorted(tasks))} queued on robot:{robot}"
        phrases.append(what if live[robot] else f"{what}, and no live worker serves it")
    for robot, tasks in sorted(running.items()):
        what = f"task {', '.join(sorted(tasks))} running on robot:{robot}"
        phrases.append(what if live[robot] else f"{what}, whose worker is gone (a live worker re-runs it)")
    return phrases


def missing_workers(handle: Any) -> list[str]:
    """Robots with queued tasks of this run and no live worker."""
    return sorted(phrase.split("robot:", 1)[1].split(",", 1)[0]
                  for phrase in outstanding(handle) if "no live worker" in phrase)


def timeout_line(run_id: str, timeout: float | None, phrases: list[str], *, embedded: bool = False) -> str:
    """The one line printed when a wait times out."""
    waited = f"within {timeout:g} s" if timeout is not None else "in time"
    if embedded:
        return (f"run {run_id} did not finish {waited} (embedded mode: its tasks run in this process "
                "and stop with it); raise --timeout, or set REDIS_URL and start workers for long runs")
    what = "; ".join(phrases) or "its last task to be recorded"
    return (f"run {run_id} did not finish {waited}: waiting for {what}. It goes on without this command: "
            f"follow it with `robot-lab watch {run_id}`, stop it with `robot-lab cancel {run_id}`")


class WorkerNotes:
    """While a run waits, say every ``every`` seconds which queues it needs have no live
    worker (through ``emit``), until :meth:`stop`. The first check is immediate."""

    def __init__(self, handle: Any, emit: Callable[[str], None], *, every: float = NOTE_EVERY) -> None:
        self.handle = handle
        self.emit = emit
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-notes", daemon=True)
        self.waited = 0.0

    def start(self) -> WorkerNotes:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                missing = missing_workers(self.handle)
            except Exception:  # a note is a courtesy; Redis trouble shows up in the wait itself
                missing = []
            if missing:
                queues = ", ".join(f"robot:{robot}" for robot in missing)
                start = " ".join(f"robot-lab worker {robot}" for robot in missing[:1])
                since = f" (waiting {self.waited:.0f} s)" if self.waited else ""
                self.emit(f"no live worker on {queues}{since}; start one (`{start}`, or `honcho start` "
                          "with the Procfile) or stop the run with `robot-lab cancel "
                          f"{self.handle.run_id}`")
            if self._stop.wait(self.every):
                return
            self.waited += self.every

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def __enter__(self) -> WorkerNotes:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
