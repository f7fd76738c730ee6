"""A finished run leaves nothing that lives forever: its default memory scope expires with
its keys, and the ``runs`` index drops entries whose runs have expired
(robot_lab/network/retention.py; numbers in bench/run_retention.py)."""

from __future__ import annotations

import time

from robot_lab.keys import default_keys
from robot_lab.memory.scope import ScopeKeys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.network.run_state import RUN_TTL
from robot_lab.runtime.robot import build
from tests.worker_procs import uid


def test_run_memory_expires_with_the_run_and_the_index_is_trimmed(redis_client) -> None:  # type: ignore[no-untyped-def]
    keys = default_keys()
    redis_client.zadd(keys.runs_index(), {"long-gone": time.time() - RUN_TTL - 60})  # its record expired
    robot = f"keeper-{uid()}"
    net = create_network(f"keep-{uid()}")
    net.task("a", build(robot, model="scripted/echo"), memory_key="a")
    with EmbeddedWorkers(redis_client, [robot], threads=1):
        handle = Coordinator(connection=redis_client).submit(net, "remember me")
        assert handle.wait(timeout=60).status == "completed"
    scope = ScopeKeys.of(keys, f"run:{handle.run_id}")
    assert redis_client.hget(scope.hash, "a") is not None  # written, then set to expire with the run
    for key in (scope.hash, scope.version, scope.changes):
        assert 0 < redis_client.ttl(key) <= RUN_TTL, key
    assert redis_client.ttl(keys.run(handle.run_id)) > 0
    assert redis_client.zscore(keys.runs_index(), "long-gone") is None
    assert redis_client.zscore(keys.runs_index(), handle.run_id) is not None
