"""A network-run token budget shared by two worker processes on real Redis: robots running
concurrently on the scripted model never spend more than the budget plus one call, and the
call that would overspend is refused with BudgetExceeded naming the run's scope."""

from __future__ import annotations

import pytest
import redis

from robot_lab.runtime.rails.budget import RedisLedger
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.run_state import DEFAULT_LEASE_MS
from robot_lab.runtime.registry import publish_specs
from robot_lab.runtime.robot import build
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

BUDGET = 150


@pytest.mark.parametrize("told", ["REDIS_URL", "rq --url", "robot-lab --url"])
def test_two_workers_share_a_network_budget(real_redis_url, key_prefix, monkeypatch, processes, told):  # noqa: F811
    """``told``: how the workers learn their Redis -- REDIS_URL in their environment, or only
    ``--url`` on the command line of ``rq worker`` / ``robot-lab worker`` (then it is also the
    default Redis of what their robots keep, connection.adopt_default: before, each worker's
    was an in-process fakeredis of its own)."""
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    suffix = uid()
    robots = [build(f"spender{i}-{suffix}", model="scripted/sleep:150") for i in range(4)]
    net = create_network("budgeted", config={"token_budget": BUDGET})
    with net.parallel("spenders"):
        for i, robot in enumerate(robots):
            net.task(f"s{i}", robot)
    # no worker dies: the production lease, not child_env's 2 s (each job's horse imports
    # litellm under the task's lease; a starved one must not lose it and re-run the call)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_TASK_LEASE_MS=str(DEFAULT_LEASE_MS))
    queues = [f"robot:{r.name}" for r in robots]
    client = redis.Redis.from_url(real_redis_url)
    if told == "REDIS_URL":
        argv = [str(VENV_BIN / "rq"), "worker", *queues]
    else:
        del env["REDIS_URL"]  # the URL only on the command line
        publish_specs([r.to_spec() for r in robots], connection=client)
        argv = ([str(VENV_BIN / "rq"), "worker", *queues] if told.startswith("rq") else
                [str(VENV_BIN / "robot-lab"), "worker", *[r.name for r in robots], "--no-bus"])
    for n in range(2):  # two workers, each listening on every queue
        processes.start([*argv, "--url", real_redis_url], env, f"w{n}")
    try:
        wait_for_workers(client, queues, timeout=60)
        message = "please spend some tokens on this rather long request about invoices " * 2
        result = Coordinator(connection=client).submit(net, message).wait(timeout=120)
        ledger = RedisLedger(f"run:{result.run_id}", redis=client)
        consumed = ledger.consumed.get("tokens", 0.0)
        per_call = max(r.input_tokens + r.output_tokens for r in result.context.values())
        assert per_call > 0
        assert consumed >= per_call, consumed  # the workers charged this Redis's ledger
        assert consumed <= BUDGET + per_call, (consumed, per_call)
        errors = [r.error for r in result.context.values() if r.error]
        assert errors, "some call must have been refused"
        assert any("BudgetExceeded" in e and f"scope: run:{result.run_id}" in e for e in errors), errors
    except Exception:
        print(processes.logs())
        raise
    finally:
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
