"""Many runs in flight per worker process, with real processes on a real Redis:

* bus consumers with ``in_flight`` 4 in two processes: each conversation in order and never
  two of its messages at once, while one process runs messages of different conversations at
  the same time (seen in the start/end times the handlers record);
* ``robot-lab worker --in-flight 4``: tasks and messages of different conversations overlap
  in one process; SIGTERM lets every task and message in hand finish and takes nothing new;
  after kill -9 every task and message in hand is run again by another worker;
* ``--in-flight 200``: 200 threads each ``request`` on a conversation of their own;
* ``--in-flight 8``: ``max_concurrent_robots`` and a run's token budget still hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest

from robot_lab.runtime.registry import publish_specs
from robot_lab.bus import Bus
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.run_state import DEFAULT_LEASE_MS
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.schemas import decode_message
from tests.hardened import sender_keys
from tests.network_helpers import fan
from tests.redis_server import wait_for
from tests.stopping import stopped
from tests.test_bus_procs import env, procs, publish_conversations_and_check_order, start_workers  # noqa: F401
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow

IN_FLIGHT = 4


# --- bus consumers (tests/busproc.py) ------------------------------------------------------
def test_conversations_stay_in_order_across_consumers_with_many_in_flight(env, procs, tmp_path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    env = {**env, "BUSPROC_IN_FLIGHT": str(IN_FLIGHT)}
    bus = start_workers(procs, env, tmp_path, "spans", "chat", "s1", "s2")
    test = publish_conversations_and_check_order(bus, procs, env, tmp_path, 8, 6)
    overlapping = 0
    for consumer in ("s1", "s2"):
        spans = [s.decode().split("|") for s in bus.redis.lrange(f"{test}:spans:{consumer}", 0, -1)]
        spans = [(conv, float(a), float(b)) for conv, a, b in spans]
        overlapping += sum(1 for i, (ca, sa, ea) in enumerate(spans) for cb, sb, eb in spans[i + 1:]
                           if ca != cb and sa < eb and sb < ea)
    assert overlapping > 0  # one process ran handlers of different conversations at once


# --- robot-lab worker --------------------------------------------------------------------
@pytest.fixture
def client(real_client):  # type: ignore[no-untyped-def]
    return real_client


def _worker(processes, env: dict[str, str], robot: str, name: str) -> subprocess.Popen[bytes]:  # noqa: F811
    return processes.start([str(VENV_BIN / "robot-lab"), "worker", robot, "--in-flight", str(IN_FLIGHT)], env, name)


def _events(store: Any, name: str) -> list[Any]:
    return [e for _, e in store.events() if e.event == name]


def _runners(client: Any, keys: Keys, robot: str) -> list[str]:
    """The consumer each conversation head was granted to (ACQUIRE: its handler started)."""
    runners = [v.decode().rsplit("|", 1)[1] for v in client.hvals(keys.conversation_heads(robot))]
    return [r for r in runners if r]


def _replies(client: Any, keys: Keys, inbox: str) -> dict[str, Any]:
    return {m.in_reply_to: m for m in (decode_message(f[b"envelope"])
                                       for _, f in client.xrange(keys.inbox(inbox)))}


def _ask(bus: Bus, robot: str, sender: str, n: int) -> list[str]:
    return [bus.publish(robot, f"question {i}", from_=sender, conversation_id=f"conv-{sender}-{i}").id
            for i in range(n)]


def _in_hand(client: Any, real_redis_url: str, key_prefix: str, processes: Any, *, model: str, visibility: str,  # noqa: F811
             extra: int) -> tuple[Any, Keys, list[str], Any, dict[str, str], str]:
    """A ``robot-lab worker --in-flight 4`` with IN_FLIGHT + ``extra`` messages (on as many
    conversations) and as many parallel tasks sent to it; returns once it has IN_FLIGHT of
    each in hand: (process, keys, message ids, run handle, environment, robot name)."""
    bot = build(f"inflight-{uid()}", model=model)
    publish_specs([bot.to_spec()], connection=client)
    sender_keys("asker")  # this process sends as asker (signed in the hardened profile)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_BUS__VISIBILITY_TIMEOUT=visibility)
    proc = _worker(processes, env, bot.name, "worker")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)
    keys = Keys(prefix=key_prefix)
    bus = Bus(client, keys=keys)
    bus.register("asker")
    wait_for(lambda: client.exists(keys.inbox(bot.name)), timeout=30)
    asked = _ask(bus, bot.name, "asker", IN_FLIGHT + extra)
    handle = Coordinator(connection=client).submit(fan(bot, IN_FLIGHT + extra, "inflight"), "x")
    wait_for(lambda: len(_events(handle.store, "task.started")) == IN_FLIGHT
             and len(_runners(client, keys, bot.name)) == IN_FLIGHT, timeout=60, interval=0.05)
    return proc, keys, asked, handle, env, bot.name


def test_sigterm_drains_every_task_and_message_in_hand(client, real_redis_url, key_prefix, processes) -> None:  # noqa: F811
    # one more message and one more task than there are slots: those two must not be taken
    proc, keys, asked, handle, _, robot = _in_hand(client, real_redis_url, key_prefix, processes,
                                            model="scripted/sleep:1500", visibility="5", extra=1)
    store = handle.store
    proc.send_signal(signal.SIGTERM)
    assert stopped(proc) == 0
    completed = _events(store, "task.completed")
    assert len(completed) == IN_FLIGHT  # every task in hand finished, once, on its first attempt
    started = _events(store, "task.started")
    assert {e.task for e in started} == {e.task for e in completed}
    assert all(store.attempts()[e.task] == 1 for e in completed)
    assert max(e.ts for e in started) < min(e.ts for e in completed)  # they ran at the same time
    assert list(store.states().values()).count("queued") == 1  # the one nobody took waits
    replies = _replies(client, keys, "asker")
    assert len(replies) == IN_FLIGHT and set(replies) < set(asked)  # every message in hand answered
    group = {g["name"].decode(): g for g in client.xinfo_groups(keys.inbox(robot))}[robot]
    assert group["pending"] == 0  # all acked; the extra message was never read
    assert group["lag"] == 1


def test_kill_9_with_many_in_flight_reruns_every_task_and_message(client, real_redis_url, key_prefix,
                                                                   processes) -> None:  # noqa: F811
    victim, keys, asked, handle, env, robot = _in_hand(client, real_redis_url, key_prefix, processes,
                                                model="scripted/sleep:4000", visibility="1", extra=0)
    store = handle.store
    first = {e.task: e.data["worker"] for e in _events(store, "task.started")}
    victim_consumer = set(_runners(client, keys, robot))
    assert len(set(w.split(":")[0] for w in first.values())) == 1 and len(victim_consumer) == 1  # one process
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    _worker(processes, env, robot, "rescuer")
    result = handle.wait(timeout=120)
    assert set(result.states.values()) == {"done"}
    assert all(n == 2 for n in store.attempts().values())  # every task in hand ran again
    again = [e for e in _events(store, "task.started") if e.data["worker"] not in first.values()]
    assert {e.task for e in again} == set(first)
    wait_for(lambda: len(_replies(client, keys, "asker")) == IN_FLIGHT, timeout=60)
    assert set(_replies(client, keys, "asker")) == set(asked)  # every message in hand answered


def test_200_conversations_request_one_worker_process_at_once(client, real_redis_url, key_prefix,
                                                              processes) -> None:  # noqa: F811
    """What a reviewer runs: 200 threads of one client each ``request`` on a conversation of
    its own, against one ``robot-lab worker --in-flight 200``. Every request gets its own
    reply, and nothing on either side fails for want of a Redis connection (redis-py 8's
    default pool refuses its 101st)."""
    import threading

    bot = build(f"inflight-{uid()}", model="scripted/sleep:300")
    publish_specs([bot.to_spec()], connection=client)
    sender_keys(*(f"asker{i}" for i in range(200)))  # the senders below (signed in the hardened profile)
    env = child_env(real_redis_url, key_prefix)
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", "200"], env, "worker")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)
    keys = Keys(prefix=key_prefix)
    wait_for(lambda: client.exists(keys.inbox(bot.name)), timeout=30)
    from robot_lab.connection import connect

    bus = Bus(connect(real_redis_url), keys=keys)  # the client robot-lab makes (a bare redis-py one stops at 100)
    replies: dict[int, str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(200, timeout=60)

    def ask(i: int) -> None:
        try:
            start.wait()
            reply = bus.request(bot.name, f"question {i}", from_=f"asker{i}", conversation_id=f"conv-{i}",
                                timeout=90)
            replies[i] = reply.content if isinstance(reply.content, str) else str(reply.content)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(replies) == list(range(200))
    assert all(f"question {i}" in text for i, text in replies.items())  # each got its own answer
    assert proc.poll() is None
    log = proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
    assert "handler_failed" not in log and "Too many connections" not in log


def test_budgets_and_max_concurrent_robots_hold_with_many_in_flight(client, real_redis_url, key_prefix,
                                                                    processes) -> None:  # noqa: F811
    """One ``robot-lab worker --in-flight 8`` process, eight slots free: a network limited to
    two robots at once never has more than two tasks running, and a run's token budget is
    never exceeded by more than one call, the calls past it refused naming the run's scope."""
    from robot_lab.runtime.rails.budget import RedisLedger

    bot = build(f"inflight-{uid()}", model="scripted/sleep:300")
    publish_specs([bot.to_spec()], connection=client)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_TASK_LEASE_MS=str(DEFAULT_LEASE_MS))
    processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", "8"], env, "worker")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)

    limited = create_network("limited", config={"max_concurrent_robots": 2})
    with limited.parallel("all"):
        for i in range(6):
            limited.task(f"t{i}", bot)
    handle = Coordinator(connection=client).submit(limited, "x")
    assert set(handle.wait(timeout=120).states.values()) == {"done"}
    spans = {e.task: [e.ts, None] for e in _events(handle.store, "task.started")}
    for e in _events(handle.store, "task.completed"):
        spans[e.task][1] = e.ts
    most = max(sum(1 for a, b in spans.values() if a <= t < b) for t, _ in spans.values())
    assert most == 2  # two at once, never more, with six slots still free

    budget = 150
    spend = create_network("budgeted", config={"token_budget": budget})
    with spend.parallel("all"):
        for i in range(8):
            spend.task(f"s{i}", bot)
    message = "please spend some tokens on this rather long request about invoices " * 2
    result = Coordinator(connection=client).submit(spend, message).wait(timeout=120)
    consumed = RedisLedger(f"run:{result.run_id}", redis=client).consumed.get("tokens", 0.0)
    per_call = max(r.input_tokens + r.output_tokens for r in result.context.values())
    assert 0 < consumed <= budget + per_call, (consumed, per_call)
    errors = [r.error for r in result.context.values() if r.error]
    # the calls past the budget are refused before they run (BudgetExceeded); one that was
    # already running when the budget ran out fails after it (robot_lab's InferenceError)
    assert all(f"scope: run:{result.run_id}" in e and ("BudgetExceeded" in e or "Token budget exceeded" in e)
               for e in errors), "\n".join(errors)
    assert any("BudgetExceeded" in e for e in errors), "\n".join(errors)


def test_a_thousand_tasks_in_one_worker_process_run_once_each(client, real_redis_url, key_prefix,
                                                              processes) -> None:  # noqa: F811
    """One ``robot-lab worker --in-flight 1000`` holds a 1000-task fan-out at once: while it
    is alive the sweeper (its own thread, and every finishing task) takes none of its jobs
    for stranded, and the lease keeper keeps every lease, however long a job waits for the
    GIL between being taken and claimed. Every task runs exactly once, on its first attempt."""
    count = 1000
    bot = build(f"inflight-{uid()}", model="scripted/sleep:300")
    publish_specs([bot.to_spec()], connection=client)
    # the production lease (child_env's 2 s is for tests that kill workers): a keeper that
    # falls behind a thousand tasks loses them all the same, and a loaded 2-core box running
    # the rest of the suite beside this test does not starve it past the lease
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_TASK_LEASE_MS=str(DEFAULT_LEASE_MS))
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", bot.name, "--in-flight", str(count)], env,
                           "worker")
    wait_for_workers(client, [f"robot:{bot.name}"], timeout=90)
    handle = Coordinator(connection=client).submit(fan(bot, count, "thousand"), "x")
    result = handle.wait(timeout=400)
    store = handle.store
    assert set(result.states.values()) == {"done"}
    attempts = store.attempts()
    assert len(attempts) == count and set(attempts.values()) == {1}, \
        {t: n for t, n in attempts.items() if n != 1}
    started = [e.task for e in _events(store, "task.started")]
    assert sorted(started) == sorted(attempts)  # claimed once each: no job of a task ran twice
    assert not _events(store, "task.retrying")
    assert proc.poll() is None
    log = proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]
    assert "run.requeued" not in log and "task.lease_lost" not in log, log[-3000:]
