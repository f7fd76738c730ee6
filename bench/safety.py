"""Safety-rail benchmark: the per-call cost of budgets, doom-loop guard and history tools,
each beside its baseline, in one run.

    .venv/bin/python bench/safety.py [--url redis://127.0.0.1:6379/0] [--calls 5000]

* Budget: one model call's bookkeeping (reserve_for_call + reconcile + check_budgets, the
  Robot's protocol) on the in-process Ledger (robot_lab's design, the baseline) and on the
  RedisLedger (two Lua scripts + one HGETALL over the network), plus a raw ``HINCRBYFLOAT``
  round trip as the floor any shared counter pays; and the size of the reservation,
  ``estimate_call`` (litellm's token counter over a 20-message conversation) beside the
  characters / 4 estimate it replaces.
* Doom loop: ``observe`` per tool call in process (baseline) and on Redis (one MULTI).
* History: search_history over a 200-message conversation and one compression pass.

Uses a unique key prefix on the given server and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.keys import Keys  # noqa: E402
from robot_lab.logging import configure_logging  # noqa: E402
from robot_lab.runtime.rails.budget import (  # noqa: E402
    CallEstimate,
    Ledger,
    RedisLedger,
    check_budgets,
    estimate_call,
    reconcile,
    reserve_for_call,
)
from robot_lab.runtime.rails.budget.estimate import _fallback_count  # noqa: E402
from robot_lab.runtime.rails.doom_loop import DoomLoopDetector, RedisDoomLoopDetector  # noqa: E402
from robot_lab.runtime.history import compress_history, search_history  # noqa: E402


def per_call_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


def budget_call(ledger):  # type: ignore[no-untyped-def]
    def run(_: int) -> None:
        reservation = reserve_for_call([ledger], CallEstimate(input_tokens=60, output_tokens=40), timeout=5)
        reconcile(reservation, tokens=1, cost=0.0)
        check_budgets([ledger])

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    configure_logging(level="ERROR", force=True)  # the loop warnings would dominate the timing
    client = redis.Redis.from_url(args.url)
    prefix = f"bench-safety-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix=prefix)
    n = args.calls
    try:
        client.ping()
        local = Ledger(limits={"tokens": 10**12})
        shared = RedisLedger("bench", {"tokens": 10**12}, redis=client, keys=keys)
        raw_key = f"{prefix}:raw"
        t_local = per_call_us(budget_call(local), n)
        t_redis = per_call_us(budget_call(shared), n)
        t_raw = per_call_us(lambda i: client.hincrbyfloat(raw_key, "tokens", 1), n)
        assert shared.consumed["tokens"] == n
        print(f"budget per model call ({n} calls)")
        print(f"  in-process Ledger (baseline)   {t_local:9.1f} us")
        print(f"  RedisLedger (Lua, shared)      {t_redis:9.1f} us   ratio {t_redis / t_local:7.1f}x")
        print(f"  raw HINCRBYFLOAT round trip    {t_raw:9.1f} us   RedisLedger = {t_redis / t_raw:.1f} round trips")

        conversation = [{"role": "user" if i % 2 == 0 else "assistant",
                         "content": f"Turn {i}: please look at invoice {i} and tell me what is overdue."}
                        for i in range(20)]
        estimate_call("gpt-4o-mini", conversation, max_tokens=256)  # load the encoding once
        reps = 200
        t_chars = per_call_us(lambda i: _fallback_count(conversation, None), reps)
        t_count = per_call_us(lambda i: estimate_call("gpt-4o-mini", conversation, max_tokens=256), reps)
        print(f"reservation size of a call over 20 messages ({reps} calls)")
        print(f"  characters / 4 (baseline)      {t_chars:9.1f} us")
        print(f"  estimate_call (litellm count)  {t_count:9.1f} us   ratio {t_count / t_chars:7.1f}x")

        # 11 distinct names in turn: longer than MAX_PERIOD, so every call scans all periods
        # and none is a loop (the worst case for the check).
        names = [f"tool{i}" for i in range(11)]
        d_local = DoomLoopDetector()
        d_redis = RedisDoomLoopDetector("bench-run", redis=client, keys=keys)
        t_dl = per_call_us(lambda i: d_local.observe(names[i % 11]), n)
        t_dr = per_call_us(lambda i: d_redis.observe(names[i % 11]), n)
        print(f"doom-loop observe per tool call ({n} calls)")
        print(f"  in-process (baseline)          {t_dl:9.1f} us")
        print(f"  Redis list per run             {t_dr:9.1f} us   ratio {t_dr / t_dl:7.1f}x")

        topics = ["quarterly revenue grew in every region", "the office picnic is on friday",
                  "invoice 42 is overdue by ten days", "deploy the billing service to production"]
        messages = [{"role": "user" if i % 2 == 0 else "assistant",
                     "content": f"Message {i}: {topics[i % 4]} and some more words about item {i}."} for i in range(200)]
        reps = 20
        t_search = per_call_us(lambda i: search_history(messages, "overdue invoice"), reps) / 1000
        t_compress = per_call_us(lambda i: compress_history(messages), reps) / 1000
        print("history over 200 messages")
        print(f"  search_history                 {t_search:9.2f} ms")
        print(f"  compress_history               {t_compress:9.2f} ms   ({len(compress_history(messages))} messages kept)")
    finally:
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    main()
