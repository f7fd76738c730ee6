"""Helpers for tests that start real worker processes against a real Redis server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.hardened import child_pythonpath
from tests.redis_server import REPO_ROOT, wait_for

VENV_BIN = Path(sys.executable).parent


def uid() -> str:
    return uuid.uuid4().hex[:8]


def child_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    """The environment of a process under test on ``url`` and ``prefix``; under the hardened
    profile its PYTHONPATH also starts the profile's boot (tests/hardened.py), which gives the
    process its role's Redis user, keys and mount namespace."""
    env = dict(os.environ)
    env.update(
        REDIS_URL=url,
        ROBOT_LAB_KEY_PREFIX=prefix,
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        ROBOT_LAB_ALLOW_MODEL_REQUESTS="0",
        ROBOT_LAB_MAX_RETRIES="0",
        ROBOT_LAB_TASK_LEASE_MS="2000",
        ROBOT_LAB_LOG_LEVEL="WARNING",
        ROBOT_LAB_LOG_FORMAT="json",
        PYTHONPATH=child_pythonpath(),
    )
    env.update(extra)
    return env


FAN_NETWORK_MODULE = '''
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build

slow = build({robot!r}, model="scripted/sleep:{sleep_ms}")
network = create_network({name!r})
for i in range({tasks}):
    network.task(f"t{{i}}", slow)
network.task("total", slow, depends_on=[f"t{{i}}" for i in range({tasks})])
'''


def write_fan_network(directory: Path, module: str, robot: str, *, tasks: int, sleep_ms: int, name: str) -> None:
    """A module ``<module>.py`` in ``directory`` defining ``network``: ``tasks`` parallel
    ``scripted/sleep`` tasks of ``robot`` and a ``total`` task after all of them (for
    ``robot-lab run <module>:network``)."""
    directory.mkdir(exist_ok=True)
    (directory / f"{module}.py").write_text(
        FAN_NETWORK_MODULE.format(robot=robot, sleep_ms=sleep_ms, tasks=tasks, name=name))


class Processes:
    """Start processes in their own session; kill every one of them at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp_path / f"{name}.log", "wb")
        proc = subprocess.Popen(args, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        proc.log_path = self.tmp_path / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.args}\n{Path(p.log_path).read_text(errors='replace')[-3000:]}" for p in self.procs  # type: ignore[attr-defined]
        )

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes(tmp_path: Path):
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


def wait_for_workers(connection: Any, queues: list[str], timeout: float = 60.0) -> None:
    from rq import Queue, Worker

    def ready() -> bool:
        return all(Worker.all(queue=Queue(q, connection=connection)) for q in queues)

    wait_for(ready, timeout=timeout, interval=0.2)


def delete_prefix(client: Any, prefix: str) -> None:
    """Remove every key a test wrote under its unique prefix on a shared real server."""
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def publish_robot(client: Any, prefix: str, name: str, **build_kwargs: Any) -> Any:
    """A robot built from ``build_kwargs``, its spec published under ``prefix`` (so a
    ``robot-lab worker <name>`` with no app serves it)."""
    from robot_lab.keys import Keys
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.runtime.robot import build

    bot = build(name, **build_kwargs)
    publish_specs([bot.to_spec()], connection=client, keys=Keys(prefix=prefix))
    return bot
