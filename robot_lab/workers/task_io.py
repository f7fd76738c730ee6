"""The two threads-of-work a running task keeps beside the robot: its lease heartbeat and its
coalesced ``text.delta`` stream. Apart from :mod:`.jobs` so the job function reads as the
task's life (claim, run, record, advance) without the I/O plumbing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.outage import OutageTracker, is_outage
from robot_lab.runtime.network.run_state import RunStore

log = get_logger("robot_lab.workers")


class LeaseHeartbeat:
    """Keeps the task's lease alive from a daemon thread while the robot runs."""

    def __init__(self, store: RunStore, task: str, worker: str, lease_ms: int, outage: OutageTracker) -> None:
        self.store, self.task, self.worker, self.lease_ms = store, task, worker, lease_ms
        self.outage = outage
        self.stop_event = threading.Event()
        self.lost = False
        self.thread = threading.Thread(target=self._loop, name=f"lease-{task}", daemon=True)

    def _loop(self) -> None:
        interval = self.lease_ms / 3000
        outage = self.outage
        while not self.stop_event.wait(interval):
            try:
                alive = self.store.heartbeat(self.task, self.worker, self.lease_ms)
                outage.back()
                if not alive and self.stop_event.is_set():
                    return  # the task ended meanwhile: its result deleted the lease
                if not alive:
                    self.lost = True
                    log.warning("task.lease_lost", task=self.task)
                    return
            except Exception as exc:  # Redis hiccup: try again next beat (one line per outage)
                if is_outage(exc):
                    outage.lost(exc)
                else:
                    log.warning("task.heartbeat_failed", task=self.task, error=str(exc))

    def __enter__(self) -> LeaseHeartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        # Not joined: waiting for the thread to wake and exit cost a task a context switch
        # (bench/dag.py); it exits at its next wake-up, and a beat that races the task's end
        # cannot bring the lease back (SET XX) nor report it lost.
        self.stop_event.set()


class DeltaBuffer:
    """Streams reply chunks as ``text.delta`` events, coalesced: at most one event per
    ``interval`` (a Redis round trip per token would cost more than the token). What is
    left when the robot is done is :meth:`take`-n and sent with the task's result, in the
    same script (RunStore.complete): the same events in the same order, one round trip less."""

    def __init__(self, store: RunStore, task: str, robot: str, interval: float = 0.05) -> None:
        self.store, self.task, self.robot, self.interval = store, task, robot, interval
        self.parts: list[str] = []
        self.last = time.monotonic()

    def add(self, chunk: Any) -> None:
        text = getattr(chunk, "content", str(chunk))
        if not text:
            return
        self.parts.append(text)
        if time.monotonic() - self.last >= self.interval:
            self.flush()

    def take(self) -> list[tuple[str, dict[str, Any] | None]]:
        """The unsent text as a pending ``text.delta`` event (none when nothing is left)."""
        text, self.parts = "".join(self.parts), []
        return [("text.delta", {"delta": text})] if text else []

    def flush(self) -> None:
        if self.parts:
            try:
                self.store.emit("text.delta", task=self.task, robot=self.robot, data={"delta": "".join(self.parts)})
                self.parts = []
            except Exception as exc:  # Redis away: keep the text for the next flush
                if not is_outage(exc):
                    raise
        self.last = time.monotonic()
