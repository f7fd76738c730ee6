"""What a model call gives the runtime: :class:`LLMResponse` (text, tool calls, usage, cost,
finish reason), read from litellm's response or from a stream's parts.

Why apart from the gateway: the rest of the runtime sees these types, never litellm's, and
a provider's odd answer (no choices, no usage, tool arguments that are not JSON) is turned
here into something the tool loop can act on: an error, an estimate, a parse error for the
model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import InferenceError
from robot_lab.logging import get_logger

log = get_logger("robot_lab.llm")


@dataclass
class Chunk:
    """One streamed piece of the reply (the Ruby gem's ``RubyLLM::Chunk``; use ``.content``)."""

    content: str
    index: int = 0

    def __str__(self) -> str:
        return self.content


@dataclass
class ToolCallRequest:
    """A tool call the model asked for. ``argument_error`` is set when its arguments were
    not a JSON object: the tool is then not called, the model is told why."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""
    argument_error: str | None = None


@dataclass
class LLMResponse:
    content: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    finish_reason: str | None = None
    model: str = ""
    reasoning: str | None = None
    usage_estimated: bool = False

    def assistant_message(self) -> dict[str, Any]:
        """The OpenAI-style message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.raw_arguments or json.dumps(c.arguments)},
                }
                for c in self.tool_calls
            ]
        return message


def parse_arguments(raw: Any, name: str) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments and, when they are not a JSON object, why not."""
    if isinstance(raw, dict):
        return raw, None
    if not raw or not str(raw).strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"the arguments for {name} were not valid JSON ({exc.msg} at position {exc.pos}): {str(raw)[:200]}"
    if not isinstance(value, dict):
        return {}, f"the arguments for {name} must be a JSON object, got {type(value).__name__}"
    return value, None


def tool_call(call_id: str, name: str, raw: Any) -> ToolCallRequest:
    arguments, error = parse_arguments(raw, name)
    return ToolCallRequest(id=call_id, name=name, arguments=arguments,
                           raw_arguments=raw if isinstance(raw, str) else "", argument_error=error)


def _usage(response: Any) -> tuple[int, int] | None:
    """(input, output) tokens the provider reported; None when it reported none."""
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    tokens = int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)
    return None if tokens == (0, 0) else tokens


def estimate_usage(litellm: Any, model: str, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, reply: LLMResponse) -> tuple[int, int]:
    """Tokens of a call whose response carried no usage, counted with litellm's token
    counter (its bundled tiktoken encodings, never a download; characters / 4 if it cannot)."""
    text = (reply.content or "") + "".join(c.name + (c.raw_arguments or json.dumps(c.arguments))
                                           for c in reply.tool_calls)
    litellm.disable_hf_tokenizer_download = True
    try:
        input_tokens = int(litellm.token_counter(model=model, messages=messages, tools=tools or None))
    except Exception:  # noqa: BLE001 - a count is an estimate; never fail the call over it
        input_tokens = -(-len(json.dumps(messages, default=str) + json.dumps(tools or [], default=str)) // 4)
    try:
        output_tokens = int(litellm.token_counter(model=model, text=text)) if text else 0
    except Exception:  # noqa: BLE001
        output_tokens = -(-len(text) // 4)
    return input_tokens, output_tokens


def to_response(litellm: Any, response: Any, model: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, *, priced: bool = True) -> LLMResponse:
    """litellm's ModelResponse as an :class:`LLMResponse`. No choices is an InferenceError;
    no usage is estimated (and logged), so a budget still counts the call."""
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise InferenceError(f"{model}: the provider's response had no choices (an empty reply)")
    choice = choices[0]
    message = choice.message
    calls = [tool_call(c.id or f"call_{i}", c.function.name, c.function.arguments)
             for i, c in enumerate(getattr(message, "tool_calls", None) or [])]
    result = LLMResponse(content=message.content or "", tool_calls=calls, finish_reason=choice.finish_reason,
                         model=model, reasoning=getattr(message, "reasoning_content", None))
    usage = _fill_usage(litellm, result, _usage(response), messages, tools)
    if priced:
        result.cost = price(litellm, model, usage, None if result.usage_estimated else response)
    return result


def _fill_usage(litellm: Any, result: LLMResponse, usage: tuple[int, int] | None, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None) -> tuple[int, int]:
    """The reported usage, else an estimate (logged): a budget never sees a free call."""
    if usage is None:
        usage = estimate_usage(litellm, result.model, messages, tools, result)
        result.usage_estimated = True
        log.warning("llm.usage_missing", model=result.model, estimated_input=usage[0], estimated_output=usage[1])
    result.input_tokens, result.output_tokens = usage
    return usage


class Assembly:
    """One streamed reply, assembled as its parts come: the text handed to ``on_chunk``,
    tool-call deltas joined by index, the finish reason and the usage of the last part
    (shared by the sync and the async stream). ``delivered`` says whether any text reached
    ``on_chunk``: such a call is not retried (the consumer would see the text twice).

    Why not litellm's ``stream_chunk_builder``: litellm already rebuilds a stream twice
    inside each call; a third rebuild here cost more than all of robot-lab's own work per
    streamed call (bench/provider.py)."""

    __slots__ = ("calls", "finish_reason", "index", "on_chunk", "parts", "reasoning", "text", "usage")

    def __init__(self, on_chunk: Callable[[Chunk], None]) -> None:
        self.on_chunk = on_chunk
        self.index = 0
        self.parts = 0
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> [id, name, [argument pieces]]
        self.finish_reason: str | None = None
        self.usage: Any = None

    @property
    def delivered(self) -> bool:
        return self.index > 0

    def take(self, part: Any) -> None:
        usage = getattr(part, "usage", None)
        if usage is not None:
            self.usage = usage
        choices = part.choices
        if not choices:
            return
        self.parts += 1
        choice = choices[0]
        if choice.finish_reason:
            self.finish_reason = choice.finish_reason
        delta = choice.delta
        text = getattr(delta, "content", None)
        if text:
            self.text.append(text)
            self.on_chunk(Chunk(content=text, index=self.index))
            self.index += 1
        thought = getattr(delta, "reasoning_content", None)
        if thought:
            self.reasoning.append(thought)
        for call in getattr(delta, "tool_calls", None) or ():
            entry = self.calls.setdefault(getattr(call, "index", None) or 0, ["", "", []])
            if call.id:
                entry[0] = call.id
            function = call.function
            if function is not None:
                if function.name:
                    entry[1] = function.name
                if function.arguments:
                    entry[2].append(function.arguments)

    def response(self, litellm: Any, model: str, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None) -> LLMResponse:
        if not self.parts:
            raise InferenceError(f"{model}: the provider's stream had no choices (an empty reply)")
        calls = [tool_call(entry[0] or f"call_{i}", entry[1], "".join(entry[2]))
                 for i, entry in sorted(self.calls.items())]
        result = LLMResponse(content="".join(self.text), tool_calls=calls, finish_reason=self.finish_reason,
                             model=model, reasoning="".join(self.reasoning) or None)
        result.cost = price(litellm, model, _fill_usage(litellm, result, _usage(self), messages, tools))
        return result


_UNPRICED: set[str] = set()


def price(litellm: Any, model: str, usage: tuple[int, int], response: Any = None) -> float:
    """The call's cost from litellm's price table (``completion_cost`` of the response when
    there is one). A model it has no price for (or prices at 0) is remembered, so the
    lookup, which costs more than the rest of a call's own work, is not repeated."""
    if model in _UNPRICED:
        return 0.0
    try:
        if response is not None:
            cost = float(litellm.completion_cost(completion_response=response) or 0.0)
        else:
            prompt, completion = litellm.cost_per_token(model=model, prompt_tokens=usage[0],
                                                        completion_tokens=usage[1])
            cost = float(prompt) + float(completion)
    except Exception:  # noqa: BLE001 - unknown model pricing: cost stays 0, tokens still count
        cost = 0.0
    if cost == 0.0 and any(usage):
        _UNPRICED.add(model)
    return cost
