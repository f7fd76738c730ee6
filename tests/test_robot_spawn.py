"""spawn(): a robot created at run time is published and served by a generic worker pool
(`robot-lab worker --spawned`, a real process on real Redis)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import robot_lab
from robot_lab import connection


def test_spawn_is_served_by_a_generic_worker(real_redis_url: str, key_prefix: str, monkeypatch) -> None:
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setattr(connection, "_clients", {})
    env = dict(os.environ, REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    robot_lab_bin = Path(sys.executable).parent / "robot-lab"
    worker = subprocess.Popen([str(robot_lab_bin), "worker", "--spawned"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        parent = robot_lab.build(name="parent", model="scripted/text:from the child")
        name = f"child-{uuid.uuid4().hex[:6]}"
        child = parent.spawn(name, system_prompt="You are a spawned helper.")
        assert child.spec.model == "scripted/text:from the child"  # inherited from the parent
        assert child.ask("hello child", timeout=90) == "from the child"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(timeout=30) == 0
        finally:
            if worker.poll() is None:
                worker.kill()


def test_spawn_with_an_unimportable_tool_fails_before_publishing(redis_client) -> None:
    parent = robot_lab.build(name="parent")
    with pytest.raises(robot_lab.ConfigurationError, match="cannot import"):
        parent.spawn("broken", local_tools=["nowhere.mod:fn"])
