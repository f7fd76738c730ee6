"""Robots on a real inference server: llama.cpp's ``llama-server`` with the tiny tool-calling
model (tests/provider_servers.py), through litellm's real ``openai/`` provider over HTTP and
SSE. The model's text is gibberish; its tool calls (grammar-constrained), streaming, usage
and finish reasons are real. One server for the file; skipped when ../shared is absent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from robot_lab.errors import BudgetExceeded, InferenceError
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool
from robot_lab.schemas.messages import TextMessage
from tests.provider_servers import LlamaServer, llama, model_requests  # noqa: F401 - fixtures
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.usefixtures("model_requests")

SEEN: list[int] = []


@tool
def remember(number: int) -> str:
    """Remember a number."""
    SEEN.append(number)
    return f"remembered {number}"


def robot(llama: LlamaServer, name: str = "llama", **kwargs: Any):  # type: ignore[no-untyped-def]
    return build(name, model=llama.model, api_base=llama.base_url, **{"max_tokens": 24, **kwargs})


def test_chat_reports_tokens_and_finish(llama: LlamaServer) -> None:
    result = robot(llama).run("hello")
    assert result.error is None and result.reply
    assert result.input_tokens > 0 and result.output_tokens > 0
    # 24 tokens of gibberish: cut at max_tokens, and the result says so
    assert result.stop_reason in {"stop", "length"}
    assert result.output_tokens <= 24


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_round_trip(llama: LlamaServer, stream: bool) -> None:
    """Streamed, the server sends the arguments one character per chunk."""
    SEEN.clear()
    r = robot(llama, local_tools=[remember], max_tokens=200)  # room for the call's arguments
    result = r.run("remember a number", tools="inherit", on_content=(lambda c: None) if stream else None)
    assert result.error is None
    assert SEEN and all(isinstance(n, int) for n in SEEN)  # arguments the server's grammar produced
    assert [c.tool.name for c in result.tool_calls] == ["remember"] * len(SEEN)
    assert result.tool_calls[0].content == {"data": f"remembered {SEEN[0]}"}
    assert isinstance(result.output[-1], TextMessage)  # the turn after the tool result is text (maybe empty)


def test_streaming_on_content_is_the_reply(llama: LlamaServer) -> None:
    chunks: list[str] = []
    result = robot(llama).run("stream please", on_content=lambda c: chunks.append(c.content))
    assert len(chunks) > 1 and "".join(chunks) == result.reply
    assert result.input_tokens > 0 and result.output_tokens > 0  # stream_options.include_usage


def test_astream_yields_the_reply(llama: LlamaServer) -> None:
    async def consume() -> tuple[str, Any]:
        stream = robot(llama).astream("stream please")
        text = "".join([chunk.content async for chunk in stream])
        return text, await stream.result()

    text, result = asyncio.run(consume())
    assert text and text == result.reply


def test_a_token_budget_stops_real_calls(llama: LlamaServer) -> None:
    r = robot(llama, token_budget=150)
    with pytest.raises((BudgetExceeded, InferenceError), match="[Bb]udget"):
        for _ in range(20):
            r.run("hello again")
    assert 0 < r.total_input_tokens + r.total_output_tokens


def test_twenty_concurrent_aruns(llama: LlamaServer) -> None:
    r = robot(llama)

    async def many() -> list[Any]:
        return await asyncio.gather(*(r.arun(f"hello {i}", conversation_id=f"c{i}") for i in range(20)))

    results = asyncio.run(many())
    assert len(results) == 20 and all(res.error is None and res.output_tokens > 0 for res in results)


@pytest.mark.timeout(300)
def test_a_network_task_and_a_bus_request_on_a_real_worker(llama: LlamaServer, real_client: Any,
                                                           real_redis_url: str, key_prefix: str,
                                                           processes: Any) -> None:  # noqa: F811
    """The same robot served by a ``robot-lab worker``: a network task streams ``text.delta``
    events onto the run stream, and a bus request gets the model's reply."""
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.bus import Bus
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network

    served = robot(llama, f"llama-{uid()}")
    publish_specs([served.to_spec()], connection=real_client)
    env = child_env(real_redis_url, key_prefix, ROBOT_LAB_ALLOW_MODEL_REQUESTS="1")
    env.pop("OPENAI_API_KEY", None)  # a keyless local server needs no dummy key
    processes.start([str(VENV_BIN / "robot-lab"), "worker", served.name], env, "worker")
    try:
        wait_for_workers(real_client, [f"robot:{served.name}"])
        net = create_network(f"net-{uid()}")
        net.task("talk", served)
        handle = Coordinator(connection=real_client).submit(net, "hello over the network")
        result = handle.wait(timeout=120)
        talk = result.context["talk"]
        assert talk.error is None and talk.reply and talk.output_tokens > 0
        deltas = "".join(e.data.get("delta", "") for _, e in handle.store.events() if e.event == "text.delta")
        assert deltas == talk.reply
        reply = Bus(real_client).request(served.name, "hello over the bus", timeout=60)
        assert reply.content and not reply.content.startswith("Error")
    except Exception:
        print(processes.logs())
        raise
