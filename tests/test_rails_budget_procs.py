"""A network token budget under a real fleet: real Redis, real worker processes.

* 4 ``robot-lab worker`` processes, 16 parallel tasks: spending never passes the budget by more
  than one call, and every task that fits in the budget completes -- with and without
  ``max_tokens`` (without it, calls serialize instead of failing). The budget is 5.5 calls:
  5 tasks complete, a 6th takes the last half call and overruns it, 10 are refused.
* A worker killed (SIGKILL) in the middle of a call: the sweeper gives its reservation
  back and the re-run succeeds.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
import redis

from robot_lab.runtime.registry import publish_specs
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.run_state import DEFAULT_LEASE_MS
from robot_lab.runtime.rails.budget import RedisLedger
from robot_lab.runtime.robot import build
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

MESSAGE = "please spend some tokens on this rather long request about invoices " * 2
TASKS = 16


@pytest.fixture
def client(real_client):
    return real_client


def _budget_fields(client: redis.Redis, key_prefix: str, run_id: str) -> dict[str, str]:
    raw = client.hgetall(Keys(prefix=key_prefix).budget(f"run:{run_id}"))
    return {k.decode(): v.decode() for k, v in raw.items()}


def _run(client: redis.Redis, key_prefix: str, robot, budget: int, max_tokens: int | None) -> None:
    config = {"token_budget": budget, **({"max_tokens": max_tokens} if max_tokens else {})}
    net = create_network(f"fleet-{max_tokens or 'none'}", config=config)
    with net.parallel("all"):
        for i in range(TASKS):
            net.task(f"t{i:02d}", robot)
    result = Coordinator(connection=client).submit(net, MESSAGE).wait(timeout=240)
    done = {name: r for name, r in result.context.items() if not r.error}
    refused = {name: r.error for name, r in result.context.items() if r.error}
    assert len(done) + len(refused) == TASKS
    per_call = {r.input_tokens + r.output_tokens for r in done.values()}
    assert len(per_call) == 1, per_call  # every task is the same call
    usage = per_call.pop()
    ledger = RedisLedger(f"run:{result.run_id}", redis=client)
    consumed = ledger.consumed["tokens"]
    # Every task that fits in the budget completes: calls run until the budget is spent.
    assert len(done) == budget // usage, (len(done), budget, usage, refused)
    # Then one call takes what is still free and overruns it: robot_lab's "Token budget
    # exceeded" after the call, not retried (another attempt would only spend more); every
    # later call is refused before it reaches the model.
    overruns = [e for e in refused.values() if "InferenceError: Token budget exceeded" in e]
    assert len(overruns) == 1, refused
    assert all("BudgetExceeded: budget exceeded for tokens" in e for e in refused.values() if e not in overruns), refused
    assert all(f"scope: run:{result.run_id}" in e for e in refused.values()), refused
    assert consumed == (len(done) + 1) * usage  # no update lost
    assert consumed <= budget + usage, (consumed, budget, usage)  # at most one call over
    fields = _budget_fields(client, key_prefix, result.run_id)
    assert float(fields["reserved:tokens"]) == 0
    assert not [f for f in fields if f.startswith("holds:")], fields


@pytest.mark.timeout(600)
@pytest.mark.parametrize("max_tokens", [None, 60], ids=["no-max-tokens", "max-tokens-60"])
def test_four_workers_sixteen_tasks_spend_at_most_one_call_over(client, real_redis_url, key_prefix, processes,
                                                                   max_tokens):  # noqa: F811
    """Without max_tokens each reservation (input + the 1024-token default output) is larger
    than the budget, so the calls serialize -- before, 15 of 16 failed with "nothing
    remaining". With max_tokens 60 a reservation is input + 60, so several run at once."""
    robot = build(f"spender-{uid()}", model="scripted/sleep:300")
    publish_specs([robot.to_spec()], connection=client)
    # No worker dies here, so the production lease, not child_env's 2 s: the four workers
    # import litellm (to count tokens) under their first task's lease at the same moment, and
    # on a loaded machine a starved worker missed its heartbeats for 2 s, had its task re-run
    # and spent a call twice.
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_TASK_LEASE_MS=str(DEFAULT_LEASE_MS))
    queue = f"robot:{robot.name}"
    for n in range(4):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", robot.name, "--no-bus"], env, f"w{n}")
    wait_for(lambda: len(__import__("rq").Worker.all(queue=__import__("rq").Queue(queue, connection=client))) == 4,
             timeout=120, interval=0.2)
    try:
        usage = 70  # what one call of this robot uses (34 in + 36 out); _run measures it
        _run(client, key_prefix, robot, budget=int(5.5 * usage), max_tokens=max_tokens)
    except Exception:
        print(processes.logs())
        raise


def _pid_of(worker: str) -> int:
    match = re.match(r"robot-lab\..+\.(\d+)(\.\d+)?:\d+$", worker)
    assert match, worker
    return int(match.group(1))


@pytest.mark.timeout(400)
def test_killed_workers_reservation_is_released_and_the_rerun_succeeds(client, real_redis_url, key_prefix,
                                                                        processes):  # noqa: F811
    slow = build(f"holder-{uid()}", model="scripted/sleep:4000")
    publish_specs([slow.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_BUDGET__WAIT_TIMEOUT="90")
    for i in range(2):
        processes.start([str(VENV_BIN / "robot-lab"), "worker", slow.name, "--no-bus"], env, f"w{i}")
    wait_for(lambda: len(__import__("rq").Worker.all(queue=__import__("rq").Queue(f"robot:{slow.name}",
                                                                                   connection=client))) == 2,
             timeout=90, interval=0.2)
    # 100 tokens: less than one reservation (input + 1024), more than one call's use (70),
    # so the first attempt holds the whole budget and the re-run fits only once it is back.
    net = create_network("hold", config={"token_budget": 100})
    net.task("only", slow)
    handle = Coordinator(connection=client).submit(net, MESSAGE)
    store, run_id = handle.store, handle.run_id
    try:
        wait_for(lambda: float(_budget_fields(client, key_prefix, run_id).get("reserved:tokens", 0)) == 100,
                 timeout=60, interval=0.05)
        first = [e for _, e in store.events() if e.event == "task.started"][0]
        first_job = store.job_id("only")
        assert client.exists(store.budget_holds_key(first_job)) == 1
        os.kill(_pid_of(first.data["worker"]), signal.SIGKILL)
        # no coordinator waits here: the surviving worker's sweeper finds the expired lease,
        # gives the reservation back and re-runs the task, which now fits
        wait_for(lambda: store.status() == "completed", timeout=120, interval=0.1)
        result = handle.result()
        assert result.states == {"only": "done"}, result.context["only"].error
        assert store.attempts()["only"] == 2
        fields = _budget_fields(client, key_prefix, run_id)
        assert float(fields["reserved:tokens"]) == 0 and float(fields["consumed:tokens"]) == 70
        assert client.exists(store.budget_holds_key(first_job)) == 0
        assert not [f for f in fields if f.startswith("holds:")], fields
    except Exception:
        print(processes.logs())
        raise
