"""The OpenTelemetry GenAI semantic conventions on robot-lab's spans, checked against the
constants of the ``opentelemetry-semantic-conventions`` package: a robot's run is an
``invoke_agent`` span, each model call a ``chat`` span, each tool call an ``execute_tool``
span, with their ``gen_ai.*`` attributes; a failure sets status ERROR and ``error.type``;
``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` names the spans as the
conventions do and drops the deprecated ``gen_ai.system``."""

from __future__ import annotations

import pytest

from robot_lab.llm.gateway import LLMGateway
from robot_lab.observability import genai
from robot_lab.runtime.robot import build

pytest.importorskip("opentelemetry.sdk.trace", reason="the [otel] extra is not installed")
semconv = pytest.importorskip("opentelemetry.semconv._incubating.attributes.gen_ai_attributes",
                              reason="opentelemetry-semantic-conventions is not installed")
from opentelemetry.semconv.attributes import error_attributes  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

GenAI = semconv
Op = semconv.GenAiOperationNameValues
Provider = semconv.GenAiProviderNameValues


@pytest.fixture
def spans(memory_spans, monkeypatch):  # the shared in-memory exporter (tests/conftest.py)
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    return memory_spans


def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


def cancel(order_id: str) -> str:
    """Cancel an order."""
    raise ValueError(f"order {order_id} has shipped")


def finished(spans, name: str) -> list:  # type: ignore[no-untyped-def]
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_every_key_robot_lab_writes_is_the_conventions_own() -> None:
    keys = {
        genai.OPERATION: GenAI.GEN_AI_OPERATION_NAME, genai.PROVIDER: GenAI.GEN_AI_PROVIDER_NAME,
        genai.SYSTEM: GenAI.GEN_AI_SYSTEM, genai.REQUEST_MODEL: GenAI.GEN_AI_REQUEST_MODEL,
        genai.REQUEST_TEMPERATURE: GenAI.GEN_AI_REQUEST_TEMPERATURE,
        genai.REQUEST_MAX_TOKENS: GenAI.GEN_AI_REQUEST_MAX_TOKENS, genai.REQUEST_TOP_P: GenAI.GEN_AI_REQUEST_TOP_P,
        genai.REQUEST_TOP_K: GenAI.GEN_AI_REQUEST_TOP_K,
        genai.REQUEST_PRESENCE_PENALTY: GenAI.GEN_AI_REQUEST_PRESENCE_PENALTY,
        genai.REQUEST_FREQUENCY_PENALTY: GenAI.GEN_AI_REQUEST_FREQUENCY_PENALTY,
        genai.REQUEST_STOP_SEQUENCES: GenAI.GEN_AI_REQUEST_STOP_SEQUENCES,
        genai.RESPONSE_MODEL: GenAI.GEN_AI_RESPONSE_MODEL,
        genai.RESPONSE_FINISH_REASONS: GenAI.GEN_AI_RESPONSE_FINISH_REASONS,
        genai.USAGE_INPUT_TOKENS: GenAI.GEN_AI_USAGE_INPUT_TOKENS,
        genai.USAGE_OUTPUT_TOKENS: GenAI.GEN_AI_USAGE_OUTPUT_TOKENS, genai.TOOL_NAME: GenAI.GEN_AI_TOOL_NAME,
        genai.TOOL_DESCRIPTION: GenAI.GEN_AI_TOOL_DESCRIPTION, genai.TOOL_TYPE: GenAI.GEN_AI_TOOL_TYPE,
        genai.AGENT_NAME: GenAI.GEN_AI_AGENT_NAME, genai.AGENT_DESCRIPTION: GenAI.GEN_AI_AGENT_DESCRIPTION,
        genai.CONVERSATION_ID: GenAI.GEN_AI_CONVERSATION_ID, genai.ERROR_TYPE: error_attributes.ERROR_TYPE,
    }
    assert {ours: theirs for ours, theirs in keys.items() if ours != theirs} == {}
    assert (genai.CHAT, genai.EXECUTE_TOOL, genai.INVOKE_AGENT) == (
        Op.CHAT.value, Op.EXECUTE_TOOL.value, Op.INVOKE_AGENT.value)
    assert genai.OTHER == error_attributes.ErrorTypeValues.OTHER.value
    # a listed provider gets the conventions' value, from litellm's prefix or the robot's provider
    assert genai.provider_name("anthropic/claude-sonnet-4-5") == Provider.ANTHROPIC.value
    assert genai.provider_name("claude-sonnet-4-5", "anthropic") == Provider.ANTHROPIC.value
    assert genai.provider_name("gemini/gemini-2.5-pro") == Provider.GCP_GEMINI.value
    assert genai.provider_name("vertex_ai/gemini-2.5-pro") == Provider.GCP_VERTEX_AI.value
    assert genai.provider_name("bedrock/anthropic.claude-v2") == Provider.AWS_BEDROCK.value
    assert genai.provider_name("azure/my-deployment") == Provider.AZURE_AI_OPENAI.value
    assert genai.provider_name("mistral/mistral-large") == Provider.MISTRAL_AI.value
    assert genai.provider_name("xai/grok-4") == Provider.X_AI.value
    assert genai.provider_name("ollama/llama3") == "ollama"  # not listed: litellm's name
    mapped = {genai.provider_name(f"{p}/m") for p in ("openai", "anthropic", "azure", "azure_ai", "bedrock",
                                                      "vertex_ai", "gemini", "cohere", "mistral", "groq",
                                                      "deepseek", "xai", "perplexity", "watsonx")}
    assert mapped <= {p.value for p in Provider}


def test_a_model_call_is_a_chat_span_with_provider_request_usage_and_response(spans) -> None:
    response = LLMGateway(max_retries=0).complete(
        "scripted/echo", [{"role": "user", "content": "hello"}],
        params={"temperature": 0.2, "max_tokens": 64, "top_p": 0.9, "stop": ["END"]}, provider="openai")
    [chat] = finished(spans, "llm.call")
    attrs = chat.attributes
    assert chat.kind == SpanKind.CLIENT and chat.status.status_code == StatusCode.UNSET
    assert attrs[GenAI.GEN_AI_OPERATION_NAME] == Op.CHAT.value
    assert attrs[GenAI.GEN_AI_PROVIDER_NAME] == Provider.OPENAI.value
    assert attrs[GenAI.GEN_AI_REQUEST_MODEL] == "scripted/echo"
    assert attrs[GenAI.GEN_AI_REQUEST_TEMPERATURE] == 0.2
    assert attrs[GenAI.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert attrs[GenAI.GEN_AI_REQUEST_TOP_P] == 0.9
    assert list(attrs[GenAI.GEN_AI_REQUEST_STOP_SEQUENCES]) == ["END"]
    assert attrs[GenAI.GEN_AI_USAGE_INPUT_TOKENS] == response.input_tokens > 0
    assert attrs[GenAI.GEN_AI_USAGE_OUTPUT_TOKENS] == response.output_tokens > 0
    assert attrs[GenAI.GEN_AI_RESPONSE_MODEL] == response.model
    assert list(attrs[GenAI.GEN_AI_RESPONSE_FINISH_REASONS]) == [response.finish_reason]
    assert error_attributes.ERROR_TYPE not in attrs
    assert attrs["robot_lab.cost"] == 0.0 and attrs["robot_lab.stream"] is False  # robot-lab's own, kept


def test_a_failed_model_call_has_error_type_and_status_error(spans) -> None:
    with pytest.raises(Exception) as raised:
        LLMGateway(max_retries=0).complete("scripted/fail:overloaded", [{"role": "user", "content": "hi"}])
    [chat] = finished(spans, "llm.call")
    assert chat.status.status_code == StatusCode.ERROR
    assert chat.attributes[GenAI.GEN_AI_OPERATION_NAME] == Op.CHAT.value
    assert chat.attributes[GenAI.GEN_AI_PROVIDER_NAME] == "scripted"
    # the provider's error names the failure, not robot-lab's wrapper around it
    provider_error = raised.value.__cause__
    assert provider_error is not None
    assert chat.attributes[error_attributes.ERROR_TYPE] == type(provider_error).__qualname__
    assert GenAI.GEN_AI_USAGE_OUTPUT_TOKENS not in chat.attributes


def test_tool_calls_are_execute_tool_spans_and_a_tool_that_raised_is_marked(spans) -> None:
    robot = build("genai-tools", model="scripted/echo", local_tools=[lookup, cancel])
    result = robot.run("where is my order", tools=["lookup", "cancel"])
    assert "has shipped" in str(result.reply)  # the model still saw the error as text
    tools = {s.attributes["robot_lab.tool"]: s for s in finished(spans, "tool.call")}
    ok, failed = tools["lookup"], tools["cancel"]
    for span, name in ((ok, "lookup"), (failed, "cancel")):
        assert span.kind == SpanKind.INTERNAL
        assert span.attributes[GenAI.GEN_AI_OPERATION_NAME] == Op.EXECUTE_TOOL.value
        assert span.attributes[GenAI.GEN_AI_TOOL_NAME] == name
        assert span.attributes[GenAI.GEN_AI_TOOL_TYPE] == "function"
    assert ok.attributes[GenAI.GEN_AI_TOOL_DESCRIPTION] == "Look up an order."
    assert ok.status.status_code == StatusCode.UNSET and error_attributes.ERROR_TYPE not in ok.attributes
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes[error_attributes.ERROR_TYPE] == "ValueError"
    assert [e.name for e in failed.events] == ["exception"]


def test_a_robot_run_is_an_invoke_agent_span_with_its_model_and_usage(spans) -> None:
    robot = build("genai-agent", model="scripted/echo", description="Answers questions", temperature=0.3)
    result = robot.run("hi", config={"model": "scripted/text:per run"})
    [agent] = finished(spans, "robot.run")
    [chat] = finished(spans, "llm.call")
    attrs = agent.attributes
    assert agent.kind == SpanKind.INTERNAL and chat.parent.span_id == agent.context.span_id
    assert attrs[GenAI.GEN_AI_OPERATION_NAME] == Op.INVOKE_AGENT.value
    assert attrs[GenAI.GEN_AI_AGENT_NAME] == "genai-agent"
    assert attrs[GenAI.GEN_AI_AGENT_DESCRIPTION] == "Answers questions"
    assert attrs[GenAI.GEN_AI_REQUEST_MODEL] == "scripted/text:per run"  # the run's model, not the robot's
    assert attrs[GenAI.GEN_AI_PROVIDER_NAME] == "scripted"
    assert attrs[GenAI.GEN_AI_USAGE_INPUT_TOKENS] == result.input_tokens > 0
    assert attrs[GenAI.GEN_AI_USAGE_OUTPUT_TOKENS] == result.output_tokens > 0
    assert chat.attributes[GenAI.GEN_AI_REQUEST_TEMPERATURE] == 0.3  # the robot's parameter reaches the call
    assert attrs["robot_lab.robot"] == "genai-agent" and "robot_lab.output_tokens" in attrs  # kept


def test_a_run_in_a_conversation_carries_its_id(spans, redis_client) -> None:
    robot = build("genai-talker", model="scripted/echo")
    robot.run("hi", conversation_id="conv-genai")
    agents = finished(spans, "robot.run")
    by_id = {s.context.span_id: s for s in agents}
    [outer] = [s for s in agents if s.parent is None or s.parent.span_id not in by_id]
    assert outer.attributes[GenAI.GEN_AI_CONVERSATION_ID] == "conv-genai"
    assert all(s.attributes[GenAI.GEN_AI_OPERATION_NAME] == Op.INVOKE_AGENT.value for s in agents)


def test_a_failed_robot_run_marks_its_agent_span(spans) -> None:
    robot = build("genai-broken", model="scripted/fail:down", gateway=LLMGateway(max_retries=0))
    with pytest.raises(Exception):
        robot.run("hi")
    [agent] = finished(spans, "robot.run")
    [chat] = finished(spans, "llm.call")
    assert agent.status.status_code == StatusCode.ERROR == chat.status.status_code
    assert agent.attributes[error_attributes.ERROR_TYPE] == chat.attributes[error_attributes.ERROR_TYPE]


def test_default_keeps_robot_lab_names_and_the_opt_in_uses_the_conventions_names(spans, monkeypatch) -> None:
    robot = build("genai-named", model="scripted/echo", local_tools=[lookup])
    robot.run("hi", tools=["lookup"])
    names = {s.name for s in spans.get_finished_spans()}
    assert {"robot.run", "llm.call", "tool.call"} <= names
    assert all(s.attributes[GenAI.GEN_AI_SYSTEM] == "scripted"  # the deprecated twin, for older backends
               for s in finished(spans, "llm.call") + finished(spans, "robot.run"))

    spans.clear()
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
    robot.run("hi again", tools=["lookup"])
    names = {s.name for s in spans.get_finished_spans()}
    assert {"invoke_agent genai-named", "chat scripted/echo", "execute_tool lookup"} <= names
    assert not names & {"robot.run", "llm.call", "tool.call"}
    assert not [s.name for s in spans.get_finished_spans() if GenAI.GEN_AI_SYSTEM in (s.attributes or {})]
    [agent] = finished(spans, "invoke_agent genai-named")
    assert agent.attributes[GenAI.GEN_AI_PROVIDER_NAME] == "scripted"


def test_arun_marks_the_same_spans(spans) -> None:
    import asyncio

    robot = build("genai-async", model="scripted/echo", local_tools=[cancel])
    asyncio.run(robot.arun("cancel it", tools=["cancel"]))
    [agent] = finished(spans, "robot.run")
    [tool] = finished(spans, "tool.call")
    assert agent.attributes[GenAI.GEN_AI_OPERATION_NAME] == Op.INVOKE_AGENT.value
    assert agent.attributes[GenAI.GEN_AI_REQUEST_MODEL] == "scripted/echo"  # set inside the async run
    assert tool.parent.span_id == agent.context.span_id
    assert tool.status.status_code == StatusCode.ERROR and tool.attributes[error_attributes.ERROR_TYPE] == "ValueError"
    assert all(s.attributes[GenAI.GEN_AI_OPERATION_NAME] == Op.CHAT.value for s in finished(spans, "llm.call"))


def test_a_bare_model_name_gets_the_provider_litellm_infers() -> None:
    from robot_lab.llm.gateway import litellm_module

    litellm_module()  # offline-safe; a real call has loaded it by the time its span ends
    assert genai.provider_name("gpt-4o") == Provider.OPENAI.value
    assert genai.provider_name("claude-sonnet-4-5") == Provider.ANTHROPIC.value
    assert genai.provider_name("no-such-model-anywhere") == genai.OTHER
