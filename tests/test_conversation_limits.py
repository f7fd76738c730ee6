"""Stored conversation history is bounded in bytes as well as messages, and its TTL is a
setting (robot_lab/runtime/conversations.py)."""

from __future__ import annotations

import msgspec

from robot_lab.runtime.conversations import ConversationStore, cap_bytes
from robot_lab.settings import reload_settings


def _turns(n: int, size: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        out += [{"role": "user", "content": f"q{i} " + "x" * size}, {"role": "assistant", "content": f"a{i}"}]
    return out


def test_a_history_is_capped_in_bytes_by_whole_turns(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_CONVERSATION_MAX_BYTES", "5000")
    monkeypatch.setenv("ROBOT_LAB_CONVERSATION_TTL", "120")
    reload_settings()
    store = ConversationStore(redis_client)
    store.save("billing", "c-1", _turns(50, 1000))  # ~51 kB of turns, well under 200 messages
    raw = redis_client.get(store.keys.conversation("billing", "c-1"))
    kept = msgspec.json.decode(raw)
    assert len(raw) <= 5000 and kept[0]["role"] == "user" and kept[-1]["content"] == "a49"
    assert 3 <= len(kept) // 2 <= 4  # the latest whole turns that fit
    assert 0 < redis_client.ttl(store.keys.conversation("billing", "c-1")) <= 120


def test_one_turn_larger_than_the_cap_is_kept_alone_and_zero_means_no_cap() -> None:
    huge = _turns(3, 10_000)
    assert cap_bytes(huge, 5000) == huge[-2:]
    assert cap_bytes(huge, 0) == huge
