"""The scripted model answered without litellm (the default) gives what litellm's custom-provider
seam gives (used while a litellm callback listens): the same response, the same streamed
chunks, the same recorded call (docs/scripted-model.md, "Without litellm")."""

from __future__ import annotations

from typing import Any

import pytest

from robot_lab.llm import gateway, recording
from robot_lab.llm.gateway import LLMGateway

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "find a thing", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}}]
ROUTER = [{"type": "function", "function": {"name": "route", "description": "pick", "parameters": {
    "type": "object", "properties": {"to": {"type": "string", "enum": ["billing", "technical"]}}}}}]
CASES = [
    ("scripted/echo", [{"role": "user", "content": "hello there  world"}], None),
    ("scripted/echo", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], TOOLS),
    ("scripted/text:", [{"role": "user", "content": "x"}], None),
    ("scripted/route:technical", [{"role": "user", "content": "it crashed"}], ROUTER),
    ("scripted/echo", [{"role": "user", "content": "go"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "found 3"}], TOOLS),
]
PARAMS = {"temperature": 0.2, "max_tokens": 50, "stop": "x"}


def _call(model: str, messages: list[dict[str, Any]], tools: Any, stream: bool) -> tuple[Any, list[Any], Any]:
    recording.clear_recorded_calls()
    chunks: list[Any] = []
    response = LLMGateway(max_retries=0).complete(model, messages, tools=tools, params=PARAMS, provider="anthropic",
                                                  robot="r", on_chunk=chunks.append if stream else None)
    return response, chunks, recording.recorded_calls()


@pytest.fixture
def litellm_listening():  # type: ignore[no-untyped-def]
    """A litellm callback is registered: scripted calls go through litellm's seam."""
    litellm = gateway.litellm_module()
    litellm.success_callback = [lambda *args: None]
    try:
        yield
    finally:
        litellm.success_callback = []


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_without_litellm_the_scripted_model_answers_as_through_litellm(case: int, stream: bool,
                                                                       litellm_listening: None) -> None:
    model, messages, tools = CASES[case]
    through_litellm = _call(model, messages, tools, stream)
    litellm = gateway.litellm_module()
    litellm.success_callback = []
    assert not gateway._litellm_listening()
    direct = _call(model, messages, tools, stream)
    assert direct == through_litellm


def test_a_scripted_call_needs_no_litellm_until_a_callback_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway, "_litellm", None)  # as in a fresh process

    def refuse() -> Any:
        raise AssertionError("litellm imported for a scripted call")

    monkeypatch.setattr(gateway, "litellm_module", refuse)
    chunks: list[Any] = []
    response = LLMGateway().complete("scripted/echo", [{"role": "user", "content": "a b"}], on_chunk=chunks.append)
    assert response.content == "echo: a b" and [c.content for c in chunks] == ["echo: ", "a ", "b"]
