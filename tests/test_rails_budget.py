"""Budget ledgers: robot_lab's Ledger semantics in process and on Redis (fake and real),
the Robot's per-call helpers, and a budget shared by two real processes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from robot_lab.errors import BudgetExceeded, ConfigurationError, InferenceError
from robot_lab.keys import Keys
from robot_lab.runtime.rails.budget import (
    CallEstimate,
    Ledger,
    RedisLedger,
    Reservation,
    check_budgets,
    reconcile,
    release,
    reserve_for_call,
    robot_ledger,
)
from tests.redis_server import wait_for


def _contract(make: Callable[..., Any], scope: str | None) -> None:
    """The semantics every ledger shares (robot_lab's Budget::Ledger specs)."""
    suffix = f" (scope: {scope})" if scope else ""
    ledger = make({"tokens": 100, "cost": 0.5})
    assert ledger.limits == {"tokens": 100.0, "cost": 0.5}
    assert ledger.remaining("tokens") == 100
    # Unlimited dimension: never raises, infinite remaining.
    ledger.reserve("calls", 10**9)
    assert ledger.remaining("calls") == math.inf

    ledger.reserve("tokens", 60)
    assert ledger.remaining("tokens") == 40
    with pytest.raises(BudgetExceeded) as info:
        ledger.reserve("tokens", 41)
    assert str(info.value) == f"budget exceeded for tokens: 101 > 100{suffix}"
    assert info.value.scope == scope and info.value.dimension == "tokens"
    ledger.reserve("tokens", 40)  # exactly the limit is allowed
    assert ledger.remaining("tokens") == 0

    ledger.reconcile("tokens", 60, 75)  # used more than reserved
    assert ledger.consumed["tokens"] == 75
    assert ledger.remaining("tokens") == 0  # 100 - 75 - 40 < 0, floored
    ledger.release("tokens", 40)
    assert ledger.remaining("tokens") == 25
    ledger.release("tokens", 1000)  # floored at zero, never negative
    assert ledger.remaining("tokens") == 25
    ledger.reconcile("tokens", 5, 0)  # reconcile with nothing reserved
    assert ledger.remaining("tokens") == 25

    ledger.reserve("cost", 0.25)
    ledger.reconcile("cost", 0.25, 0.125)
    assert ledger.consumed["cost"] == pytest.approx(0.125)
    assert ledger.remaining("cost") == pytest.approx(0.375)

    with pytest.raises(ConfigurationError, match="amount"):
        ledger.reserve("tokens", -1)


def test_in_process_ledger_contract() -> None:
    _contract(lambda limits: Ledger(limits=limits), None)
    _contract(lambda limits: Ledger(limits=limits, scope="robot:a"), "robot:a")


def test_redis_ledger_contract(redis_client, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    _contract(lambda limits: RedisLedger("run:r1", limits, redis=redis_client, keys=keys), "run:r1")
    assert redis_client.exists(f"{key_prefix}:budget:run:r1") == 1


def test_in_process_ledger_starting_consumption() -> None:
    ledger = Ledger(limits={"tokens": 10}, consumed={"tokens": 10})
    assert ledger.remaining("tokens") == 0
    ledger.reserve("tokens", 0)  # robot_lab: committed + 0 > limit is false
    with pytest.raises(BudgetExceeded, match="budget exceeded for tokens: 11 > 10"):
        ledger.reserve("tokens", 1)


def test_redis_ledger_is_shared_between_instances(redis_client, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    writer = RedisLedger("tenant:acme", {"tokens": 50}, redis=redis_client, keys=keys)
    reader = RedisLedger("tenant:acme", redis=redis_client, keys=keys)  # limits from Redis
    assert reader.limits == {"tokens": 50.0}
    writer.reserve("tokens", 30)
    with pytest.raises(BudgetExceeded, match=r"31 > 50 \(scope: tenant:acme\)|51 > 50 \(scope: tenant:acme\)"):
        reader.reserve("tokens", 21)
    writer.reconcile("tokens", 30, 20)
    assert reader.consumed == {"tokens": 20.0}
    assert reader.remaining("tokens") == 30
    writer.set_limits({"tokens": None})  # remove the limit: unlimited
    assert reader.remaining("tokens") == math.inf
    reader.reset()
    assert reader.consumed == {} and reader.limits == {}


def test_redis_ledger_ttl_set_on_first_write_only(redis_client, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    ledger = RedisLedger("tenant:acme:2026-11-30", {"tokens": 10}, redis=redis_client, keys=keys, ttl=3600)
    assert 3590 <= redis_client.ttl(ledger.key) <= 3600
    redis_client.expire(ledger.key, 100)
    ledger.reserve("tokens", 1)
    ledger.reconcile("tokens", 1, 1)
    assert redis_client.ttl(ledger.key) <= 100  # not pushed back by later writes
    no_ttl = RedisLedger("run:forever", {"tokens": 10}, redis=redis_client, keys=keys)
    no_ttl.reserve("tokens", 1)
    assert redis_client.ttl(no_ttl.key) == -1
    with pytest.raises(ConfigurationError, match="scope"):
        RedisLedger("", redis=redis_client, keys=keys)


def test_reserve_for_call_and_reconcile(redis_client, key_prefix: str) -> None:
    own = robot_ledger(token_budget=1000, cost_budget=None)
    assert own is not None and own.limits == {"tokens": 1000.0}
    assert robot_ledger() is None
    shared = RedisLedger("run:r2", {"tokens": 300, "cost": 1.0}, redis=redis_client, keys=Keys(prefix=key_prefix))
    estimate = CallEstimate(input_tokens=200, output_tokens=100)  # cost unknown: all that is free
    reservation = reserve_for_call([own, None, shared], estimate, timeout=0)
    assert [(l.scope, k, a) for l, k, a in reservation.entries] == [
        (None, "tokens", 300.0), ("run:r2", "cost", 1.0), ("run:r2", "tokens", 300.0)
    ]
    assert shared.remaining("tokens") == 0 and own.remaining("tokens") == 700
    # A concurrent call on the shared budget waits while everything is held, then is refused.
    with pytest.raises(BudgetExceeded, match=r"^budget exceeded for cost: .*\(scope: run:r2\)$"):
        reserve_for_call([shared], estimate, timeout=0)
    reconcile(reservation, tokens=120, cost=0.25)
    reconcile(reservation, tokens=999, cost=9)  # settled: second call is a no-op
    assert own.consumed == {"tokens": 120.0}
    assert shared.consumed == {"tokens": 120.0, "cost": 0.25}
    assert shared.reserved == {"tokens": 0.0, "cost": 0.0}
    check_budgets([own, shared])  # within budget: no error


def test_refused_reservation_holds_nothing(redis_client, key_prefix: str) -> None:
    own = Ledger(limits={"tokens": 100})
    exhausted = RedisLedger("tenant:t", {"tokens": 10}, redis=redis_client, keys=Keys(prefix=key_prefix))
    exhausted.reserve("tokens", 10)
    exhausted.reconcile("tokens", 10, 12)
    with pytest.raises(BudgetExceeded, match=r"budget exceeded for tokens: .*\(scope: tenant:t\)"):
        reserve_for_call([own, exhausted], CallEstimate(input_tokens=5, output_tokens=5), timeout=0)
    assert own.remaining("tokens") == 100  # released again


def test_estimates_let_parallel_calls_share_a_budget() -> None:
    shared = Ledger(limits={"tokens": 100}, scope="run:p")
    first = reserve_for_call([shared], CallEstimate(input_tokens=20, output_tokens=10), timeout=0)
    second = reserve_for_call([shared], CallEstimate(input_tokens=20, output_tokens=10), timeout=0)
    assert [a for _, _, a in first.entries] == [30.0]
    assert shared.remaining("tokens") == 40
    big = CallEstimate(input_tokens=40, output_tokens=10)
    with pytest.raises(BudgetExceeded, match="did not fit within 0 s while other calls held reservations"):
        reserve_for_call([shared], big, timeout=0)  # does not fit while the others hold theirs
    release(first)
    release(first)
    assert shared.remaining("tokens") == 70
    third = reserve_for_call([shared], big, timeout=0)
    assert [a for _, _, a in third.entries] == [50.0]
    reconcile(second, tokens=10)
    reconcile(third, tokens=40)
    assert shared.consumed == {"tokens": 50.0}


def test_release_on_failed_call() -> None:
    ledger = Ledger(limits={"tokens": 10})
    reservation = reserve_for_call([ledger], CallEstimate(input_tokens=5, output_tokens=5), timeout=0)
    assert isinstance(reservation, Reservation) and reservation
    release(reservation)
    assert ledger.remaining("tokens") == 10
    assert not reserve_for_call([Ledger()], CallEstimate(input_tokens=5, output_tokens=5), timeout=0)  # no limits


def test_check_budgets_messages() -> None:
    tokens = Ledger(limits={"tokens": 100}, consumed={"tokens": 150})
    with pytest.raises(InferenceError) as info:
        check_budgets([tokens])
    assert str(info.value) == "Token budget exceeded: 150 tokens used, budget is 100"
    cost = Ledger(limits={"cost": 0.01}, consumed={"cost": 0.0123})
    with pytest.raises(InferenceError) as info:
        check_budgets([cost])
    assert str(info.value) == "Cost budget exceeded: $0.012300 used, budget is $0.010000"
    scoped = Ledger(limits={"cost": 0.01}, consumed={"cost": 0.02}, scope="tenant:x")
    with pytest.raises(InferenceError, match=r"\(scope: tenant:x\)$"):
        check_budgets([scoped])
    # robot_lab's token check on the robot's running totals
    with pytest.raises(InferenceError, match="^Token budget exceeded: 11 tokens used, budget is 10$"):
        check_budgets([], tokens_used=11, token_budget=10)
    check_budgets([], tokens_used=10, token_budget=10)
    check_budgets([Ledger(limits={"tokens": 10}, consumed={"tokens": 10})])


_WORKER = textwrap.dedent(
    """
    import json, random, sys, time
    import redis
    from robot_lab.errors import BudgetExceeded, InferenceError
    from robot_lab.keys import Keys
    from robot_lab.runtime.rails.budget import CallEstimate, RedisLedger, check_budgets, reconcile, reserve_for_call

    url, prefix, scope, seed, mode, cap = sys.argv[1:7]
    cap = int(cap)
    client = redis.Redis.from_url(url)
    ledger = RedisLedger(scope, redis=client, keys=Keys(prefix=prefix))
    rng = random.Random(int(seed))
    client.incr(prefix + ":ready")
    for _ in range(2000):  # bounded start barrier
        if client.exists(prefix + ":go"):
            break
        time.sleep(0.005)
    used = calls = overruns = 0
    refused = None
    for _ in range(10_000):
        try:
            if mode == "fixed":
                ledger.reserve("tokens", cap)
                reservation = None
            else:
                reservation = reserve_for_call([ledger], CallEstimate(input_tokens=cap, output_tokens=0), timeout=2)
        except BudgetExceeded as error:
            refused = str(error)
            break
        actual = rng.randint(1, cap)
        used += actual
        calls += 1
        if reservation is None:
            ledger.reconcile("tokens", cap, actual)
        else:
            reconcile(reservation, tokens=actual)
            try:
                check_budgets([ledger])
            except InferenceError:
                overruns += 1
    print(json.dumps({"used": used, "calls": calls, "refused": refused, "overruns": overruns}))
    """
)


@pytest.mark.parametrize(("mode", "budget", "cap"), [("fixed", 2000, 25), ("estimate", 2000, 40)])
def test_two_processes_share_one_budget(real_redis_url: str, key_prefix: str, mode: str, budget: int, cap: int) -> None:
    import redis

    client = redis.Redis.from_url(real_redis_url)
    scope = f"run:{mode}"
    RedisLedger(scope, {"tokens": budget}, redis=client, keys=Keys(prefix=key_prefix))
    procs = []
    try:
        for seed in (1, 2):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _WORKER, real_redis_url, key_prefix, scope, str(seed), mode, str(cap)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )
            )
        wait_for(lambda: int(client.get(f"{key_prefix}:ready") or 0) == 2, timeout=30)
        client.set(f"{key_prefix}:go", 1)
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
        ledger = RedisLedger(scope, redis=client, keys=Keys(prefix=key_prefix))
        consumed = ledger.consumed["tokens"]
        # No lost update: what the workers used is exactly what the ledger recorded.
        assert consumed == sum(r["used"] for r in results)
        assert all(r["calls"] > 0 for r in results)
        assert ledger.reserved["tokens"] == 0
        if mode == "fixed":
            assert consumed <= budget  # each call used at most what it reserved
        else:
            assert consumed <= budget + cap  # at most one reservation's overrun
        for r in results:
            assert r["refused"] is not None and f"(scope: {scope})" in r["refused"]
            assert r["refused"].startswith("budget exceeded for tokens: ")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for key in client.scan_iter(match=f"{key_prefix}*"):
            client.delete(key)
        client.close()


def test_redis_ledger_defaults_to_configured_redis_and_prefix(redis_client, key_prefix: str) -> None:
    ledger = RedisLedger("run:defaults", {"tokens": 5})
    assert ledger.key == f"{key_prefix}:budget:run:defaults"
    ledger.reserve("tokens", 5)
    assert redis_client.hget(ledger.key, "reserved:tokens") is not None
