"""A job hash a robot worker cannot decode -- ``data`` that is a code-running pickle, garbage
bytes, or missing -- fails that job (``JobRefused`` in rq's failed registry, one
``security.job_refused`` line naming it) and the same worker process serves the next job.

Before, each of them ended the worker's rq loop: the process exited with status 0 (under
honcho the whole Procfile stopped) or stayed up taking no job."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.enqueue import JOB_FUNC
from robot_lab.network.serializer import JobSerializer
from tests.fixtures.secure import APP, make_app
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow


class _Boom:
    """A pickle that runs a shell command when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        import subprocess

        return (subprocess.getoutput, (f"touch {self.marker}",))


def _bad_job(client: Any, queue: str, data: bytes | None) -> str:
    """A job hash as rq writes it, its ``data`` replaced by ``data`` (None: no field), pushed
    on ``queue`` as a hostile or broken writer would."""
    from rq import Queue

    job = Queue(queue, connection=client, serializer=JobSerializer).create_job(
        JOB_FUNC, args=["p", "no-such-run", "t", "j"])
    job.save()
    if data is None:
        client.hdel(job.key, "data")
    else:
        client.hset(job.key, "data", data)
    client.rpush(f"rq:queue:{queue}", job.id)
    return job.id


def _status(client: Any, job_id: str) -> str:
    from rq.job import Job

    try:
        job = Job.fetch(job_id, connection=client, serializer=JobSerializer)
    except Exception as exc:  # noqa: BLE001 - the test's message says what it read
        return f"unreadable ({type(exc).__name__}: {exc})"
    result, status = job.latest_result(), job.get_status()
    return f"{getattr(status, 'value', status)} {result.exc_string if result else ''}"


@pytest.mark.parametrize("in_flight", ["1", "4"])
def test_undecodable_jobs_fail_and_the_same_worker_serves_on(real_redis_url: str, key_prefix: str,
                                                            tmp_path: Path, in_flight: str,
                                                            processes, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)  # the run submitted below: the worker's prefix
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_LOG_LEVEL="INFO")
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP,
                              "--in-flight", in_flight], env, "worker")
    marker = tmp_path / "pwned"
    bad: dict[str, str] = {}
    try:
        wait_for_workers(client, ["robot:billing"], timeout=90)
        bad["pickled"] = _bad_job(client, "robot:billing", pickle.dumps(_Boom(marker)))
        bad["garbage"] = _bad_job(client, "robot:billing", b"\x00\xff not a job \xfe")
        bad["missing"] = _bad_job(client, "robot:billing", None)
        for kind, job_id in bad.items():
            wait_for(lambda job_id=job_id: "JobRefused" in _status(client, job_id), timeout=60)
        net = create_network(f"undecodable-{uid()}")
        net.task("answer", make_app().build_robot("billing"))
        result = Coordinator(connection=client, keys=Keys(prefix=key_prefix)).submit(net, "still serving").wait(timeout=60)
    except Exception:
        print(processes.logs())
        print({kind: _status(client, job_id) for kind, job_id in bad.items()})
        raise
    assert result.status == "completed" and result["answer"].reply == "echo: still serving"
    assert worker.poll() is None, processes.logs()
    assert not marker.exists()
    for kind, job_id in bad.items():
        assert "failed" in _status(client, job_id), kind
        assert "job data cannot be read" in _status(client, job_id), kind
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    for kind, job_id in bad.items():
        lines = [e for e in events if e.get("event") == "security.job_refused" and e.get("job_id") == job_id]
        assert len(lines) == 1, (kind, log[-3000:])
    client.close()
