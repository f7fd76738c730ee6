"""History tools on OpenAI-style message dicts: compression, search, convergence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from robot_lab.runtime.history import (
    Convergence,
    HistoryCompressor,
    HistoryResult,
    compress_history,
    estimate_tokens,
    is_pinned,
    message_text,
    search_history,
    should_compact,
)

RELEVANT = "The quarterly revenue report shows revenue growth in every region."
MEDIUM = "Revenue numbers aside, the office picnic is scheduled for Friday afternoon."
OFF_TOPIC = "My favourite pizza topping is pineapple with extra cheese and olives."


def _conversation() -> list[dict]:
    return [
        {"role": "system", "content": "You are a finance assistant."},
        {"role": "user", "content": RELEVANT},
        {"role": "assistant", "content": OFF_TOPIC},
        {"role": "user", "content": MEDIUM},
        {"role": "assistant", "content": "ok"},  # short: always kept
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "pizza pizza pizza pizza pizza pizza"},
        # recent window (recent_turns=1 -> last 2 scorable)
        {"role": "user", "content": "Summarize the quarterly revenue growth by region please."},
        {"role": "assistant", "content": "Quarterly revenue grew in each region; revenue report attached."},
    ]


def test_compression_keeps_drops_and_pins() -> None:
    messages = _conversation()
    out = compress_history(messages, recent_turns=1, keep_threshold=0.5, drop_threshold=0.1)
    contents = [m["content"] for m in out]
    assert RELEVANT in contents  # high score: kept verbatim
    assert OFF_TOPIC not in contents  # low score: dropped
    assert MEDIUM not in contents  # medium with no summarizer: dropped
    assert "ok" in contents  # too short to score
    assert out[0] == messages[0]  # system pinned
    assert messages[5] in out and messages[6] in out  # tool-call pair pinned, even off topic
    assert out[-2:] == messages[-2:]  # recent window kept, order preserved
    assert len(messages) == 9  # input untouched


def test_compression_summarizes_medium_tier_keeping_role() -> None:
    seen = []

    def summarizer(text: str) -> str:
        seen.append(text)
        return "  Picnic Friday.  "

    out = compress_history(_conversation(), recent_turns=1, keep_threshold=0.5, drop_threshold=0.1, summarizer=summarizer)
    assert seen == [MEDIUM]
    assert {"role": "user", "content": "Picnic Friday."} in out
    assert out.index({"role": "user", "content": "Picnic Friday."}) == 2  # original position
    # A blank summary drops the message.
    out = compress_history(_conversation(), recent_turns=1, keep_threshold=0.5, drop_threshold=0.1, summarizer=lambda t: " ")
    assert all(m.get("content") != MEDIUM for m in out)


def test_compression_returns_input_unchanged_when_nothing_applies() -> None:
    assert compress_history([]) == []
    only_pinned = [{"role": "system", "content": "x" * 50}, {"role": "tool", "content": "y" * 50}]
    assert compress_history(only_pinned) == only_pinned
    few = [{"role": "user", "content": OFF_TOPIC}, {"role": "assistant", "content": RELEVANT}]
    assert compress_history(few, recent_turns=1) == few  # scorable <= 2 * recent_turns
    short_recent = [{"role": "user", "content": OFF_TOPIC}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert compress_history(short_recent, recent_turns=1) == short_recent  # no recent text >= 20


def test_compressor_validates_thresholds() -> None:
    with pytest.raises(ValueError, match=r"keep_threshold \(0.2\) must be greater than drop_threshold \(0.2\)"):
        HistoryCompressor([], recent_turns=3, keep_threshold=0.2, drop_threshold=0.2, summarizer=None)


def test_assistant_with_text_and_tool_calls_is_pinned() -> None:
    assert is_pinned({"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "1"}]})
    assert is_pinned({"role": "assistant", "content": "   "})
    assert not is_pinned({"role": "assistant", "content": "An answer."})
    assert is_pinned(SimpleNamespace(role="system", content="x"))


def test_message_text_from_parts() -> None:
    msg = {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}, {"type": "text", "text": "world"}]}
    assert message_text(msg) == "hello world"
    assert message_text({"role": "assistant", "content": None}) is None


def test_search_history_ranks_and_limits() -> None:
    messages = _conversation()
    results = search_history(messages, "quarterly revenue by region", limit=2)
    assert [r.index for r in results] == [1, 8]  # tie at the top keeps conversation order
    assert all(isinstance(r, HistoryResult) for r in results)
    assert results[0].score >= results[1].score > 0
    assert all("revenue" in r.text.lower() for r in results)
    assert results[0].role in {"user", "assistant"}
    every = search_history(messages, "quarterly revenue by region")
    assert [r.index for r in every] == [1, 8, 7, 3]
    assert [r.role for r in every] == ["user", "assistant", "user", "user"]
    assert 4 not in {r.index for r in every}  # "ok" is under 20 characters
    assert search_history(messages, "the and of") == []  # only stop words
    assert search_history(messages, "zebra giraffe") == []  # nothing scores


def test_convergence() -> None:
    a = "The invoice total is 120 dollars and it is due on Friday."
    b = "Invoice total: 120 dollars, due Friday. The invoice is correct."
    c = "The weather in Lisbon is sunny with a light breeze from the ocean."
    assert Convergence.DEFAULT_THRESHOLD == 0.85 and Convergence.MIN_TEXT_LENGTH == 30
    assert Convergence.similarity(a, b) > 0.85
    assert Convergence.detected(a, b)
    assert not Convergence.detected(a, c)
    assert Convergence.similarity("short same text", "short same text") == 0.0
    assert Convergence.detected(a, c, threshold=0.0)
    with pytest.raises(ValueError, match=r"threshold must be in \[0.0, 1.0\], got 1.5"):
        Convergence.detected(a, b, threshold=1.5)


def test_auto_compact_estimate() -> None:
    messages = [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": None}]
    assert estimate_tokens(messages) == 100
    assert should_compact(messages, context_window=125)
    assert not should_compact(messages, context_window=126)
    assert not should_compact(messages)  # 200_000 fallback
    assert should_compact(messages, context_window=1000, threshold=0.1)
