"""Job injection: an rq job naming any function but robot-lab's task job is refused by every
kind of robot worker, before rq imports what it names, and the worker goes on.

The attack is the one a Redis user with ``rq:*`` access can make: a job whose function is
``subprocess.getoutput`` (here: ``touch <marker>``) put on ``robot:<robot>``. On a worker
without the job policy the marker appears; with it the job fails ``JobRefused`` (never
retried), ``security.job_refused`` is logged and the next job runs. Under
``signing.verify=require`` a worker also refuses a robot-lab job that the coordinator's key
did not sign (over job id, function and arguments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.enqueue import JOB_FUNC
from robot_lab.network.job_policy import job_class, refusal
from robot_lab.network.job_signing import KEY_ID_META, SIGNATURE_META
from robot_lab.network.serializer import JobSerializer
from robot_lab.runtime.robot import build
from robot_lab.settings import reload_settings
from tests.fixtures.secure import APP, make_app
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

COORDINATOR_KEY = "coordinator-test-key-0000000001"


def _inject(connection: Any, queue: str, marker: Path, *, serializer: Any = JobSerializer, **extra: Any) -> str:
    """What a hostile Redis user does: an rq job that runs a shell command in the worker."""
    from rq import Queue, Retry

    job = Queue(queue, connection=connection, serializer=serializer).enqueue_call(
        func=extra.pop("func", "subprocess.getoutput"), args=extra.pop("args", [f"touch {marker}"]),
        retry=Retry(max=2), **extra)
    return job.id


def _failure(connection: Any, job_id: str) -> str:
    from rq.job import Job

    job = Job.fetch(job_id, connection=connection, serializer=JobSerializer)
    status = job.get_status()
    return f"{getattr(status, 'value', status)} {job.latest_result().exc_string if job.latest_result() else ''}"


def _queue(prefix: str) -> str:
    return f"robot:{prefix}-victim"


def test_every_in_process_worker_class_refuses_a_foreign_function(real_client: Any, key_prefix: str,
                                                                   tmp_path: Path) -> None:
    """``robot-lab worker``'s rq worker (in flight 1 and N), the embedded workers and the
    plain-rq worker class each refuse the job and run the next one."""
    from rq import Queue

    from robot_lab.network.embedded import _worker_class
    from robot_lab.network.job_policy import plain_worker_class
    from robot_lab.workers.inflight import in_flight_worker_class
    from robot_lab.workers.process import robot_worker_class

    queue = _queue(key_prefix)
    classes = {"robot": robot_worker_class(), "in-flight": in_flight_worker_class(),
               "embedded": _worker_class(), "plain": plain_worker_class()}
    for label, cls in classes.items():
        marker = tmp_path / f"pwned-{label}"
        bad = _inject(real_client, queue, marker)
        good = Queue(queue, connection=real_client, serializer=JobSerializer).enqueue_call(
            func="os.path.join", args=["a", "b"])  # not robot-lab's either: refused as well
        kwargs: dict[str, Any] = {"in_flight": 4} if label == "in-flight" else {}
        qs = [Queue(queue, connection=real_client, serializer=JobSerializer)]
        worker = cls(qs, connection=real_client, serializer=JobSerializer, name=f"{key_prefix}-{label}", **kwargs)
        if label == "plain":
            worker.execute_job = lambda job, q, w=worker: w.perform_job(job, q, w.prepare_execution(job))  # no fork
        worker.work(burst=True, logging_level="WARNING")
        assert not marker.exists(), f"{label}: the injected command ran"
        assert "failed" in _failure(real_client, bad) and "JobRefused" in _failure(real_client, bad), label
        assert "subprocess.getoutput" in _failure(real_client, bad) and "is not a robot-lab job function" in \
            _failure(real_client, bad)
        assert "JobRefused" in _failure(real_client, good.id), label  # the worker went on to the next job
        assert Queue(queue, connection=real_client).count == 0  # refused, not retried


def test_the_policy_reads_only_data(real_client: Any, key_prefix: str, tmp_path: Path) -> None:
    """Instances, keyword arguments, wrong argument shapes and callbacks are refused too, and
    a refused job's callbacks are never imported."""
    from rq import Queue
    from rq.job import Callback

    queue = Queue(_queue(key_prefix), connection=real_client, serializer=JobSerializer)
    cls = job_class()

    def fetched(job: Any) -> Any:
        return cls.fetch(job.id, connection=real_client, serializer=JobSerializer)

    ok = fetched(queue.enqueue_call(func=JOB_FUNC, args=["p", "r", "t", "j"]))
    assert refusal(ok) is None
    for job, words in [
        (queue.enqueue_call(func=JOB_FUNC, args=["p", "r", "t"]), "four string arguments"),
        (queue.enqueue_call(func=JOB_FUNC, args=["p", "r", "t", "j"], kwargs={"x": 1}), "no keyword"),
        (queue.enqueue_call(func=JOB_FUNC, args=["p", "r", "t", 5]), "four string arguments"),
        (queue.enqueue_call(func=JOB_FUNC, args=["p", "r", "t", "j"],
                            on_failure=Callback("subprocess.getoutput")), "callbacks"),
    ]:
        assert words in (refusal(fetched(job)) or ""), words
    hooked = fetched(queue.enqueue_call(func="os.getcwd", on_failure=Callback("subprocess.getoutput")))
    with pytest.raises(Exception, match="not a robot-lab job function"):
        hooked.perform()
    assert hooked.failure_callback is None  # disarmed before rq's failure path could import it


@pytest.mark.slow
def test_a_robot_lab_worker_process_refuses_injected_jobs_and_serves_on(real_redis_url: str, key_prefix: str,
                                                                        tmp_path: Path,
                                                                        processes) -> None:  # noqa: F811
    """A real ``robot-lab worker`` (in flight 4) gets the injected job, then a network task."""
    client = redis.Redis.from_url(real_redis_url)
    env = child_env(real_redis_url, key_prefix)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP, "--in-flight", "4"],
                             env, "worker")
    marker = tmp_path / "pwned"
    try:
        wait_for_workers(client, ["robot:billing"], timeout=90)
        bad = _inject(client, "robot:billing", marker)
        net = create_network(f"jobs-{uid()}")
        net.task("answer", make_app().build_robot("billing"))
        result = Coordinator(connection=client).submit(net, "still serving").wait(timeout=60)
    except Exception:
        print(processes.logs())
        raise
    assert result.status == "completed" and result["answer"].reply == "echo: still serving"
    assert not marker.exists() and worker.poll() is None
    # in flight, the refused job ends on a thread of its own: it may be recorded after the task
    wait_for(lambda: "failed" in _failure(client, bad), timeout=30)
    assert "JobRefused" in _failure(client, bad)
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "security.job_refused" and e.get("job_id") == bad for e in events), log[-2000:]
    client.close()


@pytest.mark.slow
def test_plain_rq_worker_with_the_policy_class(real_redis_url: str, key_prefix: str, tmp_path: Path,
                                               processes) -> None:  # noqa: F811
    """``rq worker -w robot_lab.network.job_policy.RobotLabWorker``: the injected job is
    refused; a job whose ``meta`` is a code-running pickle is read without running it (the
    class forces the data-only serializer); a robot-lab task still runs."""
    import pickle

    client = redis.Redis.from_url(real_redis_url)
    bot = build(f"plain-{uid()}", model="scripted/echo")
    queue = f"robot:{bot.name}"
    env = child_env(real_redis_url, key_prefix)
    worker = processes.start([str(VENV_BIN / "rq"), "worker", "-w", "robot_lab.network.job_policy.RobotLabWorker",
                              queue, "--url", real_redis_url], env, "rq")
    marker, meta_marker = tmp_path / "pwned", tmp_path / "pwned-meta"

    class Boom:
        def __reduce__(self) -> Any:
            import subprocess

            return (subprocess.getoutput, (f"touch {meta_marker}",))

    try:
        wait_for_workers(client, [queue], timeout=60)
        bad = _inject(client, queue, marker, serializer=None)  # rq's default pickle, as a plain client writes
        meta_job = _inject(client, queue, marker, serializer=None, func=JOB_FUNC, args=["p", "r", "t", "j"])
        client.hset(f"rq:job:{meta_job}", "meta", pickle.dumps(Boom()))
        net = create_network(f"plain-{uid()}")
        net.task("answer", bot)
        result = Coordinator(connection=client).submit(net, "plain rq").wait(timeout=60)
    except Exception:
        print(processes.logs())
        raise
    assert result.status == "completed"
    assert not marker.exists() and not meta_marker.exists() and worker.poll() is None
    assert "JobRefused" in _failure(client, bad)
    client.close()


@pytest.mark.slow
def test_under_require_only_coordinator_signed_jobs_run(real_redis_url: str, key_prefix: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        processes) -> None:  # noqa: F811
    """A worker under ``signing.verify=require`` runs a run the coordinator's key signed and
    refuses an unsigned robot-lab job and a signed one whose arguments were changed."""
    keys = json.dumps({"coordinator": {"c1": COORDINATOR_KEY}})
    monkeypatch.setenv("ROBOT_LAB_SIGNING__KEYS", keys)
    reload_settings()
    client = redis.Redis.from_url(real_redis_url)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_SIGNING__KEYS=keys, ROBOT_LAB_SIGNING__VERIFY="require")
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP], env, "worker")
    try:
        wait_for_workers(client, ["robot:billing"], timeout=90)
        from rq import Queue

        unsigned = Queue("robot:billing", connection=client, serializer=JobSerializer).enqueue_call(
            func=JOB_FUNC, args=[key_prefix, "no-such-run", "answer", "rl-x-answer-1"])
        net = create_network(f"signed-{uid()}")
        net.task("answer", make_app().build_robot("billing"))
        handle = Coordinator(connection=client).submit(net, "signed")
        result = handle.wait(timeout=60)
        from rq.job import Job

        signed = next(j for j in Job.fetch_many([f"rl-{handle.run_id}-answer-1"], connection=client,
                                                 serializer=JobSerializer) if j is not None)
        assert signed.meta.get(KEY_ID_META) == "c1" and len(signed.meta.get(SIGNATURE_META, "")) == 64
        tampered = Queue("robot:billing", connection=client, serializer=JobSerializer).enqueue_call(
            func=JOB_FUNC, args=[key_prefix, handle.run_id, "other", signed.id], meta=dict(signed.meta))
        # each refused job's failure is recorded on a job thread of its own: wait for both
        for refused in (tampered, unsigned):
            wait_for(lambda refused=refused: "failed" in _failure(client, refused.id), timeout=60)
    except Exception:
        print(processes.logs())
        raise
    assert result.status == "completed"
    assert "is not signed by 'coordinator'" in _failure(client, unsigned.id)
    assert "does not match its id, function and arguments" in _failure(client, tampered.id)
    assert worker.poll() is None
    client.close()



def test_a_policed_job_reads_rqs_timestamps_as_rq_does_without_strptime(real_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """RobotLabJob.restore parses the timestamps rq writes itself (the same aware datetimes
    as rq's str_to_date), and leaves any other form to rq's own parse."""
    import rq.job
    from rq import Queue
    from rq.job import Job

    job = Queue(f"robot:ts-{uid()}", connection=real_client, serializer=JobSerializer).enqueue_call(
        func=JOB_FUNC, args=["p", "r", "t", "j"])
    real_client.hset(job.key, mapping={"started_at": "2026-01-02T03:04:05.000006Z",
                                       "last_heartbeat": "2026-01-02T03:04:05Z"})  # rq's older form
    raw = real_client.hgetall(job.key)
    expected = Job(job.id, connection=real_client, serializer=JobSerializer)
    expected.restore(raw)
    real = rq.job.str_to_date
    parsed: list[Any] = []
    monkeypatch.setattr(rq.job, "str_to_date", lambda v: parsed.append(v) or real(v))
    ours = job_class()(job.id, connection=real_client, serializer=JobSerializer)
    ours.restore(raw)
    for name in ("created_at", "enqueued_at", "started_at", "last_heartbeat"):
        assert getattr(ours, name) == getattr(expected, name) and getattr(ours, name).tzinfo is not None
    assert ours.ended_at is None and ours.args == expected.args
    assert parsed == [b"2026-01-02T03:04:05Z"]  # only the form rq writes no more went through strptime


def _unsigned_task_job(client: Any, queue: str, origin: str) -> str:
    """An unsigned robot-lab task job on ``queue`` whose hash claims ``origin``: what a
    writer of ``rq:*`` puts on a queue whose robot requires signed jobs."""
    from rq import Queue

    job = Queue(queue, connection=client, serializer=JobSerializer).create_job(
        JOB_FUNC, args=["p", f"no-such-run-{uid()}", "t", "j"])
    job.origin = origin
    job.save()
    client.rpush(f"rq:queue:{queue}", job.id)
    return job.id


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("command", ["robot-lab", "rq"])
def test_the_signing_mode_is_the_queues_not_the_jobs_origin(real_redis_url: str, key_prefix: str, command: str,
                                                             processes) -> None:  # noqa: F811
    """``signing.robots={"technical": "require"}``: an unsigned task job taken from
    ``robot:technical`` is refused whatever ``origin`` its hash names (technical's own,
    a robot under ``off``, none), by ``robot-lab worker`` and by plain ``rq worker -w``."""
    client = redis.Redis.from_url(real_redis_url)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_SIGNING__ROBOTS='{"technical": "require"}',
                    ROBOT_LAB_SIGNING__KEYS=json.dumps({"coordinator": {"c1": COORDINATOR_KEY}}))
    if command == "rq":
        args = [str(VENV_BIN / "rq"), "worker", "-w", "robot_lab.network.job_policy.RobotLabWorker",
                "robot:technical", "--url", real_redis_url]
    else:
        args = [str(VENV_BIN / "robot-lab"), "worker", "technical", "--app", APP]
    worker = processes.start(args, env, "worker")
    jobs: dict[str, str] = {}
    try:
        wait_for_workers(client, ["robot:technical"], timeout=90)
        for origin in ("robot:technical", "robot:general", ""):
            jobs[origin] = _unsigned_task_job(client, "robot:technical", origin)
        for origin, job_id in jobs.items():
            wait_for(lambda job_id=job_id: _failure(client, job_id).split(" ")[0] in ("failed", "finished"),
                     timeout=60)
    except Exception:
        print(processes.logs())
        raise
    for origin, job_id in jobs.items():
        assert "is not signed by 'coordinator'" in _failure(client, job_id), (origin, _failure(client, job_id))
    assert worker.poll() is None
    client.close()


def test_a_job_performed_outside_a_worker_gets_the_strictest_mode(real_client: Any, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """A policed job no worker stamped with its queue (``job.perform()`` called directly)
    is held to the strictest mode configured for any robot, not to its origin's."""
    from rq import Queue

    monkeypatch.setenv("ROBOT_LAB_SIGNING__ROBOTS", '{"technical": "require"}')
    reload_settings()
    try:
        job = Queue("robot:general", connection=real_client, serializer=JobSerializer).enqueue_call(
            func=JOB_FUNC, args=["p", "r", "t", "j"])
        fetched = job_class().fetch(job.id, connection=real_client, serializer=JobSerializer)
        assert "is not signed by 'coordinator'" in (refusal(fetched) or "")
        fetched.taken_from = "robot:general"  # a worker took it from general's queue: general's mode (off)
        assert refusal(fetched) is None
    finally:
        monkeypatch.delenv("ROBOT_LAB_SIGNING__ROBOTS")
        reload_settings()
