"""A bus key of the wrong type (here: billing's conversation-heads hash turned into a
stream by a Redis user with write access) never kills the robot's bus poller: a real
``robot-lab worker`` keeps running, ``robot-lab health`` and ``robot-lab status`` name the key,
and once the key is deleted the message sent meanwhile is answered."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.bus import Bus
from robot_lab.bus.key_types import wrong_typed_keys
from robot_lab.keys import Keys
from tests.fixtures.secure import APP
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes  # noqa: F401

pytestmark = pytest.mark.slow


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "robot-lab"), *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_wrong_typed_key_is_named_and_the_worker_serves_on(real_redis_url: str, key_prefix: str,
                                                             processes) -> None:  # noqa: F811
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(key_prefix)
    env = child_env(real_redis_url, key_prefix)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP], env, "worker")
    bus = Bus(client, keys=keys)
    replies: list[Any] = []
    try:
        wait_for(lambda: worker.poll() is not None or client.zcard(keys.workers()) > 0, timeout=90)
        assert bus.request("billing", "before", from_="frontdesk", timeout=60).content == "echo: before"
        heads = keys.conversation_heads("billing")
        client.delete(heads)
        client.xadd(heads, {"x": "y"})  # the squat
        asker = threading.Thread(target=lambda: replies.append(
            bus.request("billing", "during", from_="frontdesk", conversation_id="c-1", timeout=120)))
        asker.start()
        wait_for(lambda: heads in _cli(["health"], env).stdout, timeout=60, interval=0.5)
        health = _cli(["health"], env)
        status = json.loads(_cli(["status", "billing", "--json"], env).stdout)
        assert worker.poll() is None
        assert any(heads in p and "is a stream, not a hash" in p for p in status["problems"]), status["problems"]
        assert health.returncode != 0 and f"{heads} is a stream, not a hash" in health.stdout
        assert wrong_typed_keys(client, keys, "billing") == [f"{heads} is a stream, not a hash"]
        client.delete(heads)  # the operator's fix
        asker.join(120)
    except Exception:
        print(processes.logs())
        raise
    assert [r.content for r in replies] == ["echo: during"]
    assert worker.poll() is None
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    assert "bus.wrong_type_key" in log and "Traceback" not in log, log[-3000:]
    client.close()
