"""The A2A tier end to end: the SDK's own client against real `robot-lab a2a` processes,
real `robot-lab worker`s and a real Redis. Two servers share one Redis, so every test can
start a task on one and read it on the other."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_lib

from tests.a2a_procs import (
    TOKEN,
    a2a_env,
    sdk_client,
    start_server,
    start_worker,
    user_message,
    wait_for_bus_worker,
    write_app,
)
from tests.worker_procs import Processes, wait_for_workers

pytestmark = [pytest.mark.slow, pytest.mark.real_redis]

COMPLETED = 3  # TaskState.TASK_STATE_COMPLETED


class Stack:
    def __init__(self, url: str, prefix: str, a: str, b: str, procs: Processes) -> None:
        self.url, self.prefix, self.a, self.b, self.procs = url, prefix, a, b, procs
        self.redis = redis_lib.Redis.from_url(url)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from tests.conftest import _forget, _server

    if not _server.url:
        pytest.skip(f"real Redis unavailable: {_server.reason}")
    directory = tmp_path_factory.mktemp("a2a")
    write_app(directory)
    prefix = f"rltest-{uuid.uuid4().hex[:10]}"
    env = a2a_env(_server.url, prefix, directory)
    procs = Processes(directory)
    try:
        start_worker(procs, env, "a2a_app:app", ["echo", "slow"], "worker")
        a = start_server(procs, env, "a2a_app:app", "a2a-one")
        b = start_server(procs, env, "a2a_app:app", "a2a-two")
        stack = Stack(_server.url, prefix, a, b, procs)
        wait_for_bus_worker(stack.redis, prefix, "echo")
        wait_for_workers(stack.redis, ["robot:slow"])
        yield stack
    finally:
        procs.kill_all()
        _forget(prefix)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def collect(stream: Any) -> list[Any]:
    return [item async for item in stream]


def test_cards_are_served_at_the_well_known_path_without_a_token(stack: Stack) -> None:
    card = httpx.get(f"{stack.a}/robots/echo/.well-known/agent-card.json").json()
    assert card["name"] == "echo"
    assert card["description"] == "Echoes what it is told."
    assert card["capabilities"]["streaming"] is True
    assert {"bearer", "apiKey"} <= set(card["securitySchemes"])
    assert card["supportedInterfaces"][0]["url"].endswith("/robots/echo/")
    net = httpx.get(f"{stack.a}/networks/pipeline/.well-known/agent-card.json").json()
    assert [s["name"] for s in net["skills"]] == ["first", "second", "third"]
    index = httpx.get(f"{stack.a}/").json()
    assert {(a["kind"], a["name"]) for a in index["agents"]} == {("robot", "echo"), ("robot", "slow"),
                                                                  ("network", "pipeline")}


def test_message_send_to_a_robot_completes_with_its_reply_and_any_server_gets_it(stack: Stack) -> None:
    async def go() -> None:
        client = await sdk_client(f"{stack.a}/robots/echo", streaming=False)
        [response] = await collect(client.send_message(user_message("hello there")))
        task = response.task
        assert task.status.state == COMPLETED
        assert task.artifacts[0].parts[0].text == "echo: hello there"
        assert task.status.message.parts[0].text == "echo: hello there"
        other = await sdk_client(f"{stack.b}/robots/echo")
        from a2a.types.a2a_pb2 import GetTaskRequest

        again = await other.get_task(GetTaskRequest(id=task.id))
        assert again.status.state == COMPLETED
        assert [m.parts[0].text for m in again.history] == ["hello there", "echo: hello there"]

    run(go())
