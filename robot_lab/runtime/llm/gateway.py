"""The LLM gateway: every provider call goes through litellm, imported on first use.

Why a gateway: one place for the offline guard (``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0``), the
retry policy (the Ruby gem's max_retries / retry_interval / backoff factor / randomness), the
scripted provider registration, streaming reassembly and usage/cost extraction. The rest of
the runtime sees :class:`LLMResponse`, never litellm's types.

The scripted model is answered without litellm (:func:`_scripted_direct`) unless a litellm
callback listens: litellm's import is 200 MB and seconds, and its streaming machinery cost
more than a whole network task (bench/dag.py, bench/worker_memory.py). Both paths give the
same response, chunks and recorded call (tests/test_scripted_direct.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import ConfigurationError, InferenceError
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.runtime.llm import recording, scripted
from robot_lab.settings import get_settings

log = get_logger("robot_lab.llm")

_setup_lock = threading.Lock()
_litellm: Any = None

# litellm exception class names worth another attempt (network, overload, rate limits).
RETRYABLE_PROVIDER_ERRORS = frozenset(
    {
        "RateLimitError",
        "APIConnectionError",
        "Timeout",
        "ServiceUnavailableError",
        "InternalServerError",
        "BadGatewayError",
        "APIError",
    }
)


@dataclass
class Chunk:
    """One streamed piece of the reply (the Ruby gem's ``RubyLLM::Chunk``; use ``.content``)."""

    content: str
    index: int = 0

    def __str__(self) -> str:
        return self.content


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""


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


def _scripted_handler_class(litellm: Any) -> type:
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
            try:
                d = self._decide(model, messages, kwargs.get("optional_params") or {}, kwargs, defer_sleep=True)
            except scripted.ScriptedProviderError as exc:
                if exc.delay:
                    await asyncio.sleep(exc.delay)
                raise
            if d.delay:
                await asyncio.sleep(d.delay)
            return d

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


def litellm_module() -> Any:
    """Import litellm once, offline-safe, with the scripted provider registered."""
    global _litellm
    if _litellm is not None:
        return _litellm
    with _setup_lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            os.environ.setdefault("LITELLM_TELEMETRY", "False")
            import litellm  # lazy: start-up time

            litellm.telemetry = False
            litellm.suppress_debug_info = True
            handler = _scripted_handler_class(litellm)()
            litellm.custom_provider_map = [
                item for item in litellm.custom_provider_map if item.get("provider") != scripted.PROVIDER
            ] + [{"provider": scripted.PROVIDER, "custom_handler": handler}]
            _quiet_streaming_logging(litellm)
            _litellm = litellm
    return _litellm


_CALLBACK_LISTS = ("callbacks", "success_callback", "_async_success_callback", "failure_callback",
                   "_async_failure_callback", "input_callback")


def _litellm_listening() -> bool:
    """Whether a litellm callback is registered (litellm only counts once it is imported).
    Also keeps litellm's per-chunk streaming logging in step with that, as a call through
    litellm does (:func:`_quiet_streaming_logging`), so a callback removed meanwhile does
    not leave it on."""
    if _litellm is None:
        return False
    _quiet_streaming_logging(_litellm)
    return any(getattr(_litellm, name, None) for name in _CALLBACK_LISTS)


def _scripted_decision(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any], *,
                       defer_sleep: bool) -> scripted.Decision:
    optional = {k: v for k, v in kwargs.items() if k != "metadata"}
    recording.record_call(model, messages, optional, kwargs.get("metadata"))
    return scripted.decide(model, messages, optional.get("tools") or [], defer_sleep=defer_sleep)


def _direct_response(model: str, d: scripted.Decision, on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    if on_chunk is not None:
        for index, piece in enumerate(scripted.stream_pieces(d.text)):
            on_chunk(Chunk(content=piece, index=index))
    calls = []
    for c in d.tool_calls:
        raw = json.dumps(c.arguments)
        calls.append(ToolCallRequest(id=c.id, name=c.name, arguments=_parse_arguments(raw, c.name), raw_arguments=raw))
    return LLMResponse(content=d.text, tool_calls=calls, input_tokens=d.prompt_tokens,
                       output_tokens=d.completion_tokens, finish_reason="tool_calls" if calls else "stop", model=model)


def _scripted_direct(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                     on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    """The scripted model's answer as litellm's custom-provider seam would give it: the call
    recorded, the reply streamed word by word, tool arguments as JSON text, no cost."""
    return _direct_response(model, _scripted_decision(model, messages, kwargs, defer_sleep=False), on_chunk)


async def _ascripted_direct(model: str, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                            on_chunk: Callable[[Chunk], None] | None) -> LLMResponse:
    """:func:`_scripted_direct` whose latency (``sleep:``, ``sleep_ms``) is awaited, so the
    event loop serves other runs meanwhile."""
    try:
        d = _scripted_decision(model, messages, kwargs, defer_sleep=True)
    except scripted.ScriptedProviderError as exc:
        if exc.delay:
            await asyncio.sleep(exc.delay)
        raise
    if d.delay:
        await asyncio.sleep(d.delay)
    return _direct_response(model, d, on_chunk)


def is_scripted(model: str) -> bool:
    return model == scripted.PROVIDER or model.startswith(f"{scripted.PROVIDER}/")


def _model_requests_allowed() -> bool:
    value = os.environ.get("ROBOT_LAB_ALLOW_MODEL_REQUESTS")
    if value is not None:
        return value.strip().lower() not in {"0", "false", "no", "off"}

    return get_settings().allow_model_requests


# Provider answers that another attempt cannot change: a wrong or missing key, an unknown
# model, a request the provider rejects. Checked before RETRYABLE_PROVIDER_ERRORS, because
# litellm's classes all derive from openai's APIError.
PERMANENT_PROVIDER_ERRORS = frozenset(
    {
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "BadRequestError",
        "UnprocessableEntityError",
        "ContextWindowExceededError",
        "ContentPolicyViolationError",
        "UnsupportedParamsError",
    }
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps (litellm keeps the original in ``original_exception``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, scripted.ScriptedProviderError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & PERMANENT_PROVIDER_ERRORS:
        return False
    return bool(names & RETRYABLE_PROVIDER_ERRORS)


def _permanent_error(exc: BaseException, model: str) -> ConfigurationError | None:
    """The ConfigurationError to raise at once for ``exc``, or None when it may pass."""
    for inner in _chain(exc):
        if isinstance(inner, ConfigurationError):  # e.g. an unknown scripted behaviour
            return inner
    if {cls.__name__ for cls in type(exc).__mro__} & PERMANENT_PROVIDER_ERRORS:
        return ConfigurationError(f"{model}: {short_error(exc)} (not retried: another attempt cannot fix this)")
    return None


def _check_credentials(litellm: Any, model: str, kwargs: dict[str, Any]) -> None:
    """Fail before the first attempt when the provider's key is not in the environment."""
    if kwargs.get("api_key") or kwargs.get("api_base"):
        return
    try:
        missing = litellm.validate_environment(model).get("missing_keys") or []
    except Exception:  # litellm cannot tell (an unknown provider): the call itself will say
        return
    keys = [k for k in missing if any(word in k for word in ("KEY", "TOKEN", "SECRET"))]
    if keys:
        _no_credentials(model, keys)


def _no_credentials(model: str, keys: list[str]) -> None:
    raise ConfigurationError(
        f"{model}: no credentials: set {' and '.join(keys)} (or pick another model with -m / ROBOT_LAB_MODEL; "
        "scripted/echo needs none)"
    )


def short_error(exc: BaseException, limit: int = 300) -> str:
    """First line of an exception's text, capped: litellm appends tracebacks and links."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_arguments(raw: Any, name: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {"_raw": raw, "_error": f"arguments for {name} were not valid JSON"}
    return value if isinstance(value, dict) else {"value": value}


def _usage(response: Any) -> tuple[int, int]:
    usage = getattr(response, "usage", None)
    if usage is None:
        return 0, 0
    return int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)


def _to_response(litellm: Any, response: Any, model: str) -> LLMResponse:
    choice = response.choices[0]
    message = choice.message
    calls = [
        ToolCallRequest(
            id=c.id or f"call_{i}",
            name=c.function.name,
            arguments=_parse_arguments(c.function.arguments, c.function.name),
            raw_arguments=c.function.arguments if isinstance(c.function.arguments, str) else "",
        )
        for i, c in enumerate(getattr(message, "tool_calls", None) or [])
    ]
    input_tokens, output_tokens = _usage(response)
    cost = 0.0
    if not is_scripted(model):
        try:
            cost = float(litellm.completion_cost(completion_response=response) or 0.0)
        except Exception:  # unknown model pricing: cost stays 0, tokens still count
            cost = 0.0
    return LLMResponse(
        content=message.content or "",
        tool_calls=calls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=cost,
        finish_reason=choice.finish_reason,
        model=model,
        reasoning=getattr(message, "reasoning_content", None),
    )


_streaming_logging_disabled_by_us = False


def _quiet_streaming_logging(litellm: Any) -> None:
    """litellm hands every streamed chunk to a logging thread pool even when no callback is
    registered: about 40% of a streamed call's cost here (bench/dag.py). Turn that off
    while nothing listens, and back on as soon as a litellm callback is registered."""
    global _streaming_logging_disabled_by_us
    listening = any(getattr(litellm, name, None) for name in _CALLBACK_LISTS)
    if not listening and not litellm.disable_streaming_logging:
        litellm.disable_streaming_logging = True
        _streaming_logging_disabled_by_us = True
    elif listening and _streaming_logging_disabled_by_us:
        litellm.disable_streaming_logging = False
        _streaming_logging_disabled_by_us = False


class LLMGateway:
    """Calls a model through litellm with robot-lab's guard, retries and streaming."""

    def __init__(
        self,
        *,
        max_retries: int | None = None,
        retry_interval: float | None = None,
        backoff_factor: float | None = None,
        randomness: float | None = None,
        timeout: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        async_sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        s = get_settings()
        self.max_retries = s.max_retries if max_retries is None else max_retries
        self.retry_interval = s.retry_interval if retry_interval is None else retry_interval
        self.backoff_factor = s.retry_backoff_factor if backoff_factor is None else backoff_factor
        self.randomness = s.retry_interval_randomness if randomness is None else randomness
        self.timeout = s.request_timeout if timeout is None else timeout
        self._sleep = sleep
        self._asleep = async_sleep or asyncio.sleep

    @observe.llm_call
    def complete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        on_chunk: Callable[[Chunk], None] | None = None,
        params: dict[str, Any] | None = None,
        provider: str | None = None,
        robot: str | None = None,
    ) -> LLMResponse:
        """One model call; ``on_chunk`` turns on streaming. Raises InferenceError on failure.

        ``provider`` is the Ruby gem's robot provider: litellm's ``custom_llm_provider`` for a
        bare model name (``claude-sonnet-4-5`` + ``anthropic``); a ``provider/model`` string
        already names its provider and keeps it. The scripted model records both."""
        litellm, kwargs = self._prepare(model, tools, params, provider, robot)
        attempt = 0
        while True:
            try:
                if litellm is None:  # the scripted model, nobody listening to litellm
                    return _scripted_direct(model, messages, kwargs, on_chunk)
                if on_chunk is None:
                    response = litellm.completion(model=model, messages=messages, timeout=self.timeout, **kwargs)
                    return _to_response(litellm, response, model)
                return self._stream(litellm, model, messages, on_chunk, kwargs)
            except Exception as exc:  # litellm maps provider failures to its own exception types
                delay = self._retry_delay(exc, model, attempt)
                attempt += 1
                self._sleep(delay)

    @observe.allm_call
    async def acomplete(
        self,
        model: str,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        on_chunk: Callable[[Chunk], None] | None = None,
        params: dict[str, Any] | None = None,
        provider: str | None = None,
        robot: str | None = None,
    ) -> LLMResponse:
        """:meth:`complete` on litellm's ``acompletion``: the same guard, retries (slept with
        ``asyncio.sleep``), timeout, streaming and result; the event loop stays free while the
        provider answers."""
        litellm, kwargs = self._prepare(model, tools, params, provider, robot)
        attempt = 0
        while True:
            try:
                if litellm is None:
                    return await _ascripted_direct(model, messages, kwargs, on_chunk)
                if on_chunk is None:
                    response = await litellm.acompletion(model=model, messages=messages, timeout=self.timeout,
                                                         **kwargs)
                    return _to_response(litellm, response, model)
                return await self._astream(litellm, model, messages, on_chunk, kwargs)
            except Exception as exc:
                delay = self._retry_delay(exc, model, attempt)
                attempt += 1
                await self._asleep(delay)

    def _prepare(
        self,
        model: str,
        tools: list[dict[str, Any]] | None,
        params: dict[str, Any] | None,
        provider: str | None,
        robot: str | None,
    ) -> tuple[Any, dict[str, Any]]:
        """The offline guard and credentials check, then litellm (None: answer the scripted
        model directly, :func:`_scripted_direct`) and the call's keyword arguments (shared by
        the sync and the async call)."""
        if not is_scripted(model) and not _model_requests_allowed():
            raise ConfigurationError(
                f"model requests are disabled (ROBOT_LAB_ALLOW_MODEL_REQUESTS=0): refusing to call {model!r}; "
                "use a scripted/... model"
            )
        kwargs: dict[str, Any] = {k: v for k, v in (params or {}).items() if v is not None}
        if not is_scripted(model):  # a missing key of a common provider: now, before litellm's import
            if provider and "/" not in model:
                kwargs["custom_llm_provider"] = provider
            from robot_lab.runtime.llm.credentials import check_known_provider_key  # lazy: start-up time

            check_known_provider_key(model, provider, params)
        direct = is_scripted(model) and not _litellm_listening()
        litellm = None if direct else litellm_module()
        if is_scripted(model):
            kwargs["metadata"] = {"robot_lab_provider": provider, "robot_lab_robot": robot}
        else:
            _check_credentials(litellm, f"{provider}/{model}" if "custom_llm_provider" in kwargs else model, kwargs)
        if tools:
            kwargs["tools"] = tools
        return litellm, kwargs

    def _retry_delay(self, exc: Exception, model: str, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``exc``; raises when the
        error is permanent or the retries are spent."""
        if isinstance(exc, ConfigurationError):
            raise exc
        permanent = _permanent_error(exc, model)
        if permanent is not None:
            raise permanent from exc
        if attempt >= self.max_retries or not _is_retryable(exc):
            raise InferenceError(f"{model}: {short_error(exc)}") from exc
        delay = self.retry_interval * (self.backoff_factor**attempt)
        delay += delay * self.randomness * random.random()
        log.warning("llm.retry", model=model, attempt=attempt + 1, delay=round(delay, 3), error=short_error(exc))
        return delay

    def _stream(
        self,
        litellm: Any,
        model: str,
        messages: list[dict[str, Any]],
        on_chunk: Callable[[Chunk], None],
        kwargs: dict[str, Any],
    ) -> LLMResponse:
        _quiet_streaming_logging(litellm)
        assembly = _Assembly(on_chunk)
        stream = litellm.completion(model=model, messages=messages, stream=True,
                                    stream_options={"include_usage": True}, timeout=self.timeout, **kwargs)
        for part in stream:
            assembly.take(part)
        return assembly.response(litellm, model, messages)

    async def _astream(
        self,
        litellm: Any,
        model: str,
        messages: list[dict[str, Any]],
        on_chunk: Callable[[Chunk], None],
        kwargs: dict[str, Any],
    ) -> LLMResponse:
        _quiet_streaming_logging(litellm)
        assembly = _Assembly(on_chunk)
        stream = await litellm.acompletion(model=model, messages=messages, stream=True,
                                           stream_options={"include_usage": True}, timeout=self.timeout, **kwargs)
        async for part in stream:
            assembly.take(part)
        return assembly.response(litellm, model, messages)


class _Assembly:
    """The parts of one streamed reply, kept for the final response, their text handed to
    ``on_chunk`` as it comes (shared by the sync and the async stream)."""

    __slots__ = ("chunks", "index", "on_chunk")

    def __init__(self, on_chunk: Callable[[Chunk], None]) -> None:
        self.chunks: list[Any] = []
        self.index = 0
        self.on_chunk = on_chunk

    def take(self, part: Any) -> None:
        self.chunks.append(part)
        if not part.choices:
            return
        text = getattr(part.choices[0].delta, "content", None)
        if text:
            self.on_chunk(Chunk(content=text, index=self.index))
            self.index += 1

    def response(self, litellm: Any, model: str, messages: list[dict[str, Any]]) -> LLMResponse:
        return _to_response(litellm, litellm.stream_chunk_builder(self.chunks, messages=messages), model)


_default_gateway: LLMGateway | None = None


def default_gateway() -> LLMGateway:
    global _default_gateway
    if _default_gateway is None:
        _default_gateway = LLMGateway()
    return _default_gateway
