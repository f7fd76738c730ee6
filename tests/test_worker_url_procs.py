"""A worker told its Redis only by ``--url`` (no REDIS_URL in its environment) keeps what its
robots reach through the default client -- here a network's token budget ledger -- on that
Redis, not in an in-process fakeredis of its own: two such workers share the budget, as two
workers configured by REDIS_URL do (tests/test_network_budget_procs.py). Both ways: the
plain ``rq worker robot:X --url`` and ``robot-lab worker X --url``."""

from __future__ import annotations

import pytest
import redis

from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.run_state import DEFAULT_LEASE_MS
from robot_lab.runtime.rails.budget import RedisLedger
from robot_lab.runtime.registry import publish_specs
from robot_lab.runtime.robot import build
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

BUDGET = 150


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", ["rq", "robot-lab"])
def test_workers_given_only_a_url_share_the_runs_budget_on_that_redis(real_redis_url, key_prefix, monkeypatch,
                                                                      processes, command):  # noqa: F811
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    suffix = uid()
    robots = [build(f"urlspender{i}-{suffix}", model="scripted/sleep:150") for i in range(4)]
    net = create_network("budgeted", config={"token_budget": BUDGET})
    with net.parallel("spenders"):
        for i, robot in enumerate(robots):
            net.task(f"s{i}", robot)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_TASK_LEASE_MS=str(DEFAULT_LEASE_MS))
    del env["REDIS_URL"]  # the URL only on the command line
    queues = [f"robot:{r.name}" for r in robots]
    client = redis.Redis.from_url(real_redis_url)
    publish_specs([r.to_spec() for r in robots], connection=client)
    for n in range(2):
        argv = ([str(VENV_BIN / "rq"), "worker", *queues] if command == "rq" else
                [str(VENV_BIN / "robot-lab"), "worker", *[r.name for r in robots], "--no-bus"])
        processes.start([*argv, "--url", real_redis_url], env, f"w{n}")
    try:
        wait_for_workers(client, queues, timeout=90)
        message = "please spend some tokens on this rather long request about invoices " * 2
        result = Coordinator(connection=client).submit(net, message).wait(timeout=120)
        consumed = RedisLedger(f"run:{result.run_id}", redis=client).consumed.get("tokens", 0.0)
        per_call = max(r.input_tokens + r.output_tokens for r in result.context.values())
        assert per_call > 0
        # the ledger the workers charged is this Redis's (a private one per worker reads 0 here
        # and lets every call through)
        assert consumed >= per_call, consumed
        assert consumed <= BUDGET + per_call, (consumed, per_call)
        errors = [r.error for r in result.context.values() if r.error]
        assert any("BudgetExceeded" in e for e in errors), errors
    except Exception:
        print(processes.logs())
        raise
    finally:
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.mark.timeout(300)
def test_a_robot_served_by_a_worker_given_only_a_url_keeps_its_memory_on_that_redis(real_redis_url, key_prefix,
                                                                                     monkeypatch, processes):  # noqa: F811
    """The robot's own memory (``robot.memory``, scope ``robot:<name>``: "shared by all workers
    of that robot") written by a tool while the worker serves a bus message."""
    from robot_lab.bus import Bus
    from robot_lab.keys import Keys
    from robot_lab.memory.store import Memory
    from tests.fixtures.noter import APP

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    keys = Keys(prefix=key_prefix)
    env = child_env(real_redis_url, key_prefix)
    del env["REDIS_URL"]
    processes.start([str(VENV_BIN / "robot-lab"), "worker", "noter", "--app", APP, "--url", real_redis_url],
                    env, "noter")
    client = redis.Redis.from_url(real_redis_url)
    try:
        wait_for_workers(client, ["robot:noter"], timeout=90)
        reply = Bus(client, keys=keys).request("noter", "take a note", timeout=60)
        assert reply.content.startswith("echo: take a note") and "noted" in reply.content, reply.content
        assert Memory.for_robot("noter", redis=client, keys=keys).get("noted") == "a"
    except Exception:
        print(processes.logs())
        raise
    finally:
        keys_left = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys_left:
            client.delete(*keys_left)
        client.close()
