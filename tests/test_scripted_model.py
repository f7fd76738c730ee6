"""The offline scripted model: behaviours, scripts, streaming through litellm, usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_lab.errors import ConfigurationError, InferenceError
from robot_lab.llm import scripted
from robot_lab.llm.gateway import LLMGateway

ROUTER_TOOL = {
    "type": "function",
    "function": {
        "name": "route",
        "description": "choose where to go",
        "parameters": {
            "type": "object",
            "properties": {"targets": {"type": "array", "items": {"type": "string", "enum": ["billing", "technical"]}}},
            "required": ["targets"],
        },
    },
}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_echo_without_tools() -> None:
    decision = scripted.decide("scripted/echo", user("hi there"))
    assert decision.text == "echo: hi there" and decision.tool_calls == []
    assert decision.prompt_tokens > 0 and decision.completion_tokens > 0


def test_arguments_are_generated_from_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": "integer", "minimum": 3},
            "f": {"type": "number"},
            "b": {"type": "boolean"},
            "e": {"enum": ["x", "y"]},
            "d": {"type": "string", "default": "dflt"},
            "l": {"type": "array", "items": {"type": "integer"}},
            "o": {"type": "object", "properties": {"k": {"type": "string"}}},
            "u": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
        },
    }
    assert scripted.example_arguments(schema) == {
        "s": "a", "n": 3, "f": 0.0, "b": False, "e": "x", "d": "dflt", "l": [0], "o": {"k": "a"}, "u": 0,
    }


def test_text_and_route_behaviours() -> None:
    assert scripted.decide("scripted/text:fixed answer", user("x")).text == "fixed answer"
    decision = scripted.decide("scripted/route:technical", user("my screen is blank"), [ROUTER_TOOL])
    assert decision.tool_calls[0].name == "route"
    assert decision.tool_calls[0].arguments == {"targets": ["technical"]}
    assert scripted.decide("scripted/route:billing", user("x")).text == "ROUTE: billing"


def test_loop_calls_the_same_tool_every_time() -> None:
    messages = user("go")
    for _ in range(5):
        decision = scripted.decide("scripted/loop", messages, [ROUTER_TOOL])
        assert [c.name for c in decision.tool_calls] == ["route"]
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": decision.tool_calls[0].id, "type": "function", "function": {"name": "route", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": decision.tool_calls[0].id, "content": "ok"},
        ]


def test_rules_file_loaded_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "desk.yml").write_text(
        "rules:\n"
        "  - when: {contains: refund}\n    route: billing\n"
        "  - when: {regex: 'crash|error'}\n    reply: 'tech: {message}'\n"
        "default:\n  reply: general\n"
    )
    monkeypatch.setenv("ROBOT_LAB_SCRIPTS_DIR", str(tmp_path))
    assert scripted.decide("scripted/desk", user("I want a refund")).text == "ROUTE: billing"
    assert scripted.decide("scripted/desk", user("app crash")).text == "tech: app crash"
    assert scripted.decide("scripted/desk.yml", user("hello")).text == "general"


def test_bad_scripts_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a built-in behaviour"):
        scripted.decide("scripted/no-such-script", user("x"))
    bad = tmp_path / "bad.yml"
    bad.write_text("rules:\n  - when: {contains: x}\n    replly: typo\n")
    with pytest.raises(ConfigurationError, match=r"rules\[0\]: unknown keys \['replly'\]"):
        scripted.decide(f"scripted/{bad}", user("x"))


def test_gateway_streams_and_counts_usage_through_litellm() -> None:
    chunks = []
    response = LLMGateway().complete("scripted/echo", user("one two three"), on_chunk=chunks.append)
    assert "".join(c.content for c in chunks) == response.content == "echo: one two three"
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert response.input_tokens > 0 and response.output_tokens > 0


def test_gateway_retries_retryable_errors_with_backoff() -> None:
    delays: list[float] = []
    gateway = LLMGateway(max_retries=3, retry_interval=1.0, backoff_factor=2.0, randomness=0.0, sleep=delays.append)
    with pytest.raises(InferenceError, match="scripted/fail:overloaded: .*overloaded"):
        gateway.complete("scripted/fail:overloaded", user("x"))
    assert delays == [1.0, 2.0, 4.0]


def test_offline_guard_fails_fast_for_real_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")
    delays: list[float] = []
    with pytest.raises(ConfigurationError, match="model requests are disabled"):
        LLMGateway(sleep=delays.append).complete("openai/gpt-4o-mini", user("x"))
    assert delays == []


def test_streaming_logging_is_quiet_unless_a_litellm_callback_listens() -> None:
    from robot_lab.llm.gateway import litellm_module
    from tests.redis_server import wait_for

    from robot_lab.llm import gateway as gateway_module

    litellm = litellm_module()
    litellm.disable_streaming_logging = False  # as litellm starts (other tests may have changed it)
    gateway_module._streaming_logging_disabled_by_us = False
    gateway = LLMGateway()
    # a scripted call nobody listens to skips litellm altogether (tests/test_scripted_direct.py);
    # a streamed litellm call first does this:
    gateway_module._quiet_streaming_logging(litellm)
    assert litellm.disable_streaming_logging is True  # nothing listens: no per-chunk logging work
    seen: list[object] = []
    litellm.success_callback = [lambda kwargs, response, start, end: seen.append(response)]
    try:
        gateway.complete("scripted/echo", user("loud"), on_chunk=lambda chunk: None)
        assert litellm.disable_streaming_logging is False  # a user's callback still sees streamed calls
        wait_for(lambda: seen)
    finally:
        litellm.success_callback = []


def test_a_long_lived_process_keeps_only_the_newest_recorded_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker on the scripted model makes calls for its whole life: the in-process record
    keeps the newest ``KEEP_CALLS`` of them, not every call ever made."""
    from collections import deque

    from robot_lab.llm import recording

    assert recording._calls.maxlen == recording.KEEP_CALLS  # the process's own record is bounded
    monkeypatch.setattr(recording, "_calls", deque(maxlen=3))
    for i in range(5):
        recording.record_call("scripted/echo", [{"role": "user", "content": f"m{i}"}], {}, None)
    assert [c["request"] for c in recording.recorded_calls()] == ["m2", "m3", "m4"]
