"""The scripted model as a provider: litellm's custom-provider handler (``scripted/...``
when a litellm callback listens) and the direct path that answers without litellm.

Why a direct path: litellm's import is 200 MB and seconds, and its streaming machinery cost
more than a whole network task (bench/dag.py, bench/worker_memory.py). Both paths give the
same response, chunks and recorded call (tests/test_scripted_direct.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

from robot_lab.llm import recording, scripted
from robot_lab.llm.response import Chunk, LLMResponse, tool_call


def _scripted_response(model: str, d: scripted.Decision) -> Any:
    """A scripted decision as litellm's ModelResponse (non-streaming)."""
    from litellm.types.utils import ModelResponse  # lazy: start-up time

    message: dict[str, Any] = {"role": "assistant", "content": d.text or None}
    if d.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in d.tool_calls
        ]
    return ModelResponse(
        model=f"scripted/{model}",
        choices=[{"index": 0, "message": message, "finish_reason": "tool_calls" if d.tool_calls else "stop"}],
        usage={
            "prompt_tokens": d.prompt_tokens,
            "completion_tokens": d.completion_tokens,
            "total_tokens": d.prompt_tokens + d.completion_tokens,
        },
    )


def _scripted_chunks(d: scripted.Decision) -> Iterator[dict[str, Any]]:
    """A scripted decision as litellm's generic streaming chunks: text word by word, then
    the tool calls, then the finish chunk with the usage."""
    usage = {
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
    }
    for piece in scripted.stream_pieces(d.text):
        yield {"text": piece, "tool_use": None, "is_finished": False, "finish_reason": "", "usage": None, "index": 0}
    for index, call in enumerate(d.tool_calls):
        yield {
            "text": "",
            "tool_use": {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                "index": index,
            },
            "is_finished": False,
            "finish_reason": "",
            "usage": None,
            "index": 0,
        }
    yield {
        "text": "",
        "tool_use": None,
        "is_finished": True,
        "finish_reason": "tool_calls" if d.tool_calls else "stop",
        "usage": usage,
        "index": 0,
    }


def scripted_handler_class(litellm: Any) -> type:
    from litellm.llms.custom_llm import CustomLLM  # lazy: start-up time

    class ScriptedLLM(CustomLLM):  # type: ignore[misc, valid-type]
        """litellm custom provider ``scripted``: answers come from :mod:`.scripted`."""

        def _decide(self, model: str, messages: list, optional_params: dict, kwargs: dict, *,
                    defer_sleep: bool = False) -> scripted.Decision:
            metadata = (kwargs.get("litellm_params") or {}).get("metadata")
            recording.record_call(model, messages, optional_params, metadata)
            return scripted.decide(model, messages, optional_params.get("tools") or [], defer_sleep=defer_sleep)

        async def _adecide(self, model: str, messages: list, kwargs: dict) -> scripted.Decision:
            """The decision, its latency slept with ``asyncio.sleep`` (the loop serves others)."""
            return await _awaited(lambda: self._decide(model, messages, kwargs.get("optional_params") or {}, kwargs,
                                                       defer_sleep=True))

        def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:
            return _scripted_response(model, self._decide(model, messages, kwargs.get("optional_params") or {}, kwargs))

        def streaming(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
            yield from _scripted_chunks(self._decide(model, messages, kwargs.get("optional_params") or {}, kwargs))

        async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:
            return _scripted_response(model, await self._adecide(model, messages, kwargs))

        async def astreaming(self, model: str, messages: list, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
            for chunk in _scripted_chunks(await self._adecide(model, messages, kwargs)):
                yield chunk

    return ScriptedLLM


def _scripted_decision(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any], *,
                       defer_sleep: bool) -> scripted.Decision:
    optional = {k: v for k, v in kwargs.items() if k != "metadata"}
    recording.record_call(model, messages, optional, kwargs.get("metadata"))
    return scripted.decide(model, messages, optional.get("tools") or [], defer_sleep=defer_sleep)


def _direct_response(model: str, d: scripted.Decision, on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    if on_chunk is not None:
        for index, piece in enumerate(scripted.stream_pieces(d.text)):
            on_chunk(Chunk(content=piece, index=index))
    calls = [tool_call(c.id, c.name, json.dumps(c.arguments)) for c in d.tool_calls]
    return LLMResponse(content=d.text, tool_calls=calls, input_tokens=d.prompt_tokens,
                       output_tokens=d.completion_tokens, finish_reason="tool_calls" if calls else "stop", model=model)


def scripted_direct(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                     on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    """The scripted model's answer as litellm's custom-provider seam would give it: the call
    recorded, the reply streamed word by word, tool arguments as JSON text, no cost."""
    return _direct_response(model, _scripted_decision(model, messages, kwargs, defer_sleep=False), on_chunk)


async def ascripted_direct(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                            on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    """:func:`scripted_direct` whose latency (``sleep:``, ``sleep_ms``) is awaited, so the
    event loop serves other runs meanwhile."""
    d = await _awaited(lambda: _scripted_decision(model, messages, kwargs, defer_sleep=True))
    return _direct_response(model, d, on_chunk)


async def _awaited(decide: Callable[[], scripted.Decision]) -> scripted.Decision:
    """A decision made with its sleep deferred, the sleep then awaited (a failure's too)."""
    try:
        d = decide()
    except scripted.ScriptedProviderError as exc:
        if exc.delay:
            await asyncio.sleep(exc.delay)
        raise
    if d.delay:
        await asyncio.sleep(d.delay)
    return d
