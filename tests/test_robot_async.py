"""The async core: ``Robot.arun`` / ``astream``, ``Bus.apublish`` / ``arequest``,
``Memory.aget(wait=...)`` and ``LLMGateway.acomplete``, run inside one event loop.

No timing thresholds: concurrency is shown by the order of start and end stamps (every run
started before any finished), never by wall time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from robot_lab.bus import Bus, BusPoller
from robot_lab.errors import AwaitTimeout, InferenceError
from robot_lab.memory import Memory
from robot_lab.llm.gateway import LLMGateway
from robot_lab.runtime.rails.hooks import Hook
from robot_lab.runtime.robot import Robot


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def slow_double(x: int) -> int:
    """Double x, after yielding to the loop."""
    await asyncio.sleep(0.01)
    return 2 * x


async def timed(coro: Any, stamps: list[tuple[str, float]], name: str) -> Any:
    stamps.append((f"start:{name}", time.monotonic()))
    result = await coro
    stamps.append((f"end:{name}", time.monotonic()))
    return result


def overlapped(stamps: list[tuple[str, float]]) -> bool:
    """Every run started before the first one ended."""
    order = [label for label, _ in sorted(stamps, key=lambda s: s[1])]
    first_end = next(i for i, label in enumerate(order) if label.startswith("end:"))
    return sum(label.startswith("start:") for label in order[:first_end]) == len(stamps) // 2


def test_arun_gives_the_same_result_as_run() -> None:
    sync = Robot("calc", model="scripted/echo", local_tools=[add]).run("sum it", tools="inherit")
    result = asyncio.run(Robot("calc", model="scripted/echo", local_tools=[add]).arun("sum it", tools="inherit"))
    assert result.reply == sync.reply and "- add: 0" in result.reply
    assert (result.input_tokens, result.output_tokens) == (sync.input_tokens, sync.output_tokens)
    assert [t.tool.name for t in result.tool_calls] == ["add"]


def test_concurrent_aruns_on_one_loop_overlap() -> None:
    robots = [Robot(f"r{i}", model="scripted/sleep:300") for i in range(10)]
    stamps: list[tuple[str, float]] = []

    async def main() -> list[Any]:
        return await asyncio.gather(*(timed(r.arun(f"hello {i}"), stamps, r.name) for i, r in enumerate(robots)))

    results = asyncio.run(main())
    assert [r.reply for r in results] == [f"echo: hello {i}" for i in range(10)]
    assert overlapped(stamps)


def test_sync_runs_do_not_overlap_which_is_what_the_stamps_detect() -> None:
    """The check above is meaningful: runs that block the loop never overlap."""
    robots = [Robot(f"s{i}", model="scripted/sleep:50") for i in range(3)]
    stamps: list[tuple[str, float]] = []

    async def blocking(robot: Robot) -> Any:
        return robot.run("hi")

    async def main() -> None:
        await asyncio.gather(*(timed(blocking(r), stamps, r.name) for r in robots))

    asyncio.run(main())
    assert not overlapped(stamps)


def test_one_robot_many_conversations_at_once_keep_their_own_history() -> None:
    robot = Robot("desk", model="scripted/sleep:100", system_prompt="be brief")
    stamps: list[tuple[str, float]] = []

    async def main() -> None:
        await asyncio.gather(*(timed(robot.arun(f"first {i}", conversation_id=f"c{i}"), stamps, str(i))
                               for i in range(5)))
        await asyncio.gather(*(robot.arun(f"second {i}", conversation_id=f"c{i}") for i in range(5)))

    asyncio.run(main())
    assert overlapped(stamps)
    from robot_lab.runtime.conversations import ConversationStore

    for i in range(5):
        history = ConversationStore().load("desk", f"c{i}")
        assert [m["content"] for m in history if m["role"] == "user"] == [f"first {i}", f"second {i}"]
    assert [m["role"] for m in robot.messages] == ["system"]  # the default conversation is untouched


def test_async_and_sync_tools_on_both_paths() -> None:
    robot = Robot("mixed", model="scripted/echo", local_tools=[add, slow_double])
    sync = robot.run("go", tools="inherit")
    robot.clear_messages()
    result = asyncio.run(robot.arun("go", tools="inherit"))
    assert "- slow_double: 0" in result.reply and "- add: 0" in result.reply
    assert result.reply == sync.reply


def test_sync_run_with_an_async_tool_inside_a_running_loop() -> None:
    robot = Robot("mixed", model="scripted/echo", local_tools=[slow_double])

    async def main() -> str:
        return robot.run("go", tools="inherit").reply  # blocks this loop: the tool gets its own

    assert "- slow_double: 0" in asyncio.run(main())


def test_astream_yields_the_chunks_then_the_result() -> None:
    seen: list[str] = []
    robot = Robot("talker", model="scripted/text:one two three", on_content=lambda c: seen.append(c.content))

    async def main() -> tuple[list[str], str]:
        stream = robot.astream("hi")
        chunks = [chunk.content async for chunk in stream]
        return chunks, (await stream.result()).reply

    chunks, reply = asyncio.run(main())
    assert chunks == ["one ", "two ", "three"] and "".join(chunks) == reply == "one two three"
    assert seen == chunks  # the stored on_content still fires


def test_astream_raises_the_runs_error() -> None:
    robot = Robot("broken", model="scripted/fail:down", gateway=LLMGateway(max_retries=0))

    async def main() -> None:
        async for _ in robot.astream("hi"):
            pass

    with pytest.raises(InferenceError, match="down"):
        asyncio.run(main())


class Around(Hook):
    calls: list[str] = []

    @classmethod
    def around_run(cls, ctx: Any, call_next: Any) -> Any:
        cls.calls.append(f"before:{ctx.request}")
        result = call_next()
        cls.calls.append(f"after:{result.reply}")
        return result

    @classmethod
    def after_tool_call(cls, ctx: Any) -> None:
        cls.calls.append(f"tool:{ctx.tool_name}")


def test_hooks_fire_on_the_async_path_around_included() -> None:
    Around.calls = []
    robot = Robot("hooked", model="scripted/echo", local_tools=[add], hooks=[Around])
    result = asyncio.run(robot.arun("x", tools="inherit"))
    assert Around.calls == ["before:x", "tool:add", f"after:{result.reply}"]


def test_budgets_hold_on_the_async_path() -> None:
    robot = Robot("thrifty", model="scripted/echo", token_budget=1)
    with pytest.raises(InferenceError, match="Token budget exceeded"):
        asyncio.run(robot.arun("a long enough message to spend the budget"))


def test_acomplete_retries_with_the_async_sleep() -> None:
    delays: list[float] = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    gateway = LLMGateway(max_retries=2, retry_interval=1.0, backoff_factor=2.0, randomness=0.0, async_sleep=record)
    with pytest.raises(InferenceError, match="scripted failure"):
        asyncio.run(gateway.acomplete("scripted/fail", [{"role": "user", "content": "x"}]))
    assert delays == [1.0, 2.0]


def test_asyncio_clients_share_the_embedded_server() -> None:
    memory = Memory("shared-embedded")
    memory.set("answer", 42)

    async def main() -> tuple[Any, Any]:
        bus = Bus()
        bus.register("inbox-x")
        sent = await bus.apublish("inbox-x", "hello")
        return await memory.aget("answer"), (sent, bus)

    value, (sent, bus) = asyncio.run(main())
    assert value == 42
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("inbox-x"))
    assert sent.id.encode() in fields[b"envelope"]


def test_apublish_and_arequest_against_a_serving_poller(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client)
    robot = Robot("billing", model="scripted/sleep:100")
    robot.run("warm up")  # litellm's import happens here, not inside the request timeouts
    poller = BusPoller("billing", bus, block_ms=50, retry_delay=0, consumer="c1").serve(robot)

    async def main() -> tuple[list[str], Any]:
        replies = await asyncio.gather(*(bus.arequest("billing", f"q{i}", timeout=30, conversation_id=f"k{i}")
                                         for i in range(3)))
        note = await bus.apublish("billing", "fire and forget", conversation_id="k9")
        return [r.content for r in replies], note

    with poller:
        contents, note = asyncio.run(main())
    assert contents == [f"echo: q{i}" for i in range(3)]
    assert note.to == "billing" and note.headers.get("traceparent")
    assert not list(redis_client.scan_iter(match=f"{bus.keys.prefix}:bus:_reply.*"))


def test_arequest_times_out_and_refuses_unknown_robots(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client)
    bus.register("silent")
    from robot_lab.errors import BusError

    async def main() -> None:
        with pytest.raises(AwaitTimeout, match="no reply from robot 'silent' within 0.2 s"):
            await bus.arequest("silent", "anyone?", timeout=0.2)
        with pytest.raises(BusError, match="Unknown channel"):
            await bus.apublish("nobody", "hi")

    asyncio.run(main())


def test_memory_aget_waits_without_blocking_the_loop(redis_client) -> None:  # type: ignore[no-untyped-def]
    memory = Memory("async-wait", redis=redis_client)
    writer_may_go = threading.Event()

    def writer() -> None:
        writer_may_go.wait(10)
        memory.set("ready", {"ok": True})

    async def main() -> tuple[Any, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                if ticks == 3:
                    writer_may_go.set()  # the write comes only once the loop proved it was free
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        try:
            value = await memory.aget("ready", wait=20)
        finally:
            task.cancel()
        return value, ticks

    thread = threading.Thread(target=writer)
    thread.start()
    value, ticks = asyncio.run(main())
    thread.join()
    assert value == {"ok": True} and ticks >= 3

    async def timeout() -> None:
        with pytest.raises(AwaitTimeout, match=r"Timeout waiting for :never after 0.2 seconds"):
            await memory.aget("never", wait=0.2)
        assert await memory.aget("ready", "absent") == {"ready": {"ok": True}, "absent": None}

    asyncio.run(timeout())
    memory.close()


def test_a_starlette_handler_awaits_arun_and_arequest(redis_client) -> None:  # type: ignore[no-untyped-def]
    """What docs/async.md shows with FastAPI, on Starlette (what FastAPI is built on)."""
    httpx = pytest.importorskip("httpx")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    bus = Bus(redis_client)
    helper = Robot("helper", model="scripted/echo")
    poller = BusPoller("billing", bus, block_ms=50, retry_delay=0, consumer="c1").serve(
        Robot("billing", model="scripted/text:paid"))

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        result = await helper.arun(body["message"], conversation_id=body["session"])
        reply = await bus.arequest("billing", body["message"], timeout=30)
        return JSONResponse({"helper": result.reply, "billing": reply.content})

    app = Starlette(routes=[Route("/chat", chat, methods=["POST"])])

    async def main() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(*(client.post("/chat", json={"message": f"m{i}", "session": f"s{i}"})
                                               for i in range(3)))
        return [r.json() for r in responses]

    with poller:
        bodies = asyncio.run(main())
    assert bodies == [{"helper": f"echo: m{i}", "billing": "paid"} for i in range(3)]


def test_aconnect_and_async_twins_reach_the_same_server(real_redis_url: str, key_prefix: str) -> None:
    from robot_lab.connection import aconnect, async_client_for, connect

    sync = connect(real_redis_url)
    sync.set(f"{key_prefix}:k", b"v")

    async def main() -> list[Any]:
        direct = aconnect(real_redis_url)
        twin = async_client_for(sync)
        values = [await direct.get(f"{key_prefix}:k"), await twin.get(f"{key_prefix}:k"),
                  twin is async_client_for(sync)]
        await direct.aclose()
        await twin.aclose()
        return values

    try:
        assert asyncio.run(main()) == [b"v", b"v", True]
    finally:
        sync.delete(f"{key_prefix}:k")
        sync.close()


def test_arun_is_traced_like_run(memory_spans) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(Robot("traced", model="scripted/echo", local_tools=[add]).arun("x", tools="inherit"))
    spans = {s.name: s for s in memory_spans.get_finished_spans()}
    assert {"robot.run", "llm.call", "tool.call"} <= set(spans)
    assert spans["llm.call"].parent.span_id == spans["robot.run"].context.span_id
    assert spans["llm.call"].attributes["gen_ai.usage.output_tokens"] > 0


def test_arequest_signs_and_checks_like_request(redis_client) -> None:  # type: ignore[no-untyped-def]
    """Under verify=require the worker takes the signed apublish, and arequest takes only
    the reply signed by the robot it asked (the same signing as the sync path)."""
    from robot_lab.bus.keyring import Keyring

    keys = {"client": {"c1": "client-key-0001-0123456789abcdef"},
            "billing": {"b1": "billing-key-0001-0123456789abcdef"}}
    bus = Bus(redis_client, keyring=Keyring(keys), verify="require")
    poller = BusPoller("billing", bus, block_ms=50, retry_delay=0, consumer="c1", verify="require").serve(
        Robot("billing", model="scripted/echo"))

    async def main() -> Any:
        return await bus.arequest("billing", "signed question", from_="client", timeout=30)

    with poller:
        reply = asyncio.run(main())
    assert reply.content == "echo: signed question" and reply.headers["key_id"] == "b1"


class HangingGateway:
    """Streams one chunk, then never finishes."""

    async def acomplete(self, model: str, messages: Any, *, on_chunk: Any = None, **kwargs: Any) -> Any:
        from robot_lab.llm.gateway import Chunk

        on_chunk(Chunk(content="first "))
        await asyncio.Event().wait()


def test_leaving_astream_early_cancels_the_run() -> None:
    robot = Robot("chatty", model="scripted/echo", gateway=HangingGateway())  # type: ignore[arg-type]

    async def main() -> tuple[str, bool]:
        async with robot.astream("hi") as stream:
            async for chunk in stream:
                first = chunk.content
                break
        task = stream._task
        assert task is not None
        return first, task.cancelled()

    assert asyncio.run(main()) == ("first ", True)


def test_more_concurrent_arequests_than_redis_pys_pool_default(redis_client) -> None:  # type: ignore[no-untyped-def]
    """Each waiting arequest holds a connection (XREAD BLOCK); redis-py's asyncio pool
    refuses the 101st. robot-lab's asyncio clients use a blocking pool that is larger."""
    bus = Bus(redis_client)
    poller = BusPoller("echo", bus, block_ms=50, retry_delay=0, consumer="c1").respond_to_tasks(
        lambda m: f"re: {m.content}")

    async def main() -> list[Any]:
        replies = await asyncio.gather(*(bus.arequest("echo", f"m{i}", timeout=60) for i in range(120)))
        return [r.content for r in replies]

    with poller:
        assert asyncio.run(main()) == [f"re: m{i}" for i in range(120)]


def test_aruns_on_the_default_conversation_take_turns() -> None:
    """Without a conversation_id, concurrent arun calls share the robot's one history, so
    they run one after another and never interleave their messages."""
    robot = Robot("solo", model="scripted/sleep:50")

    async def main() -> list[str]:
        results = await asyncio.gather(*(robot.arun(f"turn {i}") for i in range(3)))
        return [r.reply for r in results]

    assert asyncio.run(main()) == [f"echo: turn {i}" for i in range(3)]
    assert [(m["role"], m["content"]) for m in robot.messages] == [
        pair for i in range(3) for pair in (("user", f"turn {i}"), ("assistant", f"echo: turn {i}"))]


async def ask_myself(question: str) -> str:
    """Ask the robot that is running (an async tool calling arun on its own robot)."""
    from robot_lab.runtime.robot.context import current_turn

    return (await current_turn().robot.arun(f"inner {question}")).reply


def test_a_nested_arun_of_the_same_robot_does_not_wait_for_itself() -> None:
    from robot_lab.llm.scripted import register_script

    register_script("nested-async-test", {"rules": [{"when": {"contains": "inner"}, "reply": "inner done"}],
                                          "default": {"call_tools": "all", "reply": "outer: {tool_results}"}})
    robot = Robot("selfish", model="scripted/nested-async-test", local_tools=[ask_myself])
    result = asyncio.run(asyncio.wait_for(robot.arun("outer", tools="inherit"), timeout=60))
    assert [t.content for t in result.tool_calls] == [{"data": "inner done"}]
