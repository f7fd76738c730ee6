"""A robot replies only to the sender's inbox, to ``_reply.*`` streams or to
inboxes ``bus.reply_to_allowed`` names. A forged ``reply_to`` is dead-lettered as
``reply_refused``: no handler (model) call, nothing written to the redirected inbox."""

from __future__ import annotations

from typing import Any

from robot_lab import Bus, BusPoller
from robot_lab.settings import BusSettings


def _billing(bus: Bus) -> tuple[BusPoller, list[Any]]:
    calls: list[Any] = []
    poller = BusPoller("billing", bus, block_ms=0, retry_delay=0, consumer="c1")
    return poller.respond_to_tasks(lambda m: calls.append(m.content) or f"answer to {m.content}"), calls


def test_forged_reply_to_is_refused_without_a_model_call(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client)
    for name in ("billing", "technical", "client"):
        bus.register(name)
    poller, calls = _billing(bus)
    bus.publish("billing", "pay me", from_="client", reply_to="technical")
    poller.run_once()
    assert calls == []  # the handler (an LLM in a robot) never ran
    assert redis_client.xlen(bus.keys.inbox("technical")) == 0  # no reply, no error envelope
    assert redis_client.xlen(bus.keys.inbox("client")) == 0
    [letter] = bus.dead_letters("billing")
    assert letter.reason == "reply_refused"
    assert "'technical'" in letter.error and "'client'" in letter.error and "reply_to_allowed" in letter.error


def test_replies_to_the_sender_and_to_reply_streams_still_work(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client)
    for name in ("billing", "client"):
        bus.register(name)
    poller, calls = _billing(bus)
    bus.publish("billing", "own inbox", from_="client", reply_to="client")
    bus.publish("billing", "default reply_to", from_="client")
    poller.run_once()
    assert calls == ["own inbox", "default reply_to"]
    assert redis_client.xlen(bus.keys.inbox("client")) == 2
    assert bus.dead_letters("billing") == []
    # Bus.request uses a private _reply.<id> stream as reply_to, with from_ "anonymous"
    import threading

    worker = threading.Thread(target=lambda: [poller.run_once(block_ms=200) for _ in range(25)])
    worker.start()
    try:
        reply = bus.request("billing", "via request", timeout=5)
    finally:
        worker.join()
    assert reply.content == "answer to via request" and reply.to.startswith("_reply.")


def test_allow_list_lets_a_named_third_inbox_through(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client, settings=BusSettings(reply_to_allowed=["desk-*"]))
    for name in ("billing", "desk-1", "technical"):
        bus.register(name)
    poller, calls = _billing(bus)
    bus.publish("billing", "to the desk", from_="client", reply_to="desk-1")
    bus.publish("billing", "to technical", from_="client", reply_to="technical")
    poller.run_once()
    assert calls == ["to the desk"]
    assert redis_client.xlen(bus.keys.inbox("desk-1")) == 1
    assert redis_client.xlen(bus.keys.inbox("technical")) == 0
    assert [d.reason for d in bus.dead_letters("billing")] == ["reply_refused"]
