"""The in-flight rq worker (robot_lab/workers/inflight.py) on a real Redis, in this process:
it runs several jobs at once through rq's own job lifecycle (results, failures), never more
than its slots, and a burst run waits for the jobs in hand before it quits."""

from __future__ import annotations

import threading
import uuid

import pytest

from robot_lab import folded_writes
from robot_lab.workers.inflight import in_flight_worker_class

_barrier = threading.Barrier(3, timeout=60)
_active = {"now": 0, "most": 0}
_lock = threading.Lock()


def meet(n: int) -> str:
    """A job that returns only once three jobs run at the same time."""
    _barrier.wait()
    return f"met {n}"


def count(n: int) -> int:
    """A job that records how many jobs run at once."""
    with _lock:
        _active["now"] += 1
        _active["most"] = max(_active["most"], _active["now"])
    threading.Event().wait(0.05)
    with _lock:
        _active["now"] -= 1
    return n


def boom() -> None:
    raise ValueError("boom")


@pytest.fixture
def queue(real_client):  # type: ignore[no-untyped-def]
    from rq import Queue

    from robot_lab.network.serializer import JobSerializer

    q = Queue(f"inflight-{uuid.uuid4().hex[:8]}", connection=real_client, serializer=JobSerializer)
    yield q
    q.delete(delete_jobs=True)


def _worker(queue, in_flight: int):  # type: ignore[no-untyped-def]
    """The worker with rq's plain job class: these jobs are test functions, which the job
    policy (network/job_policy.py, tests/test_security_jobs.py) refuses."""
    from rq.job import Job

    from robot_lab.network.serializer import JobSerializer

    cls = in_flight_worker_class()
    return cls([queue], connection=queue.connection, serializer=JobSerializer, in_flight=in_flight, job_class=Job)


def test_jobs_run_at_once_through_rqs_lifecycle(queue) -> None:  # type: ignore[no-untyped-def]
    jobs = [queue.enqueue_call(func=f"{__name__}.meet", args=(i,), result_ttl=60) for i in range(3)]
    failing = queue.enqueue_call(func=f"{__name__}.boom", result_ttl=60)
    worker = _worker(queue, 3)
    worker.work(burst=True, logging_level="WARNING")
    assert not _barrier.broken  # the three ran at the same time
    assert [j.latest_result().return_value for j in jobs] == ["met 0", "met 1", "met 2"]
    assert failing.get_status(refresh=True) == "failed"
    assert failing.id in queue.failed_job_registry.get_job_ids()
    assert len(queue.finished_job_registry) == 3
    assert worker.jobs_done == 4 and worker.progress() == {"state": "idle", "in_flight": 0}


def test_never_more_jobs_than_slots_and_work_runs_again(queue) -> None:  # type: ignore[no-untyped-def]
    _active.update(now=0, most=0)  # whatever ran before in this process
    jobs = [queue.enqueue_call(func=f"{__name__}.count", args=(i,), result_ttl=60) for i in range(8)]
    worker = _worker(queue, 2)
    worker.work(burst=True, logging_level="WARNING")
    assert [j.latest_result().return_value for j in jobs] == list(range(8))
    assert 1 <= _active["most"] <= 2  # at most its two slots
    # work() again on the same worker (what process.py does after a Redis outage)
    again = queue.enqueue_call(func=f"{__name__}.count", args=(9,), result_ttl=60)
    worker.work(burst=True, logging_level="WARNING")
    assert again.latest_result().return_value == 9


def test_free_slots_are_filled_by_one_batch_and_a_stop_gives_unstarted_jobs_back(queue) -> None:  # type: ignore[no-untyped-def]
    """Free slots take jobs in one pipelined batch (the pops rq makes: into the intermediate
    list), in queue order, skipping a job deleted while queued; jobs a stop leaves unstarted
    go back to the head of the queue in order, out of the intermediate list."""
    jobs = [queue.enqueue_call(func=f"{__name__}.count", args=(i,), result_ttl=60) for i in range(10)]
    queue.connection.delete(jobs[3].key)  # its hash gone while its id is still queued
    worker = _worker(queue, 8)
    batch = worker._dequeue_batch(8)
    assert [job.id for job, _ in batch] == [j.id for j in jobs[:8] if j is not jobs[3]]
    assert all(q.name == queue.name for _, q in batch)
    assert queue.get_job_ids() == [jobs[8].id, jobs[9].id]
    intermediate = [i.decode() for i in queue.connection.lrange(queue.intermediate_queue_key, 0, -1)]
    assert set(intermediate) == {j.id for j in jobs[:8]}
    worker._taken.extend(batch)
    worker._give_back_taken()
    assert queue.get_job_ids() == [job.id for job, _ in batch] + [jobs[8].id, jobs[9].id]
    left = [i.decode() for i in queue.connection.lrange(queue.intermediate_queue_key, 0, -1)]
    assert left == [jobs[3].id]  # the deleted job's id stays for rq's own cleanup, as after rq's pop
    worker.work(burst=True, logging_level="WARNING")
    assert [j.latest_result().return_value for j in jobs if j is not jobs[3]] == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def spin(seconds: float) -> str:
    """A job that works (in Python) for ``seconds``."""
    end = threading.Event()
    for _ in range(int(seconds * 100)):
        end.wait(0.01)
    return "done"


def test_a_job_past_its_rq_timeout_fails_with_rqs_timeout_while_others_finish(queue) -> None:  # type: ignore[no-untyped-def]
    slow = queue.enqueue_call(func=f"{__name__}.spin", args=(30,), timeout=1, result_ttl=60)
    quick = [queue.enqueue_call(func=f"{__name__}.spin", args=(0.1,), timeout=5, result_ttl=60) for _ in range(3)]
    worker = _worker(queue, 4)
    worker.work(burst=True, logging_level="WARNING")
    assert slow.get_status(refresh=True) == "failed"
    assert "JobTimeoutException" in (slow.latest_result().exc_string or "")
    assert [j.latest_result().return_value for j in quick] == ["done"] * 3


def test_a_redis_outage_during_a_batch_pop_is_ridden_out_by_rqs_dequeue(queue, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A batch pop that fails because Redis is away does not end the worker's loop: the
    outage is recorded and rq's own blocking dequeue (which retries) takes over."""
    import redis

    jobs = [queue.enqueue_call(func=f"{__name__}.count", args=(i,), result_ttl=60) for i in range(3)]
    worker = _worker(queue, 4)
    failures = iter([True])

    real = worker._dequeue_batch

    def flaky(limit: int):  # type: ignore[no-untyped-def]
        if next(failures, False):
            raise redis.exceptions.ConnectionError("Redis is away")
        return real(limit)

    monkeypatch.setattr(worker, "_dequeue_batch", flaky)
    worker.work(burst=True, logging_level="WARNING")
    assert [j.latest_result().return_value for j in jobs] == [0, 1, 2]
    assert worker._tracker().outages == 1


def test_network_tasks_leave_rq_the_same_records_as_rqs_own_lifecycle(real_client) -> None:  # type: ignore[no-untyped-def]
    """``robot-lab worker`` (in flight or not) runs task jobs on a lifecycle of its own (one
    pipeline to start, one to finish); a plain rq SimpleWorker runs the same network's jobs
    through rq's: each
    task's job ends finished, with the same result, in the finished registry, nothing left
    started, in an execution or on the intermediate list -- what ``rq info`` and
    ``job.latest_result()`` read."""
    from tests.rq_records import network_rq_records, rq_simple_worker

    def records(worker_class, **kwargs):  # type: ignore[no-untyped-def]
        return network_rq_records(real_client, worker_class, **kwargs)

    from robot_lab.workers.process import robot_worker_class

    lean = records(in_flight_worker_class(), in_flight=4)
    one_at_a_time = records(robot_worker_class())  # robot-lab worker --in-flight 1
    rq_own = records(rq_simple_worker())
    assert lean == one_at_a_time == rq_own
    assert lean["statuses"] == ["finished"] * 4 and lean["results"] == ["ok"] * 4
    assert lean["finished"] and lean["started"] == lean["intermediate"] == lean["executions"] == 0
    assert lean["successful"] == 4


def test_a_result_other_than_the_one_recorded_with_the_script_is_rqs_newest(queue) -> None:  # type: ignore[no-untyped-def]
    """rq's finish records ride with the task's result script, recording the return value of
    an ``ok`` result; when the job returns something else (the script refused the result),
    rq's newest result is what the job returned, and the job stays finished once."""
    from rq.job import Job

    from robot_lab.network.serializer import JobSerializer

    real_client = queue.connection
    job = queue.enqueue_call(func=f"{__name__}.count", args=(1,), result_ttl=60)
    worker = _worker(queue, 2)
    taken = queue.dequeue_any([queue], None, connection=real_client, job_class=worker.job_class,
                              serializer=JobSerializer)[0]
    execution = worker._start_task_job(taken, queue)
    taken.rq_start.flush(real_client)
    assert Job.fetch(job.id, connection=real_client, serializer=JobSerializer).get_status() == "started"
    finish = taken.rq_finish
    finish.pending = {"task": "t", "status": "ok", "failed": False}
    real_client.script_load(folded_writes.APPLY)  # cached, as after a first task (else complete writes them plainly)
    pipe = real_client.pipeline(transaction=False)
    finish.queue(pipe)  # as RunStore.complete does, behind the script
    pipe.execute()
    finish.written = True
    worker._finish_task_job(taken, execution, {"task": "t", "status": "superseded"})
    again = Job.fetch(job.id, connection=real_client, serializer=JobSerializer)
    assert again.get_status() == "finished"
    assert again.latest_result().return_value == {"task": "t", "status": "superseded"}
    assert queue.finished_job_registry.get_job_ids() == [job.id] and len(queue.started_job_registry) == 0
    worker.refresh()
    assert worker.successful_job_count == 1


def test_the_one_at_a_time_worker_looks_idle_only_once_the_jobs_end_is_written(queue) -> None:  # type: ignore[no-untyped-def]
    """rq's SIGTERM handler raises StopRequested wherever the main thread is when the worker
    looks idle. rq's finish records (its ``idle`` among them) are queued behind the task's
    result script, so the worker must stay busy until that round trip is done: else a SIGTERM
    while it was on the wire failed the job mid-write and the worker never stopped."""
    from rq.job import Job

    from robot_lab.network.serializer import JobSerializer
    from robot_lab.workers.process import robot_worker_class

    real_client = queue.connection
    queue.enqueue_call(func=f"{__name__}.count", args=(1,), result_ttl=60)
    worker = robot_worker_class()([queue], connection=real_client, serializer=JobSerializer, job_class=Job)
    taken = queue.dequeue_any([queue], None, connection=real_client, job_class=worker.job_class,
                              serializer=JobSerializer)[0]
    execution = worker._start_task_job(taken, queue)
    taken.rq_start.flush(real_client)
    assert worker.get_state() == "busy"
    finish = taken.rq_finish
    finish.pending = {"task": "t", "status": "ok", "failed": False}
    real_client.script_load(folded_writes.APPLY)  # cached, as after a first task (else complete writes them plainly)
    pipe = real_client.pipeline(transaction=False)
    finish.queue(pipe)  # as RunStore.complete does, behind the script: not sent yet
    assert worker.get_state() == "busy"
    pipe.execute()
    finish.written = True
    worker._finish_task_job(taken, execution, finish.pending)
    assert worker.get_state() == "idle"
    assert real_client.hget(worker.key, "state") == b"idle"


def test_an_in_flight_worker_tunes_the_collector_once_it_takes_jobs(queue) -> None:  # type: ignore[no-untyped-def]
    """Start-up's objects are frozen out of full collections and young collections run less
    often than CPython's default once the worker takes jobs (see tune_gc)."""
    import gc

    from robot_lab.workers.inflight import GC_YOUNG

    job = queue.enqueue_call(func=f"{__name__}.count", args=(1,), result_ttl=60)
    _worker(queue, 2).work(burst=True, logging_level="WARNING")
    assert job.latest_result().return_value == 1
    assert gc.get_threshold()[0] >= GC_YOUNG and gc.get_freeze_count() > 0


def test_the_worker_computes_a_protocols_members_once_and_isinstance_answers_the_same(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """rq checks its Serializer protocol on every job, registry and result object; on 3.11
    each check walked the protocol's MRO twice. The worker remembers each protocol's members
    (remember_protocol_members): isinstance answers as before, and the walk happens once."""
    import sys
    import typing

    from rq.serializers import JSONSerializer, Serializer

    from robot_lab.network.serializer import JobSerializer
    from robot_lab.workers import inflight

    if sys.version_info >= (3, 12):
        pytest.skip("3.12 computes a protocol's members once per class itself")
    walks: list[type] = []
    original = typing._get_protocol_attrs

    def counted(cls):  # type: ignore[no-untyped-def]
        walks.append(cls)
        return original(cls)

    monkeypatch.setattr(typing, "_get_protocol_attrs", counted)

    @typing.runtime_checkable
    class Sized(typing.Protocol):
        size: int

        def grow(self) -> None: ...

    class Big:
        size = 3

        def grow(self) -> None:
            pass

    class Small:
        def grow(self) -> None:
            pass

    before = [isinstance(x, p) for x in (JobSerializer, JSONSerializer, object(), Big(), Small())
              for p in (Serializer, Sized)]
    assert walks  # the stock path walks the members on every check
    inflight.remember_protocol_members()
    walks.clear()
    after = [isinstance(x, p) for _ in range(3) for x in (JobSerializer, JSONSerializer, object(), Big(), Small())
             for p in (Serializer, Sized)]
    assert after == before * 3
    assert before == [True, False, True, False, False, False, False, True, False, False]
    assert sorted(c.__name__ for c in walks) == ["Serializer", "Sized"]  # once per protocol


def test_a_task_jobs_execution_id_costs_no_system_call(real_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """rq's Execution.create takes its id from uuid4 (an os.urandom system call, which hands
    the interpreter lock away); the task lifecycle makes the same records with a uuid4 from
    robot_lab.randomness's buffer."""
    import rq.executions
    from rq import Queue
    from rq.job import Job

    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.runtime.robot import build

    def no_syscall():  # type: ignore[no-untyped-def]
        raise AssertionError("uuid4 called")

    monkeypatch.setattr(rq.executions, "uuid4", no_syscall)
    bot = build(f"exec-{uuid.uuid4().hex[:6]}", model="scripted/echo")
    net = create_network("exec")
    for i in range(3):
        net.task(f"t{i}", bot)
    handle = Coordinator(connection=real_client).submit(net, "hi")
    queue = Queue(f"robot:{bot.name}", connection=real_client, serializer=JobSerializer)
    try:
        worker = in_flight_worker_class()([queue], connection=real_client, serializer=JobSerializer, in_flight=3)
        worker.work(burst=True, logging_level="WARNING")
        assert handle.status == "completed"
        job_ids = [v.decode() for v in real_client.hvals(handle.store.key + ":jobs")]
        results = [Job.fetch(j, connection=real_client, serializer=JobSerializer).latest_result() for j in job_ids]
        assert [r.return_value["status"] for r in results] == ["ok"] * 3
        ids = [uuid.UUID(hex=r.execution_id) for r in results]
        assert all(i.version == 4 for i in ids) and len(set(ids)) == 3
        assert len(queue.started_job_registry) == 0 and len(queue.finished_job_registry) == 3
    finally:
        queue.delete(delete_jobs=True)


def test_the_switch_interval_grows_with_the_slots_between_cpythons_default_and_50_ms():
    """A few thousand warm threads waking together livelocked a worker on their GIL requests
    (bench/concurrency.py --count 5000, a second round: 112 ms CPU per task); the in-flight
    worker lengthens the interval with its slots."""
    import sys

    from robot_lab.workers.inflight import tune_switch_interval

    saved = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        assert tune_switch_interval(16) == 0.005 and sys.getswitchinterval() == 0.005  # small workers: unchanged
        assert abs(tune_switch_interval(1000) - 0.01) < 1e-9
        assert abs(sys.getswitchinterval() - 0.01) < 1e-6
        assert tune_switch_interval(5000) == 0.05
        assert tune_switch_interval(100_000) == 0.05  # capped
    finally:
        sys.setswitchinterval(saved)


_ARENAS_CHILD = r"""
import ctypes, sys, threading
from robot_lab.workers.inflight import cap_malloc_arenas
print("capped" if (sys.argv[1] == "cap" and cap_malloc_arenas()) else "uncapped", flush=True)
barrier = threading.Barrier(8)
keep = []
def work():  # a thread's first malloc takes an arena (a new one while glibc's limit allows)
    keep.append(bytearray(100_000)); keep.append([bytes(2000) for _ in range(50)])
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
ctypes.CDLL(None).malloc_stats()  # "Arena N:" per arena, on stderr
"""


def _arenas(mode: str, env: dict[str, str]) -> tuple[str, int]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _ARENAS_CHILD, mode], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), sum(1 for line in out.stderr.splitlines() if line.startswith("Arena "))


def test_an_in_flight_worker_caps_mallocs_arenas_unless_the_operator_set_them() -> None:
    """Many task threads, two glibc arenas (peak RSS of a wide fan-out, bench/concurrency.py);
    MALLOC_ARENA_MAX in the environment wins. Real threads in a fresh process, counted by
    glibc's own malloc_stats."""
    import os
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc only")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    said, capped = _arenas("cap", env)
    assert said == "capped" and 1 <= capped <= 2
    said, uncapped = _arenas("none", env)
    assert said == "uncapped" and uncapped > 2  # the test can fail: without the cap, a thread gets an arena
    said, chosen = _arenas("cap", dict(env, MALLOC_ARENA_MAX="4"))
    assert said == "uncapped" and 2 < chosen <= 4  # the operator's 4, not our 2


def test_the_worker_process_caps_arenas_only_when_it_runs_many_things_at_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.errors import ConfigurationError
    from robot_lab.workers import process

    calls: list[int] = []
    monkeypatch.setattr(process, "cap_malloc_arenas", lambda: calls.append(1) or True)
    monkeypatch.setattr(process, "connect", lambda url: (_ for _ in ()).throw(ConfigurationError("stop here")))
    for in_flight, expected in ((1, 0), (8, 1)):
        calls.clear()
        with pytest.raises(ConfigurationError, match="stop here"):
            process.run_worker(["billing"], url="redis://127.0.0.1:1/0", in_flight=in_flight)
        assert len(calls) == expected


@pytest.mark.timeout(120)
def test_a_stop_taken_before_the_blocking_dequeue_is_not_left_waiting_in_it(queue) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM while the loop is between rq's stop check and its blocking dequeue (start-up:
    the first dequeue tunes the collector) only marks the stop; the loop must not then block
    in rq's BLMOVE for its whole timeout (minutes: `robot-lab worker` stopped right after rq
    listed it hung 5 times in 6)."""
    import time

    from rq.exceptions import StopRequested

    worker = _worker(queue, 4)
    worker._shutdown()  # the signal handler's work, with the main thread not yet waiting
    assert worker._stop_requested
    started = time.monotonic()
    with pytest.raises(StopRequested):
        # the loop's own timeout (rq's BLMOVE on an empty queue: minutes)
        worker.dequeue_job_and_maintain_ttl(worker.dequeue_timeout)
    assert time.monotonic() - started < 60  # not the BLMOVE's own timeout (minutes)


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_a_worker_ends_its_command_listener_at_once_after_unsubscribing(queue, one_at_a_time) -> None:  # type: ignore[no-untyped-def]
    """rq's teardown unsubscribes the worker's command channel, then stops its listener
    thread, and redis-py waits for that thread. A listener that read the unsubscribe reply
    first went back to waiting for a subscription for rq's 60 s: a burst run returned (and a
    SIGTERM'd ``robot-lab worker`` exited) a minute late, its 60 s results already gone."""
    from rq.job import Job

    from robot_lab.network.serializer import JobSerializer
    from robot_lab.workers.process import robot_worker_class
    from tests.redis_server import wait_for

    if one_at_a_time:
        worker = robot_worker_class()([queue], connection=queue.connection, serializer=JobSerializer, job_class=Job)
    else:
        worker = _worker(queue, 4)
    worker.subscribe()
    worker.pubsub.unsubscribe()
    wait_for(lambda: not worker.pubsub.subscribed, timeout=60)  # the listener read the reply: the losing order
    stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopping.start()
    stopping.join(30)  # half of the minute it waited
    assert not stopping.is_alive()
