"""Loop supervision and outage riding, unit level: which errors
count as an outage, the backoff's bounds, one log line per state change, and when a loop
is dead, stuck, busy or starting. The real-process counterparts are
tests/test_workers_health_procs.py and tests/test_connection_redis_restart.py."""

from __future__ import annotations

import random
import threading
import time

import pytest
import redis.exceptions as rx

from robot_lab.outage import Backoff, OutageTracker, caused_by_outage, describe, is_outage
from robot_lab.workers.supervision import STARTING, Loop, Loops, supervise_poller


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def warning(self, event: str, **kw) -> None:
        self.lines.append((event, kw))


@pytest.mark.parametrize("exc, outage", [
    (rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), True),
    (rx.TimeoutError("Timeout reading from socket"), True),
    (rx.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (rx.ReadOnlyError("You can't write against a read only replica."), True),
    (rx.ResponseError("MASTERDOWN Link with MASTER is down"), True),
    (rx.ClusterDownError("CLUSTERDOWN The cluster is down"), True),
    (rx.AuthenticationError("invalid username-password pair"), False),
    (rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
    (ValueError("bug"), False),
    # a model provider's HTTP timeout (httpx wraps the builtin ones) or a reset connection
    (TimeoutError("The read operation timed out"), False),
    (ConnectionResetError("Connection reset by peer"), False),
])
def test_is_outage(exc, outage):
    assert is_outage(exc) is outage


def test_caused_by_outage_follows_the_chain():
    try:
        try:
            raise rx.ConnectionError("gone")
        except rx.ConnectionError as inner:
            raise RuntimeError("callback failed") from inner
    except RuntimeError as exc:
        assert caused_by_outage(exc) and not is_outage(exc)
    assert not caused_by_outage(RuntimeError("plain"))
    assert describe(rx.ConnectionError("a\nb")) == "ConnectionError: a"


def test_backoff_is_exponential_capped_and_jittered():
    backoff = Backoff(initial=0.1, cap=2.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(2.0, 0.1 * 2 ** n) for n in range(12)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings)), delays
    assert max(delays) <= 2.0 and delays[-1] >= 1.0
    assert len({round(d, 6) for d in delays[6:]}) > 1  # jitter: capped delays still differ
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_tracker_logs_one_line_per_state_change():
    rec = Recorder()
    tracker = OutageTracker("sweeper", backoff=Backoff(0.001, 0.002), logger=rec)
    for _ in range(5):
        tracker.lost(rx.ConnectionError("refused"))
    assert tracker.down and [e for e, _ in rec.lines] == ["redis.lost"]
    tracker.back()
    tracker.back()
    assert [e for e, _ in rec.lines] == ["redis.lost", "redis.back"]
    assert rec.lines[1][1]["attempts"] == 5 and rec.lines[0][1]["component"] == "sweeper"
    assert not tracker.down and tracker.outages == 1


def test_tracker_call_retries_outages_only():
    rec = Recorder()
    tracker = OutageTracker("task", backoff=Backoff(0.001, 0.002), logger=rec)
    attempts = iter([rx.ConnectionError("down"), rx.BusyLoadingError("LOADING"), "ok"])

    def flaky():
        item = next(attempts)
        if isinstance(item, Exception):
            raise item
        return item

    assert tracker.call(flaky) == "ok"
    assert [e for e, _ in rec.lines] == ["redis.lost", "redis.back"]
    with pytest.raises(rx.ResponseError):
        tracker.call(lambda: (_ for _ in ()).throw(rx.ResponseError("WRONGTYPE")))
    stop = threading.Event()
    stop.set()
    with pytest.raises(rx.ConnectionError):  # stopping: give up with the last outage error
        tracker.call(lambda: (_ for _ in ()).throw(rx.ConnectionError("down")), stop=stop)


def test_loop_states_and_problems():
    loop = Loop("bus-billing", idle_limit=10, busy_limit=100)
    now = time.monotonic()
    assert loop.problem(now) == f"{STARTING}bus-billing" and loop.state() == "starting"
    assert "did not start within" in loop.problem(now + 1000)
    loop.tick()
    assert loop.problem(time.monotonic()) is None and loop.state() == "idle"
    assert "stuck: no progress for" in loop.problem(time.monotonic() + 11)
    with loop.busy("handling"):
        assert loop.state() == "busy"
        assert loop.problem(time.monotonic() + 50) is None  # busy within its limit
        assert "stuck: handling without progress" in loop.problem(time.monotonic() + 101)
    loop.failed(rx.ResponseError("WRONGTYPE x"))
    assert loop.problem(time.monotonic()) is None  # one failed round is not a verdict
    assert "failing for" in loop.problem(time.monotonic() + 31)
    loop.succeeded()
    assert loop.problem(time.monotonic()) is None
    loop.died("RuntimeError: boom")
    assert loop.problem() == "bus-billing died: RuntimeError: boom" and loop.state() == "dead"


def test_probe_change_counts_as_progress():
    counter = {"n": 0}
    loop = Loop("rq", idle_limit=5, probe=lambda: counter["n"])
    assert loop.problem() == f"{STARTING}rq"  # the probe's first value is not progress
    counter["n"] = 1
    assert loop.problem() is None and loop.last is not None


def test_loops_thread_records_death_and_names_every_problem():
    loops = Loops()
    stop = threading.Event()
    good = loops.add("sweeper", idle_limit=60)
    bad = loops.add("bus-bad", idle_limit=60)

    def boom() -> None:
        raise rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    thread = loops.thread(bad, boom, stop=stop)
    thread.start()
    thread.join(5)
    good.tick()
    problem = loops.problem()
    assert problem.startswith("bus-bad died: ResponseError: WRONGTYPE")  # real problems first
    assert f"{STARTING}start-up" in problem
    loops.started()
    assert loops.problem() == "bus-bad died: ResponseError: WRONGTYPE Operation against a key holding the wrong kind of value"
    assert loops.info() == {"loops": {"sweeper": "idle", "bus-bad": "dead"}}
    # a thread that returns while the worker runs is dead too; after stop it is not
    quiet = loops.add("spawn-watcher", idle_limit=60)
    t = loops.thread(quiet, lambda: None, stop=stop)
    t.start()
    t.join(5)
    assert "spawn-watcher died: returned" in loops.problem()


class FakePoller:
    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.counts = {"acked": 0}

    def poll(self, block_ms: int | None = None) -> int:
        if self.errors:
            raise self.errors.pop(0)
        self.counts["acked"] += 1
        return 1


def test_supervised_poller_rides_out_outages_and_reports_other_failures():
    stop = threading.Event()
    loop = Loop("bus-x", idle_limit=5)
    loop.outage = OutageTracker("bus-x", backoff=Backoff(0.001, 0.002), logger=Recorder())
    poller = supervise_poller(FakePoller([rx.ConnectionError("down"), rx.ConnectionError("down"),
                                          rx.ResponseError("WRONGTYPE")]), loop, stop, handler_limit=60)
    assert poller.poll(block_ms=10) == 0 and loop.outage.down  # swallowed: the loop goes on
    assert poller.poll(block_ms=10) == 0
    with pytest.raises(rx.ResponseError):
        poller.poll(block_ms=10)
    assert loop.failing and loop.outage.down
    assert poller.poll(block_ms=10) == 1
    assert not loop.outage.down and loop.failing is None and loop.problem() is None
    assert [e for e, _ in loop.outage.log.lines] == ["redis.lost", "redis.back"]


def test_a_poller_whose_consumer_group_cannot_be_created_is_never_reported_serving():
    """The CI failure of stop 35: a round counts as progress from its start, so the probe
    read "ok" between the first round's start and the poller naming the wrong-typed key.
    Here the probe is taken inside that round (the real BusPoller on fakeredis, its inbox
    a string) and after it."""
    import fakeredis

    from robot_lab.bus import BusPoller

    client = fakeredis.FakeRedis()
    poller = BusPoller("bad", redis=client)
    client.set(poller.bus.keys.inbox("bad"), "not a stream")
    stop = threading.Event()
    loops = Loops()
    loops.started()
    loop = loops.add("bus-bad", idle_limit=60)
    seen: list[str | None] = []
    register = poller.bus.register

    def probing_register(robot: str) -> None:
        seen.append(loops.problem())  # the heartbeat thread's view, mid-round
        register(robot)

    poller.bus.register = probing_register  # type: ignore[method-assign]
    supervise_poller(poller, loop, stop, handler_limit=60)
    with pytest.raises(rx.ResponseError):
        poller.poll(block_ms=0)
    seen.append(loops.problem())  # after the round, before run_forever names the key
    assert seen == [f"{STARTING}bus-bad", f"{STARTING}bus-bad"], seen
    client.delete(poller.bus.keys.inbox("bad"))  # the operator's fix
    poller.poll(block_ms=0)
    assert poller.registered and loops.problem() is None
