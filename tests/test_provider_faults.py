"""The provider path through litellm's real ``openai/`` (and ``anthropic/``) provider against
the project's fault-injecting wire server (tests/fault_server.py): how many requests a failing
call makes, Retry-After, the call deadline, no repeated streamed text, bad tool arguments,
missing usage, empty choices, ``finish_reason: "length"``, per-robot endpoints and the CLI."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from robot_lab.errors import ConfigurationError, InferenceError, RemoteError, retryable
from robot_lab.outage import caused_by_outage
from robot_lab.llm.gateway import LLMGateway
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool
from tests.fault_server import REPLY, FaultServer
from tests.provider_servers import faults, model_requests  # noqa: F401 - fixtures
from tests.worker_procs import processes  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("model_requests")
MODEL = "openai/fault"
HI = [{"role": "user", "content": "hi"}]


class Sleeps:
    """A gateway's sleep that records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def gateway(**kwargs: Any) -> tuple[LLMGateway, Sleeps]:
    sleeps = Sleeps()
    options: dict[str, Any] = {"max_retries": 2, "retry_interval": 0.01, "randomness": 0.0, **kwargs}
    return LLMGateway(sleep=sleeps, **options), sleeps


def call(gw: LLMGateway, base: str, *, stream: bool = False, **kwargs: Any) -> Any:
    chunks: list[str] = []
    on_chunk = (lambda c: chunks.append(c.content)) if stream else None
    response = gw.complete(MODEL, HI, params={"api_base": base, "api_key": "k"}, on_chunk=on_chunk, **kwargs)
    return response, chunks


# --- one retry policy -------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["500", "429:0"])
def test_a_persistent_failure_makes_one_plus_max_retries_requests(faults: FaultServer, fault: str) -> None:
    """litellm's own client retries are off: 2 retries are 3 requests, not 3 x 3."""
    base = faults.scenario(fault)
    gw, _ = gateway()
    with pytest.raises(InferenceError, match="after 3 attempts") as caught:
        call(gw, base)
    assert faults.count(base) == 3
    assert retryable(caught.value) is False  # a task or a message does not multiply them again


def test_a_transient_failure_is_retried_and_succeeds(faults: FaultServer) -> None:
    base = faults.scenario("500", "500", "ok")
    gw, sleeps = gateway()
    response, _ = call(gw, base)
    assert response.content == REPLY and faults.count(base) == 3 and len(sleeps.waits) == 2


def test_retry_after_is_honoured(faults: FaultServer) -> None:
    base = faults.scenario("429:2", "ok")
    gw, sleeps = gateway()
    response, _ = call(gw, base)
    assert response.content == REPLY
    assert sleeps.waits and sleeps.waits[0] >= 2.0  # the provider's wait, not the 0.01 s backoff


def test_a_retry_after_past_the_deadline_ends_the_call_at_once(faults: FaultServer) -> None:
    base = faults.scenario("429:60")
    gw, sleeps = gateway(deadline=5.0)
    with pytest.raises(InferenceError, match="deadline"):
        call(gw, base)
    assert faults.count(base) == 1 and sleeps.waits == []


def test_a_hung_server_is_bounded_by_the_call_deadline(faults: FaultServer) -> None:
    """Each request times out after ``timeout``; the whole call after ``deadline``."""
    base = faults.scenario("hang:30")
    gw = LLMGateway(max_retries=50, retry_interval=0.01, randomness=0.0, timeout=0.3, deadline=1.0)
    with pytest.raises(InferenceError) as caught:
        call(gw, base)
    assert 1 <= faults.count(base) <= 4  # 50 retries allowed; the deadline stops them
    assert "deadline" in str(caught.value) or "attempts" in str(caught.value)


def test_a_trickling_stream_is_stopped_at_the_deadline(faults: FaultServer) -> None:
    """Every part comes within the request timeout, the whole reply does not."""
    base = faults.scenario("trickle")
    gw = LLMGateway(max_retries=3, timeout=5.0, deadline=0.5)
    chunks: list[str] = []
    with pytest.raises(InferenceError, match="deadline"):
        gw.complete(MODEL, HI, params={"api_base": base, "api_key": "k"}, on_chunk=lambda c: chunks.append(c.content))
    assert faults.count(base) == 1 and 0 < len(chunks) < 4


def test_the_async_call_has_the_same_policy(faults: FaultServer) -> None:
    async def slept(seconds: float) -> None:
        waits.append(seconds)

    waits: list[float] = []
    failing, limited, hung = faults.scenario("500"), faults.scenario("429:2", "ok"), faults.scenario("hang:30")
    gw = LLMGateway(max_retries=2, retry_interval=0.01, randomness=0.0, async_sleep=slept)
    with pytest.raises(InferenceError, match="after 3 attempts"):
        asyncio.run(gw.acomplete(MODEL, HI, params={"api_base": failing, "api_key": "k"}))
    assert faults.count(failing) == 3
    waits.clear()
    assert asyncio.run(gw.acomplete(MODEL, HI, params={"api_base": limited, "api_key": "k"})).content == REPLY
    assert waits[0] >= 2.0
    gw = LLMGateway(max_retries=50, timeout=10.0, deadline=0.5)
    with pytest.raises(InferenceError, match="deadline"):
        asyncio.run(gw.acomplete(MODEL, HI, params={"api_base": hung, "api_key": "k"}))
    assert faults.count(hung) == 1


def test_a_provider_timeout_is_not_a_redis_outage(faults: FaultServer) -> None:
    """httpx's read timeout wraps the builtin TimeoutError: still not Redis being away."""
    base = faults.scenario("hang:30")
    gw, _ = gateway(max_retries=0, timeout=0.2)
    with pytest.raises(InferenceError) as caught:
        call(gw, base)
    chain = []
    current: BaseException | None = caught.value
    while current is not None and len(chain) < 20:
        chain.append(type(current))
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__
    assert TimeoutError in {cls for t in chain for cls in t.__mro__}  # the chain that fooled the check
    assert not caused_by_outage(caught.value)


def test_the_anthropic_format_gets_the_same_policy(faults: FaultServer) -> None:
    base = faults.scenario("500", "ok").removesuffix("/v1")
    gw, _ = gateway()
    response = gw.complete("anthropic/claude-fault", HI, params={"api_base": base, "api_key": "k"})
    assert response.content == REPLY and faults.count(base + "/v1") == 2


# --- streams ------------------------------------------------------------------------------------
def test_a_stream_cut_after_text_is_not_retried(faults: FaultServer) -> None:
    """The text reached the consumer once; a retry would have printed it again."""
    base = faults.scenario("cut", "ok")
    gw, _ = gateway()
    with pytest.raises(InferenceError, match="not retried"):
        call(gw, base, stream=True)
    assert faults.count(base) == 1


def test_a_stream_failing_before_any_text_is_retried(faults: FaultServer) -> None:
    base = faults.scenario("500", "ok")
    gw, _ = gateway()
    chunks: list[str] = []
    gw.complete(MODEL, HI, params={"api_base": base, "api_key": "k"}, on_chunk=lambda c: chunks.append(c.content))
    assert "".join(chunks) == REPLY and faults.count(base) == 2


def test_robot_run_and_astream_show_a_cut_reply_once(faults: FaultServer) -> None:
    base = faults.scenario("cut", "ok", "ok")
    robot = build("cutter", model=MODEL, api_base=base)
    seen: list[str] = []
    result = robot.run_safely("hi", on_content=lambda c: seen.append(c.content))
    assert "".join(seen) == "the quick" and result.error and faults.count(base) == 1

    base = faults.scenario("cut", "ok", "ok")
    robot = build("cutter2", model=MODEL, api_base=base)

    async def consume() -> str:
        stream = robot.astream("hi")
        text = ""
        with pytest.raises(InferenceError):
            async for chunk in stream:
                text += chunk.content
        return text

    assert asyncio.run(consume()) == "the quick" and faults.count(base) == 1


def test_the_cli_prints_a_cut_reply_once(faults: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.cli import main

    base = faults.scenario("cut", "ok")
    monkeypatch.setenv("ROBOT_LAB_ENDPOINTS", json.dumps({MODEL: {"api_base": base}}))
    result = CliRunner().invoke(main, ["chat", "-m", MODEL, "hi"])
    assert result.exit_code == 1
    assert result.stdout.count("the quick") == 1 and "brown" not in result.stdout
    assert faults.count(base) == 1


def test_the_cli_says_a_retry_in_one_plain_line(faults: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without -v: one plain line on stderr, no JSON log line in the reply."""
    from robot_lab.cli import main

    base = faults.scenario("500", "ok")
    monkeypatch.setenv("ROBOT_LAB_ENDPOINTS", json.dumps({MODEL: {"api_base": base}}))
    result = CliRunner().invoke(main, ["chat", "-m", MODEL, "hi"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(REPLY)
    retry_lines = [line for line in result.stderr.splitlines() if "retrying" in line]
    assert len(retry_lines) == 1 and retry_lines[0].startswith("robot-lab: ")
    assert not [line for line in result.stderr.splitlines() if line.lstrip().startswith("{")]


# --- odd answers --------------------------------------------------------------------------------
CALLS: list[dict[str, Any]] = []


@tool
def lookup(query: str = "default") -> str:
    """Look something up."""
    CALLS.append({"query": query})
    return f"found {query}"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_arguments_that_are_not_json_never_run_the_tool(faults: FaultServer, stream: bool) -> None:
    CALLS.clear()
    base = faults.scenario("bad_args", "text")
    robot = build("argy", model=MODEL, api_base=base, local_tools=[lookup])
    result = robot.run("find it", tools="inherit", on_content=(lambda c: None) if stream else None)
    assert CALLS == []  # every parameter has a default: the old code ran it with them
    [tool_result] = result.tool_calls
    assert "not valid JSON" in tool_result.content["error"] and "lookup was not called" in tool_result.content["error"]
    tool_message = next(m for m in robot.messages if m["role"] == "tool")
    assert "not valid JSON" in tool_message["content"]  # the model is told the real cause
    assert result.reply == REPLY


def test_an_unknown_tool_name_is_an_error_text_for_the_model(faults: FaultServer) -> None:
    base = faults.scenario("unknown_tool", "text")
    robot = build("namer", model=MODEL, api_base=base, local_tools=[lookup])
    result = robot.run("find it", tools="inherit")
    assert "not available" in result.tool_calls[0].content["error"] and result.reply == REPLY


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_without_usage_is_estimated_for_budgets(faults: FaultServer, stream: bool) -> None:
    base = faults.scenario("no_usage")
    robot = build("freeloader", model=MODEL, api_base=base, token_budget=2000)
    with capture_logs() as logs:
        result = robot.run("hi", on_content=(lambda c: None) if stream else None)
    assert result.input_tokens > 0 and result.output_tokens > 0
    assert robot.total_input_tokens + robot.total_output_tokens > 0
    if not stream:  # streamed, litellm's stream wrapper counts a missing usage itself
        assert any(entry["event"] == "llm.usage_missing" for entry in logs)


def test_a_token_budget_counts_responses_without_usage(faults: FaultServer) -> None:
    from robot_lab.errors import BudgetExceeded

    base = faults.scenario("no_usage")
    robot = build("spender", model=MODEL, api_base=base, token_budget=60)
    with pytest.raises((BudgetExceeded, InferenceError)):
        for _ in range(10):
            robot.run("hi there, tell me something long")
    assert faults.count(base) < 10


@pytest.mark.parametrize("stream", [False, True])
def test_empty_choices_is_a_clear_error(faults: FaultServer, stream: bool) -> None:
    base = faults.scenario("empty_choices")
    gw, _ = gateway(max_retries=0)
    with pytest.raises(InferenceError, match="no choices|before any reply|before a finish_reason"):
        call(gw, base, stream=stream)


@pytest.mark.parametrize("stream", [False, True])
def test_finish_reason_length_reaches_the_result(faults: FaultServer, stream: bool) -> None:
    base = faults.scenario("length")
    robot = build("cut_short", model=MODEL, api_base=base)
    result = robot.run("hi", on_content=(lambda c: None) if stream else None)
    assert result.reply == REPLY and result.stop_reason == "length"
    assert result.output[-1].stop_reason == "length"
    assert json.loads(json.dumps(result.export(), default=str))["stop_reason"] == "length"


def test_anthropic_max_tokens_is_length(faults: FaultServer) -> None:
    base = faults.scenario("length").removesuffix("/v1")
    robot = build("cut_claude", model="anthropic/claude-fault", api_base=base, api_key="k")
    assert robot.run("hi").stop_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_cost_comes_from_litellms_price_table(faults: FaultServer, stream: bool) -> None:
    """A priced model costs its tokens, streamed or not; an unpriced one costs 0."""
    gw, _ = gateway(max_retries=0)
    on_chunk = (lambda c: None) if stream else None
    for _ in range(2):
        priced = gw.complete("openai/gpt-4o-mini", HI, params={"api_base": faults.scenario("ok"), "api_key": "k"},
                             on_chunk=on_chunk)
        assert priced.cost > 0 and (priced.input_tokens, priced.output_tokens) == (11, 4)
    assert call(gw, faults.scenario("ok"), stream=stream)[0].cost == 0.0


# --- endpoints ---------------------------------------------------------------------------------
def test_two_robots_use_two_servers_without_an_openai_key(faults: FaultServer) -> None:
    first, second = faults.scenario("ok"), faults.scenario("ok")
    a = build("a", model=MODEL, api_base=first)
    b = build("b", model=MODEL, api_base=second)
    assert a.run("hi").reply == REPLY and b.run("hi").reply == REPLY and b.run("hi").reply == REPLY
    assert (faults.count(first), faults.count(second)) == (1, 2)


def test_settings_endpoints_name_a_models_server(faults: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    base = faults.scenario("ok")
    monkeypatch.setenv("ROBOT_LAB_ENDPOINTS", json.dumps({MODEL: {"api_base": base, "api_key": "s3cret"}}))
    robot = build("configured", model=MODEL)
    assert robot.run("hi").reply == REPLY and faults.count(base) == 1
    assert "s3cret" not in repr(build("keyed", model=MODEL, api_key="s3cret").config)


def test_an_environment_key_is_sent_to_a_base_url(faults: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LiteLLM proxy wants the key in OPENAI_API_KEY: no placeholder replaces it."""
    from robot_lab.llm.gateway import litellm_module

    litellm = litellm_module()
    sent: list[str | None] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs.get("api_key"))
        return real(*args, **kwargs)

    real = litellm.completion
    monkeypatch.setattr(litellm, "completion", spy)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proxy")
    base = faults.scenario("ok")
    LLMGateway(max_retries=0).complete(MODEL, HI, params={"api_base": base})
    monkeypatch.delenv("OPENAI_API_KEY")
    LLMGateway(max_retries=0).complete(MODEL, HI, params={"api_base": base})
    assert sent == [None, "no-key"]


def test_chat_takes_an_api_base(faults: FaultServer) -> None:
    from robot_lab.cli import main

    base = faults.scenario("ok")
    result = CliRunner().invoke(main, ["chat", "-m", MODEL, "--api-base", base, "hi"])
    assert result.exit_code == 0 and result.stdout.startswith(REPLY) and faults.count(base) == 1


def test_a_key_by_variable_name_reaches_a_network_task(faults: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task runs a robot rebuilt from its spec (even in this process): ``api_key`` stays
    behind, ``api_key_env`` travels and is read where the call is made."""
    from robot_lab.runtime.robot import Robot

    base = faults.scenario("ok")
    monkeypatch.setenv("FAULT_KEY", "sk-fault")
    robot = build("by-name", model=MODEL, api_base=base, api_key_env="FAULT_KEY")
    rebuilt = Robot.from_spec(robot.to_spec())
    assert rebuilt.config.api_key_env == "FAULT_KEY" and rebuilt.run("hi").reply == REPLY
    assert faults.headers(base)[-1].get("authorization") == "Bearer sk-fault"
    monkeypatch.delenv("FAULT_KEY")
    with pytest.raises(ConfigurationError, match="FAULT_KEY"):
        rebuilt.run("hi")


def test_no_endpoint_and_no_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        LLMGateway().complete(MODEL, HI)


def test_the_api_key_never_crosses_a_process_boundary() -> None:
    robot = build("secretive", model=MODEL, api_base="http://127.0.0.1:1/v1", api_key="s3cret")
    data = robot.config.to_json_dict()
    assert data["api_base"] == "http://127.0.0.1:1/v1" and "api_key" not in data


# --- requests per task and per message, on a real worker ----------------------------------------
@pytest.mark.timeout(300)
def test_a_failing_task_and_message_make_one_calls_requests(faults: FaultServer, real_client: Any,
                                                            real_redis_url: str, key_prefix: str,
                                                            processes: Any) -> None:  # noqa: F811
    """On a ``robot-lab worker`` with max_retries 1: a task on a persistent 500 makes 2
    requests (its ``retries: 2`` do not run the call again), a bus message 2 (no
    redelivery), a task on a hung server 2 (each timing out; not taken for a Redis outage),
    and a task whose stream was cut after text makes 1 and puts that text on the run stream
    once."""
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.bus import Bus
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from tests.worker_procs import VENV_BIN, child_env, uid, wait_for_workers

    task_base, bus_base, cut_base = faults.scenario("500"), faults.scenario("500"), faults.scenario("cut", "ok")
    hang_base, length_base = faults.scenario("hang:30"), faults.scenario("length")
    robots = {name: build(f"{name}-{uid()}", model=MODEL, api_base=base)
              for name, base in (("task", task_base), ("bus", bus_base), ("cut", cut_base), ("hang", hang_base),
                                 ("length", length_base))}
    publish_specs([r.to_spec() for r in robots.values()], connection=real_client)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_ALLOW_MODEL_REQUESTS="1", ROBOT_LAB_MAX_RETRIES="1",
                    ROBOT_LAB_RETRY_INTERVAL="0.01", ROBOT_LAB_REQUEST_TIMEOUT="0.5")
    env.pop("OPENAI_API_KEY", None)
    processes.start([str(VENV_BIN / "robot-lab"), "worker", *(r.name for r in robots.values())], env, "worker")
    try:
        wait_for_workers(real_client, [f"robot:{r.name}" for r in robots.values()])
        net = create_network(f"faulty-{uid()}")
        net.task("fails", robots["task"], retries=2)
        net.task("cut", robots["cut"])
        net.task("hung", robots["hang"], retries=2)
        net.task("short", robots["length"])
        handle = Coordinator(connection=real_client).submit(net, "hi")
        result = handle.wait(timeout=120)
        assert result.context["fails"].error and faults.count(task_base) == 2
        assert result.context["cut"].error and faults.count(cut_base) == 1
        deltas = "".join(e.data.get("delta", "") for _, e in handle.store.events()
                         if e.event == "text.delta" and e.task == "cut")
        assert deltas == "the quick"  # a watcher of the run sees the text once
        # a hung provider is a failed call (2 requests), not a Redis outage re-run as a lost worker
        hung = result.context["hung"]
        assert "InferenceError" in (hung.error or "") and faults.count(hang_base) == 2
        assert not [e for _, e in handle.store.events() if e.event == "task.retrying" and e.task == "hung"]
        # a reply cut at max_tokens says so on the run stream
        [completed] = [e for _, e in handle.store.events() if e.event == "task.completed" and e.task == "short"]
        assert completed.data["stop_reason"] == "length" and completed.data["reply"] == REPLY
        with pytest.raises(RemoteError, match="after 2 attempts"):  # the error reply, dead-lettered at once
            Bus(real_client).request(robots["bus"].name, "hi", timeout=60)
        assert faults.count(bus_base) == 2
    except Exception:
        print(processes.logs())
        raise
