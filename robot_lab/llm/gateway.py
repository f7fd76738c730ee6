"""The LLM gateway: every provider call goes through litellm, imported on first use.

Why a gateway: one place for the offline guard (``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0``), the
endpoint of a model (``api_base`` / ``api_key`` of the robot, else ``settings.endpoints``),
the one retry policy (:mod:`.retry`: litellm itself never retries), the call's deadline and
streaming. The rest of the runtime sees :class:`LLMResponse` (:mod:`.response`), never
litellm's types. The scripted model is answered without litellm (:mod:`.scripted_provider`)
unless a litellm callback listens.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.llm import scripted
from robot_lab.llm.response import Assembly, Chunk, LLMResponse, ToolCallRequest, to_response
from robot_lab.llm.retry import CallBudget, short_error
from robot_lab.llm.scripted_provider import ascripted_direct, scripted_direct, scripted_handler_class
from robot_lab.settings import get_settings

__all__ = ["Chunk", "LLMGateway", "LLMResponse", "ToolCallRequest", "default_gateway", "is_scripted",
           "litellm_module", "short_error"]

log = get_logger("robot_lab.llm")

_setup_lock = threading.Lock()
_litellm: Any = None


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
            handler = scripted_handler_class(litellm)()
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


def is_scripted(model: str) -> bool:
    return model == scripted.PROVIDER or model.startswith(f"{scripted.PROVIDER}/")


def _model_requests_allowed() -> bool:
    """``ROBOT_LAB_ALLOW_MODEL_REQUESTS`` is a kill switch, read before the settings: set, it
    wins over every other source, ``configure(allow_model_requests=...)`` included, so a test
    run or an operator can stop all paid calls of a process whatever its code configures.
    Unset, the setting ``allow_model_requests`` (default true) decides."""
    value = os.environ.get("ROBOT_LAB_ALLOW_MODEL_REQUESTS")
    if value is not None:
        return value.strip().lower() not in {"0", "false", "no", "off"}

    return get_settings().allow_model_requests


def check_model_allowed(model: str) -> None:
    """Refuse a provider model while model requests are disabled (the kill switch above):
    every call checks it, and ``robot-lab chat -m`` checks it before it builds the robot."""
    if not is_scripted(model) and not _model_requests_allowed():
        raise ConfigurationError(
            f"model requests are disabled (ROBOT_LAB_ALLOW_MODEL_REQUESTS=0): refusing to call {model!r}; "
            "use a scripted/... model"
        )


def _check_credentials(litellm: Any, model: str, kwargs: dict[str, Any]) -> None:
    """Fail before the first attempt when the provider's key is not in the environment."""
    if kwargs.get("api_key") or kwargs.get("api_base"):
        return
    keys = _missing_keys(litellm, model)
    if keys:
        raise ConfigurationError(
            f"{model}: no credentials: set {' and '.join(keys)} (or pick another model with -m / ROBOT_LAB_MODEL; "
            "scripted/echo needs none)"
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


def _endpoint(litellm: Any, model: str, kwargs: dict[str, Any]) -> None:
    """Fill in the model's endpoint: the robot's ``api_base`` / ``api_key`` (or the
    variable ``api_key_env`` names, read here: a spec carries the name, never the key),
    else the ones ``settings.endpoints`` names for this model. A base URL without a key, and no key in
    the environment either (a local, keyless server), gets a placeholder key, as litellm's
    OpenAI client insists on one."""
    key_variable = kwargs.pop("api_key_env", None)
    if key_variable and not kwargs.get("api_key"):
        if not os.environ.get(key_variable):
            raise ConfigurationError(f"{model}: api_key_env names {key_variable}, which is not set")
        kwargs["api_key"] = os.environ[key_variable]
    if not kwargs.get("api_base") or not kwargs.get("api_key"):
        configured = get_settings().endpoints.get(model)
        if configured is not None:
            if configured.api_base and not kwargs.get("api_base"):
                kwargs["api_base"] = configured.api_base
            if configured.api_key is not None and not kwargs.get("api_key"):
                kwargs["api_key"] = configured.api_key.get_secret_value()
    if kwargs.get("api_base") and not kwargs.get("api_key") and _missing_keys(litellm, model):
        kwargs["api_key"] = "no-key"


def _names_endpoint(model: str, params: dict[str, Any] | None) -> bool:
    """Whether the call names its own endpoint or key (the robot's, or ``settings.endpoints``):
    then the provider's usual key variable is not needed."""
    if params and any(params.get(name) for name in ("api_base", "api_key", "api_key_env")):
        return True

    return model in get_settings().endpoints


def _missing_keys(litellm: Any, model: str) -> list[str]:
    """The provider's key variables that are not set (none when litellm cannot tell)."""
    try:
        missing = litellm.validate_environment(model).get("missing_keys") or []
    except Exception:  # litellm cannot tell (an unknown provider): the call itself will say
        return []
    return [k for k in missing if any(word in k for word in ("KEY", "TOKEN", "SECRET"))]


class LLMGateway:
    """Calls a model through litellm with robot-lab's guard, retries, deadline and streaming.

    One call makes at most ``1 + max_retries`` requests and takes at most ``deadline``
    seconds, waits included; each request's timeout is ``timeout``, cut to what the deadline
    leaves. A streamed call that already delivered text is never retried."""

    def __init__(
        self,
        *,
        max_retries: int | None = None,
        retry_interval: float | None = None,
        backoff_factor: float | None = None,
        randomness: float | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        async_sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        s = get_settings()
        self.max_retries = s.max_retries if max_retries is None else max_retries
        self.retry_interval = s.retry_interval if retry_interval is None else retry_interval
        self.backoff_factor = s.retry_backoff_factor if backoff_factor is None else backoff_factor
        self.randomness = s.retry_interval_randomness if randomness is None else randomness
        self.timeout = s.request_timeout if timeout is None else timeout
        self.deadline = s.call_deadline if deadline is None else deadline
        self._sleep = sleep
        self._asleep = async_sleep or asyncio.sleep

    def _budget(self, model: str) -> CallBudget:
        return CallBudget(model=model, max_retries=self.max_retries, retry_interval=self.retry_interval,
                          backoff_factor=self.backoff_factor, randomness=self.randomness,
                          request_timeout=self.timeout, deadline_s=self.deadline)

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
        budget = self._budget(model)
        while True:
            assembly = None if on_chunk is None else Assembly(on_chunk)
            try:
                if litellm is None:  # the scripted model, nobody listening to litellm
                    return scripted_direct(model, messages, kwargs, on_chunk)
                timeout = budget.attempt_timeout()
                if assembly is None:
                    response = litellm.completion(model=model, messages=messages, timeout=timeout, **kwargs)
                    return to_response(litellm, response, model, messages, tools, priced=not is_scripted(model))
                _quiet_streaming_logging(litellm)
                stream = litellm.completion(model=model, messages=messages, stream=True, timeout=timeout,
                                            stream_options={"include_usage": True}, **kwargs)
                for part in stream:
                    assembly.take(part)
                    budget.check_deadline()
                return assembly.response(litellm, model, messages, tools)
            except Exception as exc:  # litellm maps provider failures to its own exception types
                self._sleep(budget.after_failure(exc, delivered=assembly is not None and assembly.delivered))

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
        ``asyncio.sleep``), deadline, streaming and result; the event loop stays free while
        the provider answers."""
        litellm, kwargs = self._prepare(model, tools, params, provider, robot)
        budget = self._budget(model)
        while True:
            assembly = None if on_chunk is None else Assembly(on_chunk)
            try:
                if litellm is None:
                    return await ascripted_direct(model, messages, kwargs, on_chunk)
                timeout = budget.attempt_timeout()
                async with budget.async_deadline():
                    if assembly is None:
                        response = await litellm.acompletion(model=model, messages=messages, timeout=timeout,
                                                             **kwargs)
                        return to_response(litellm, response, model, messages, tools, priced=not is_scripted(model))
                    _quiet_streaming_logging(litellm)
                    stream = await litellm.acompletion(model=model, messages=messages, stream=True, timeout=timeout,
                                                       stream_options={"include_usage": True}, **kwargs)
                    async for part in stream:
                        assembly.take(part)
                    return assembly.response(litellm, model, messages, tools)
            except Exception as exc:
                await self._asleep(budget.after_failure(exc, delivered=assembly is not None and assembly.delivered))

    def _prepare(
        self,
        model: str,
        tools: list[dict[str, Any]] | None,
        params: dict[str, Any] | None,
        provider: str | None,
        robot: str | None,
    ) -> tuple[Any, dict[str, Any]]:
        """The offline guard, the endpoint and the credentials check, then litellm (None:
        answer the scripted model directly) and the call's keyword arguments (shared by the
        sync and the async call). ``max_retries=0``: litellm never retries on its own."""
        check_model_allowed(model)
        if not is_scripted(model) and not _names_endpoint(model, params):
            # a missing key of a common provider: now, before litellm's import (seconds)
            from robot_lab.llm.credentials import check_known_provider_key  # lazy: start-up time

            check_known_provider_key(model, provider, params)
        direct = is_scripted(model) and not _litellm_listening()
        litellm = None if direct else litellm_module()
        kwargs: dict[str, Any] = {k: v for k, v in (params or {}).items() if v is not None}
        if is_scripted(model):
            for name in ("api_base", "api_key", "api_key_env"):
                kwargs.pop(name, None)
            kwargs["metadata"] = {"robot_lab_provider": provider, "robot_lab_robot": robot}
        else:
            if provider and "/" not in model:
                kwargs["custom_llm_provider"] = provider
            _endpoint(litellm, model, kwargs)
            _check_credentials(litellm, f"{provider}/{model}" if "custom_llm_provider" in kwargs else model, kwargs)
            kwargs["max_retries"] = 0
        if tools:
            kwargs["tools"] = tools
        return litellm, kwargs

_default_gateway: LLMGateway | None = None


def default_gateway() -> LLMGateway:
    global _default_gateway
    if _default_gateway is None:
        _default_gateway = LLMGateway()
    return _default_gateway
