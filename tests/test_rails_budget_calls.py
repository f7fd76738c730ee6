"""A call's reservation: sized from an estimate, waiting while reservations in flight may come
back, and tied to a holder so a dead worker's reservation can be given back.

Both ledgers (in process; Redis, fake and real) follow one rule, checked here on each."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from robot_lab.llm.scripted import prompt_tokens

from robot_lab.errors import BudgetExceeded
from robot_lab.keys import Keys
from robot_lab.runtime.rails.budget import (
    BudgetHolder,
    CallEstimate,
    Ledger,
    RedisLedger,
    estimate_call,
    reconcile,
    release,
    release_holder,
    reserve_for_call,
)


@pytest.fixture(params=["memory", "redis"])
def make(request: pytest.FixtureRequest, redis_client: Any, key_prefix: str) -> Callable[..., Any]:
    if request.param == "memory":
        return lambda limits, **kw: Ledger(limits=limits, scope="s")
    keys = Keys(prefix=key_prefix)
    return lambda limits, **kw: RedisLedger("s", limits, redis=redis_client, keys=keys, **kw)


def test_reserve_call_rule(make: Callable[..., Any]) -> None:
    ledger = make({"tokens": 100})
    assert ledger.reserve_call("calls", 10) == 0.0  # unlimited dimension
    assert ledger.reserve_call("tokens", 40) == 40  # fits: exactly the estimate, not everything
    assert ledger.reserve_call("tokens", 50) == 50
    assert ledger.reserve_call("tokens", 30) is None  # 10 free, 90 in flight: wait
    assert ledger.reserve_call("tokens", None) is None  # "all that is free" waits for the others too
    ledger.reconcile("tokens", 40, 45)
    ledger.reconcile("tokens", 50, 50)
    # nothing in flight, 5 free: the last call takes what is free (bounded overspend)
    assert ledger.reserve_call("tokens", 30) == 5
    ledger.reconcile("tokens", 5, 20)
    with pytest.raises(BudgetExceeded, match=r"for tokens: 115 > 100 \(scope: s\)"):
        ledger.reserve_call("tokens", 1)


def test_a_call_that_does_not_fit_waits_for_a_release(make: Callable[..., Any]) -> None:
    ledger = make({"tokens": 100})
    first = reserve_for_call([ledger], CallEstimate(input_tokens=20, output_tokens=50), timeout=30)
    got: dict[str, Any] = {}

    def second() -> None:
        got["reservation"] = reserve_for_call([ledger], CallEstimate(input_tokens=20, output_tokens=50), timeout=30)
        got["at"] = time.monotonic()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.3)
    assert "reservation" not in got  # 30 free, 70 needed, 70 in flight: it waits, it does not fail
    released_at = time.monotonic()
    reconcile(first, tokens=25)
    thread.join(30)
    assert got["at"] >= released_at
    assert got["reservation"].entries[0][2] == 70
    release(got["reservation"])
    assert ledger.remaining("tokens") == 75


def test_waiting_ends_with_budget_exceeded_after_the_timeout(make: Callable[..., Any]) -> None:
    ledger = make({"tokens": 100})
    ledger.reserve_call("tokens", 90)
    with pytest.raises(BudgetExceeded, match=r"did not fit within 0.2 s while other calls held reservations "
                                             r"\(scope: s\)"):
        reserve_for_call([ledger], CallEstimate(input_tokens=10, output_tokens=20), timeout=0.2)
    assert ledger.remaining("tokens") == 10  # the waiting call holds nothing


def test_a_refused_call_holds_nothing_in_any_ledger(make: Callable[..., Any]) -> None:
    roomy, spent = make({"tokens": 1000}), Ledger(limits={"tokens": 10}, scope="t")
    spent.reconcile("tokens", 0, 10)
    with pytest.raises(BudgetExceeded, match="nothing remaining"):
        reserve_for_call([roomy, spent], CallEstimate(input_tokens=5, output_tokens=5), timeout=5)
    assert roomy.remaining("tokens") == 1000


def test_a_dead_holders_reservation_is_given_back(redis_client: Any, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    registry = f"{key_prefix}:holds:job-1"
    dead = RedisLedger("run:x", {"tokens": 100}, redis=redis_client, keys=keys,
                       holder=BudgetHolder(id="job-1@w1", registry=registry))
    live = RedisLedger("run:x", redis=redis_client, keys=keys)
    assert dead.reserve_call("tokens", 80) == 80
    assert live.reserve_call("tokens", 20) == 20
    assert live.reserve_call("tokens", 50) is None  # would have to wait for the dead one forever
    assert release_holder(redis_client, registry) == {keys.budget("run:x"): {"tokens": 80.0}}
    assert redis_client.exists(registry) == 0
    assert live.reserved == {"tokens": 20.0}
    # the "dead" worker was only slow: its late reconcile records its use but gives back
    # nothing it no longer holds, so the live call's reservation stays intact
    dead.reconcile("tokens", 80, 60)
    assert live.reserved == {"tokens": 20.0} and live.consumed == {"tokens": 60.0}
    assert release_holder(redis_client, registry) == {}  # twice is harmless


def test_a_settled_holder_has_nothing_to_give_back(redis_client: Any, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    registry = f"{key_prefix}:holds:job-2"
    ledger = RedisLedger("run:y", {"tokens": 100, "cost": 1}, redis=redis_client, keys=keys,
                         holder=BudgetHolder(id="job-2@w1", registry=registry))
    reservation = reserve_for_call([ledger], CallEstimate(input_tokens=10, output_tokens=10, cost=0.5), timeout=5)
    assert sorted(reservation.entries, key=lambda e: e[1]) == [(ledger, "cost", 0.5), (ledger, "tokens", 20.0)]
    reconcile(reservation, tokens=15, cost=0.25)
    assert release_holder(redis_client, registry) == {}
    assert ledger.reserved == {"tokens": 0.0, "cost": 0.0}
    assert not [f for f in redis_client.hkeys(keys.budget("run:y")) if f.startswith(b"holds:")]


def test_the_estimate_counts_input_with_litellm_plus_the_maximum_output() -> None:
    import litellm

    messages = [{"role": "user", "content": "count these words for the budget, please " * 10}]
    counted = litellm.token_counter(model="gpt-4o", messages=messages)
    with_max = estimate_call("gpt-4o", messages, max_tokens=200)
    assert (with_max.input_tokens, with_max.output_tokens) == (counted, 200)
    assert with_max.cost is not None and with_max.cost > 0  # litellm knows gpt-4o's price
    default = estimate_call("scripted/echo", messages, default_output_tokens=333)
    assert default.output_tokens == 333 and default.tokens == default.input_tokens + 333
    assert default.input_tokens == prompt_tokens(messages, [])  # what the scripted model reports
    assert default.cost is None  # unpriced: a cost budget reserves all that is free
    assert default.amount("tokens") == default.tokens and default.amount("calls") is None
    # a llama-3 model would make litellm fetch its tokenizer from Hugging Face: never here;
    # litellm counts with its default encoding instead
    llama = estimate_call("groq/llama-3.1-8b-instant", messages, max_tokens=10)
    assert litellm.disable_hf_tokenizer_download is True
    assert llama.input_tokens == litellm.token_counter(model="no-such-model", messages=messages)


def test_a_scripted_models_estimate_is_what_it_reports_and_needs_no_litellm() -> None:
    """The reservation of a scripted call equals the prompt tokens the call then reports,
    counted without litellm (a worker serving only scripted robots never imports it)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from robot_lab.runtime.rails.budget import estimate_call\n"
        "from robot_lab.runtime.robot import build\n"
        "bot = build('est', model='scripted/echo')\n"
        "messages = [{'role': 'user', 'content': 'how many tokens is this request? ' * 7}]\n"
        "estimate = estimate_call('scripted/echo', messages)\n"
        "result = bot.run(messages[0]['content'])\n"
        "print(estimate.input_tokens, result.input_tokens, 'litellm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    estimated, reported, imported = out.stdout.split()[-3:]
    assert estimated == reported and imported == "False"


def test_the_default_output_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.settings import configure

    monkeypatch.setenv("ROBOT_LAB_BUDGET__DEFAULT_OUTPUT_TOKENS", "77")
    monkeypatch.setenv("ROBOT_LAB_BUDGET__WAIT_TIMEOUT", "3.5")
    settings = configure()
    assert (settings.budget.default_output_tokens, settings.budget.wait_timeout) == (77, 3.5)
    assert estimate_call("scripted/echo", [{"role": "user", "content": "hi"}]).output_tokens == 77




def test_a_call_within_its_reservation_keeps_its_answer_when_another_overran(make: Callable[..., Any]) -> None:
    """Two calls share a budget of 300 tokens and reserve 100 each. B uses 250 (its provider
    ignored max_tokens) and settles first, inside the budget; A uses its 100 and settles
    after, when the ledger shows 350. A stayed within what it was granted: it keeps its
    answer (robot_lab's after-the-call error is for a call that itself used more than it
    reserved and found the budget over), and the next call is refused before it starts."""
    from types import SimpleNamespace

    from robot_lab.llm.gateway import LLMResponse
    from robot_lab.runtime.robot.loop import _settle

    robot = SimpleNamespace(total_input_tokens=0, total_output_tokens=0, config=SimpleNamespace(token_budget=None))
    ledger = make({"tokens": 300})
    a = reserve_for_call([ledger], CallEstimate(50, 50), timeout=0)
    b = reserve_for_call([ledger], CallEstimate(50, 50), timeout=0)
    _settle(robot, b, LLMResponse(input_tokens=50, output_tokens=200), [ledger])  # 250 of 300
    _settle(robot, a, LLMResponse(input_tokens=50, output_tokens=50), [ledger])  # 350 of 300: A is within
    with pytest.raises(BudgetExceeded):
        reserve_for_call([ledger], CallEstimate(10, 10), timeout=0)
