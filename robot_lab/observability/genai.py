"""The OpenTelemetry GenAI semantic conventions as robot-lab applies them: the attribute
keys, span names and values of its ``chat``, ``execute_tool`` and ``invoke_agent`` spans.

One place for them, so that the hooks (``instrument.py``) only say *which* operation a span
is, and ``tests/test_observability_genai.py`` can hold every key against the constants of
the ``opentelemetry-semantic-conventions`` package (not a dependency: these are plain
strings, so tracing needs nothing beyond the ``[otel]`` extra).

The conventions are in development, and they define a stability opt-in: an instrumentation
keeps emitting what it emitted before by default, and emits the latest experimental version
(only) when ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``. robot-lab
therefore keeps its span names (``llm.call``, ``tool.call``, ``robot.run``: dashboards and
queries use them) and adds the deprecated ``gen_ai.system`` beside ``gen_ai.provider.name``
by default; with the opt-in the spans are named as the conventions say (``chat {model}``,
``execute_tool {tool}``, ``invoke_agent {robot}``) and ``gen_ai.system`` is gone. Every
other attribute is the same in both (docs/observability.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from robot_lab.errors import ConfigurationError, InferenceError

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # deprecated name of PROVIDER (conventions v1.36 and before)
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_TYPE = "gen_ai.tool.type"
AGENT_NAME = "gen_ai.agent.name"
AGENT_DESCRIPTION = "gen_ai.agent.description"
CONVERSATION_ID = "gen_ai.conversation.id"
ERROR_TYPE = "error.type"

CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
INVOKE_AGENT = "invoke_agent"

OPT_IN_VARIABLE = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST = "gen_ai_latest_experimental"

# litellm's provider (the prefix of ``provider/model``, or a robot's ``provider``) -> the
# conventions' well-known gen_ai.provider.name; any other provider keeps litellm's name.
_PROVIDERS = {
    "openai": "openai", "text-completion-openai": "openai", "anthropic": "anthropic",
    "azure": "azure.ai.openai", "azure_text": "azure.ai.openai", "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock", "bedrock_converse": "aws.bedrock", "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai", "gemini": "gcp.gemini", "cohere": "cohere", "cohere_chat": "cohere",
    "mistral": "mistral_ai", "groq": "groq", "deepseek": "deepseek", "xai": "x_ai", "perplexity": "perplexity",
    "watsonx": "ibm.watsonx.ai",
}
# robot parameter -> request attribute
_REQUEST_PARAMS = {
    "temperature": REQUEST_TEMPERATURE, "max_tokens": REQUEST_MAX_TOKENS, "top_p": REQUEST_TOP_P,
    "top_k": REQUEST_TOP_K, "presence_penalty": REQUEST_PRESENCE_PENALTY,
    "frequency_penalty": REQUEST_FREQUENCY_PENALTY,
}
OTHER = "_OTHER"  # the conventions' value when nothing better is known


def latest() -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest experimental GenAI
    conventions (read at each span: a test or an application may set it late)."""
    values = os.environ.get(OPT_IN_VARIABLE, "")
    return LATEST in {v.strip().lower() for v in values.split(",")}


def span_name(legacy: str, operation: str, subject: str | None) -> str:
    """``{operation} {subject}`` with the opt-in (``{operation}`` without a subject), else
    robot-lab's own name ``legacy``."""
    if not latest():
        return legacy
    return f"{operation} {subject}" if subject else operation


def provider_name(model: str | None, provider: str | None = None) -> str:
    """gen_ai.provider.name of a call to ``model`` (with the robot's ``provider`` for a bare
    model name): the conventions' value for a provider they list, litellm's provider name
    otherwise (``ollama``, ``openrouter``, ``scripted``), ``_OTHER`` when nobody can tell."""
    model = model or ""
    name = provider or (model.split("/", 1)[0] if "/" in model else None)
    if name is None and model:
        litellm = sys.modules.get("litellm")  # never imported here: loaded by any call that needs it
        try:
            name = litellm.get_llm_provider(model)[1] if litellm is not None else None
        except Exception:  # litellm cannot tell (an unknown bare name): the call fails anyway
            name = None
    return _PROVIDERS.get(name, name) if name else OTHER


def provider_attributes(model: str | None, provider: str | None = None) -> dict[str, Any]:
    """The provider attribute, and its deprecated twin ``gen_ai.system`` without the opt-in."""
    name = provider_name(model, provider)
    return {PROVIDER: name} if latest() else {PROVIDER: name, SYSTEM: name}


def request_attributes(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """gen_ai.request.* of the parameters a robot sends (temperature, max_tokens, ...)."""
    params = params or {}
    attributes = {key: params[name] for name, key in _REQUEST_PARAMS.items() if params.get(name) is not None}
    stop = params.get("stop")
    if stop:
        attributes[REQUEST_STOP_SEQUENCES] = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    return attributes


def response_attributes(response: Any) -> dict[str, Any]:
    """gen_ai.response.* and gen_ai.usage.* of an LLMResponse (what it knows)."""
    attributes: dict[str, Any] = {USAGE_INPUT_TOKENS: response.input_tokens,
                                  USAGE_OUTPUT_TOKENS: response.output_tokens}
    if response.model:
        attributes[RESPONSE_MODEL] = response.model
    if response.finish_reason:
        attributes[RESPONSE_FINISH_REASONS] = [response.finish_reason]
    return attributes


def error_type(exc: BaseException) -> str:
    """error.type of a failure: the exception's class name. robot-lab's own wrapper of a
    provider error (the gateway raises InferenceError / ConfigurationError *from* litellm's
    exception) says nothing about the class of failure, so the wrapped exception names it
    (``RateLimitError``, ``AuthenticationError``, ``Timeout``), as the conventions allow."""
    cause = exc.__cause__
    if isinstance(exc, (InferenceError, ConfigurationError)) and cause is not None \
            and not isinstance(cause, (InferenceError, ConfigurationError)):
        exc = cause
    return type(exc).__qualname__
