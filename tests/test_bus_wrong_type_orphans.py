"""An entry the READ script delivered in a round that then failed on a key of the wrong type
(the script reads new entries before it queues their conversations) is served once the key
is fixed -- by this consumer, at once, not by the stale-entry claim tens of seconds later --
and served once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from robot_lab.bus import Bus
from robot_lab.bus.poller import BusPoller
from robot_lab.keys import Keys
from robot_lab.runtime.robot import Robot
from tests.redis_server import wait_for


@pytest.mark.parametrize("in_flight", [1, 4])
def test_an_entry_read_in_a_failed_round_is_served_once_the_key_is_fixed(real_client: Any, key_prefix: str,
                                                                         in_flight: int) -> None:
    keys = Keys(key_prefix)
    bus = Bus(real_client, keys=keys)
    # the stale-entry claim never runs in this test: only the consumer itself can serve the entry
    poller = BusPoller("billing", bus, block_ms=50, retry_delay=0, consumer="c1", claim_interval=3600,
                       in_flight=in_flight).serve(Robot("billing", model="scripted/echo"))
    heads = keys.conversation_heads("billing")
    replies: list[Any] = []
    with poller:
        assert bus.request("billing", "before", from_="desk", conversation_id="c-0", timeout=30).content == "echo: before"
        real_client.delete(heads)
        real_client.xadd(heads, {"x": "y"})  # the squat: a stream where a hash belongs
        asker = threading.Thread(target=lambda: replies.append(
            bus.request("billing", "during", from_="desk", conversation_id="c-1", timeout=60)))
        asker.start()
        wait_for(lambda: poller.key_problems, timeout=30)
        # the entry was delivered to c1 by the round that failed
        wait_for(lambda: real_client.xpending(keys.inbox("billing"), "billing")["pending"] == 1, timeout=30)
        time.sleep(0.3)  # more failing rounds while the key is wrong
        real_client.delete(heads)  # the operator's fix
        asker.join(60)
        wait_for(lambda: real_client.xpending(keys.inbox("billing"), "billing")["pending"] == 0, timeout=30)
    assert [r.content for r in replies] == ["echo: during"]
    assert poller.counts["acked"] == 2 and poller.counts["dead"] == 0  # each served once


def test_an_inbox_of_the_wrong_type_deleted_by_the_operator_is_served_again(real_client: Any, key_prefix: str) -> None:
    """The fix of an inbox that is a string is to delete it, which leaves no consumer group:
    reading this consumer's pending entries back then finds none (NOGROUP), and the next
    read recreates the group and serves."""
    keys = Keys(key_prefix)
    bus = Bus(real_client, keys=keys)
    poller = BusPoller("billing", bus, block_ms=50, retry_delay=0, consumer="c1", claim_interval=3600).serve(
        Robot("billing", model="scripted/echo"))
    inbox = keys.inbox("billing")
    with poller:
        assert bus.request("billing", "before", from_="desk", timeout=30).content == "echo: before"
        real_client.delete(inbox)
        real_client.set(inbox, "a string where the inbox stream belongs")
        wait_for(lambda: poller.key_problems, timeout=30)
        time.sleep(0.3)  # more failing rounds while the key is wrong
        real_client.delete(inbox)  # the operator's fix
        wait_for(lambda: real_client.type(inbox) == b"stream", timeout=30)  # the poller's group, recreated
        reply = bus.request("billing", "after", from_="desk", timeout=30)
    assert reply.content == "echo: after"
