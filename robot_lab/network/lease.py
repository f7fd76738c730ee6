"""The two kinds of I/O a running task keeps up beside the robot: its lease heartbeat (one
keeper thread per process) and its coalesced ``text.delta`` stream. Apart from :mod:`.jobs` so the job function reads as the
task's life (claim, run, record, advance) without the I/O plumbing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from robot_lab.connection import is_cluster_client
from robot_lab.logging import get_logger
from robot_lab.network import transitions
from robot_lab.outage import OutageTracker, is_outage
from robot_lab.network.run_state import DEFAULT_LEASE_MS, RunStore

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.workers")


# Under one interpreter lock a thread that wants the GIL waits behind the threads that asked
# before it (CPython hands it on roughly in arrival order), so in a process running N tasks at
# once each of the lease keeper's GIL acquisitions (about three a beat) can wait for about N
# tasks' turns. At 5000 tasks in hand on a loaded 2-core machine beats came later than the 5 s
# lease: 1792 leases and 3087 holds expired under a live worker and their tasks ran again
# (bench/concurrency.py). So a process's leases and holds last at least this long per task it
# runs at once (10 s at --in-flight 1000, 50 s at 5000); a dead worker's tasks wait as long.
SLOT_LEASE_MS = 10
_process_slots = 1


def set_process_slots(slots: int) -> None:
    """How many tasks this process runs at once (``robot-lab worker --in-flight N``)."""
    global _process_slots
    _process_slots = max(1, int(slots))


# A process starved of CPU (other processes on the cores, thousands of its own threads) beats
# late, by however long the interpreter lock and the scheduler kept the lease keeper waiting.
# The keeper measures that (how late each of its rounds came after the earliest beat due) and
# every lease and hold this process writes lasts STALL_FACTOR times the worst recent lateness
# longer, so the next beat may come that much later again before the sweeper reads the
# task as lost (40-296 live tasks requeued per 1000-task fan-out at a load of 10-21). The
# worst lateness halves every STALL_HALF_LIFE seconds: a process that stopped lagging goes
# back to its plain lease, and a dead worker's tasks wait at most that much longer.
STALL_FACTOR = 3.0
STALL_HALF_LIFE = 60.0
# Lateness up to this is noise (a round waits for the lock for milliseconds on any busy
# machine) and leaves leases as they are: each already outlives two missed beats.
STALL_NOISE = 0.25


def task_lease_ms() -> int:
    """A task's lease (``ROBOT_LAB_TASK_LEASE_MS``, default 5 s), at least ``SLOT_LEASE_MS``
    per task this process runs at once, plus the margin this process's measured beat
    lateness asks for (see above)."""
    configured = int(os.environ.get("ROBOT_LAB_TASK_LEASE_MS", DEFAULT_LEASE_MS))
    return max(configured, _process_slots * SLOT_LEASE_MS) + _keeper.stall_margin_ms()


class LeaseHeartbeat:
    """Keeps the task's lease alive while the robot runs: every ``lease_ms / 3`` the process's
    lease keeper thread extends it (SET XX PX); if it is gone, the task was reclaimed (``lost``).

    One keeper thread serves every running task of the process (:class:`_LeaseKeeper`):
    starting a thread per task cost a task milliseconds of wall time on a loaded machine
    (``Thread.start`` waits until the new thread runs; bench/dag.py)."""

    def __init__(self, store: RunStore, task: str, worker: str, lease_ms: int, outage: OutageTracker) -> None:
        self._setup(store.r, store.lease_key(task), worker, task, lease_ms, outage)

    def _setup(self, connection: RedisClient, key: str, value: str, task: str, lease_ms: int, outage: OutageTracker) -> None:
        self.connection, self.key, self.value = connection, key, value
        self.task, self.lease_ms = task, lease_ms
        self.outage = outage
        self.interval = lease_ms / 3000
        self.next_beat = 0.0
        self.stopped = False
        self.finishing = False  # the task's result is being written (and deletes the lease)
        self.lost = False

    def beat(self) -> bool:
        """Extend the lease once (one round trip); False when it needs no more beats."""
        return _keeper.beat_all([self]) == [True]

    def settle(self, alive: Any) -> bool:
        """Take the reply of one beat (True/None from SET XX, or the exception it raised);
        False when this lease needs no more beats."""
        self.next_beat = time.monotonic() + self.interval
        if isinstance(alive, Exception):  # Redis hiccup: try again next beat (one line per outage)
            if is_outage(alive):
                self.outage.lost(alive)
            else:
                log.warning("task.heartbeat_failed", task=self.task, error=str(alive))
            return not self.stopped
        self.outage.back()
        if alive or self.stopped or self.finishing:  # the task's result deleted the lease meanwhile
            return bool(alive) and not self.stopped
        self.lost = True
        self.on_lost()
        return False

    def on_lost(self) -> None:
        log.warning("task.lease_lost", task=self.task)

    def __enter__(self) -> LeaseHeartbeat:
        self.next_beat = time.monotonic() + self.interval
        _keeper.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        # a beat racing the task's end cannot bring the lease back (SET XX) nor report it lost
        self.stopped = True
        _keeper.remove(self)


_HOLDS_OUTAGE = OutageTracker("job-holds")  # one lost/back pair per outage for all holds


class HeldJobLease(LeaseHeartbeat):
    """A job a worker process has taken off its queue and not yet claimed (the in-flight
    worker takes many at once, and one may wait seconds for a free thread and the GIL): the
    run's ``R:held:<task>`` key, beaten like a lease, tells the sweeper the job is in the
    hands of a live worker, not stranded by a crash (RunStore.repair_queued). A worker that
    dies lets it expire within ``lease_ms``."""

    def __init__(self, connection: RedisClient, key: str, job_id: str, lease_ms: int) -> None:
        self._setup(connection, key, job_id, key, lease_ms, _HOLDS_OUTAGE)

    def on_lost(self) -> None:  # expired (a stall past lease_ms): the sweeper may re-enqueue it, harmlessly
        log.info("worker.job_hold_lost", key=self.key)


class _LeaseKeeper:
    """The one daemon thread of a process that beats the leases of its running tasks (and the
    holds of the jobs it has taken): whatever is due, and what falls due within the next half
    interval, in one pipelined round trip per connection. A process holding a thousand tasks
    makes one round trip a beat, not a thousand -- each of which waited for the GIL behind
    every running job, until leases expired under a healthy worker (bench/concurrency.py)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self.late = 0.0  # seconds: the worst recent lateness of a round (decays, see STALL_HALF_LIFE)
        self.late_at = time.monotonic()
        self.lock = threading.Lock()
        self.leases: set[LeaseHeartbeat] = set()
        self.wake = threading.Event()
        self.sleep_until = 0.0  # when the thread wakes next by itself
        self.thread: threading.Thread | None = None

    def add(self, lease: LeaseHeartbeat) -> None:
        self.add_many([lease])

    def add_many(self, leases: list[LeaseHeartbeat]) -> None:
        if not leases:
            return
        with self.lock:
            self.leases.update(leases)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)
                self.thread.start()
            early = min(lease.next_beat for lease in leases) < self.sleep_until
        if early:  # due before the thread's next wake-up (a shorter lease): wake it now
            self.wake.set()

    def remove(self, lease: LeaseHeartbeat) -> None:
        with self.lock:
            self.leases.discard(lease)

    def stall_margin_ms(self) -> int:
        """Milliseconds every lease and hold of this process lasts beyond its plain length:
        ``STALL_FACTOR`` times the worst lateness of a recent round (0 while beats are on time)."""
        late = self.late * 0.5 ** ((time.monotonic() - self.late_at) / STALL_HALF_LIFE)
        return int(STALL_FACTOR * late * 1000)

    def measured(self, lateness: float) -> None:
        """A round came ``lateness`` seconds after its earliest beat was due."""
        now = time.monotonic()
        decayed = self.late * 0.5 ** ((now - self.late_at) / STALL_HALF_LIFE)
        if lateness > max(decayed, STALL_NOISE):
            self.late, self.late_at = lateness, now
            if STALL_FACTOR * lateness * 1000 >= 1000:  # a second or more: worth a line
                log.info("lease.beats_late", late_s=round(lateness, 2), margin_ms=self.stall_margin_ms())

    def beat_all(self, leases: list[LeaseHeartbeat]) -> list[bool]:
        """One SET XX PX per lease, pipelined per connection; each lease settles its reply.
        Each is extended by its own length plus the stall margin measured now (a lease made
        while the process lagged carries the margin of then as well: longer, never shorter)."""
        by_connection: dict[int, list[LeaseHeartbeat]] = {}
        for lease in leases:
            by_connection.setdefault(id(lease.connection), []).append(lease)
        out: dict[int, bool] = {}
        margin = self.stall_margin_ms()
        for group in by_connection.values():
            try:
                pipe = group[0].connection.pipeline(transaction=False)
                for lease in group:
                    pipe.set(lease.key, lease.value, px=lease.lease_ms + margin, xx=True)
                replies: list[Any] = pipe.execute(raise_on_error=False)
            except Exception as exc:  # noqa: BLE001 - each lease reports it (outage or not)
                replies = [exc] * len(group)
            for lease, reply in zip(group, replies):
                out[id(lease)] = lease.settle(reply)
        return [out[id(lease)] for lease in leases]

    def _loop(self) -> None:
        while True:
            self.wake.clear()  # before looking: a lease added from here on sets it again
            now = time.monotonic()
            with self.lock:
                soon = min((lease.interval for lease in self.leases), default=1.0) / 2
                due = [lease for lease in self.leases if lease.next_beat <= now + soon]
            if due:
                self.measured(now - min(lease.next_beat for lease in due))
                for lease, keep in zip(due, self.beat_all(due)):
                    if not keep:
                        self.remove(lease)
            with self.lock:
                self.sleep_until = min((lease.next_beat for lease in self.leases), default=now + 1.0)
            self.wake.wait(max(0.0, self.sleep_until - time.monotonic()))


_keeper = _LeaseKeeper()


def _encoded(data: dict[str, Any] | None) -> str:
    return json.dumps(data) if data else ""


def hold_jobs(connection: RedisClient, holds: list[tuple[str, str]], lease_ms: int) -> list[HeldJobLease]:
    """Write and start beating the holds ``(key, job id)`` of jobs just taken (one round trip)."""
    if not holds:
        return []
    made = [HeldJobLease(connection, key, job_id, lease_ms) for key, job_id in holds]
    pipe = connection.pipeline(transaction=False)
    for hold in made:
        pipe.set(hold.key, hold.value, px=lease_ms)
    pipe.execute()
    _HOLDS_OUTAGE.back()  # the holds were written: Redis answers
    now = time.monotonic()
    for hold in made:
        hold.next_beat = now + hold.interval
    _keeper.add_many(list(made))
    return made


def release_holds(holds: list[HeldJobLease], *, ran: bool = True) -> None:
    """Stop beating holds (the job ran, or went back unstarted: ``ran=False``); the keys
    expire by themselves. A job that ran was claimed and completed in Redis: an outage the
    holds saw is over (its ``redis.back`` line, even when no hold beats again to say so)."""
    for hold in holds:
        hold.stopped = True
        _keeper.remove(hold)
    if holds and ran:
        _HOLDS_OUTAGE.back()


class DeltaBuffer:
    """Streams reply chunks as ``text.delta`` events, coalesced: a chunk opens a window of
    ``interval`` seconds, and the text gathered when a later chunk finds the window over goes
    out as one event (a Redis round trip per token would cost more than the token). What is
    left when the robot is done is :meth:`take`-n and sent with the task's result, in the
    same script (RunStore.complete): the same events in the same order, one round trip less.
    So a reply that streams in under ``interval`` (or a model that answers in one piece)
    costs no round trip of its own, and a watcher sees text at most ``interval`` after the
    next chunk arrives. Other events of the task (tool calls) :meth:`flush` first, so the
    stream keeps the order things happened in."""

    def __init__(self, store: RunStore, task: str, robot: str, interval: float = 0.05) -> None:
        self.store, self.task, self.robot, self.interval = store, task, robot, interval
        self.parts: list[str] = []
        self.opened = 0.0  # when the first unsent chunk arrived
        self.owed: list[tuple[str, dict[str, Any] | None]] = []  # other events, in order (step.*)

    def owe(self, event: str, data: dict[str, Any] | None) -> None:
        """Send ``event`` with the next flush (or the task's result), after the text before it."""
        self._owe_text()
        self.owed.append((event, data))

    def _owe_text(self) -> None:
        text, self.parts = "".join(self.parts), []
        if text:
            self.owed.append(("text.delta", {"delta": text}))

    def add(self, chunk: Any) -> None:
        text = getattr(chunk, "content", str(chunk))
        if not text:
            return
        now = time.monotonic()
        if not self.parts:
            self.opened = now
        self.parts.append(text)
        if now - self.opened >= self.interval:
            self.flush()

    def _emit_all(self, events: list[tuple[str, dict[str, Any] | None]]) -> None:
        """The events in order, in one round trip (one pipeline of EMIT scripts; on a cluster
        client, which refuses scripts in pipelines, one by one)."""
        store = self.store
        if len(events) == 1 or is_cluster_client(store.r):
            for event, data in events:
                store.emit(event, task=self.task, robot=self.robot, data=data)
            return
        keys = store._script_keys()
        pipe = store.r.pipeline(transaction=False)
        for event, data in events:
            transitions.run_script(pipe, transitions.EMIT, keys, store.run_id, event, self.task, self.robot,
                                   _encoded(data))
        pipe.execute()

    def take(self) -> list[tuple[str, dict[str, Any] | None]]:
        """The unsent events: those owed, then the text as a ``text.delta`` (none when nothing is left)."""
        self._owe_text()
        owed, self.owed = self.owed, []
        return owed

    def flush(self) -> None:
        if self.owed:
            self._owe_text()
            try:
                self._emit_all(self.owed)
            except Exception as exc:  # Redis away: keep them for the next flush
                if not is_outage(exc):
                    raise
                return
            self.owed = []
        if self.parts:
            try:
                self.store.emit("text.delta", task=self.task, robot=self.robot, data={"delta": "".join(self.parts)})
                self.parts = []
            except Exception as exc:  # Redis away: keep the text for the next flush
                if not is_outage(exc):
                    raise
