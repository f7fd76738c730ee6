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

from robot_lab.schemas import decode_message

from tests.a2a_procs import (
    OTHER_TOKEN,
    TOKEN,
    a2a_env,
    sdk_client,
    start_server,
    start_worker,
    user_message,
    wait_for_bus_worker,
    write_app,
)
from tests.stopping import stopped
from tests.worker_procs import Processes, wait_for_workers

pytestmark = [pytest.mark.slow, pytest.mark.real_redis]

COMPLETED = 3  # TaskState.TASK_STATE_COMPLETED
SIGNING_KEY = "a2a-tier-signing-key-0123456789"
# the robots take only signed messages and signed task jobs: the tier signs messages as its own
# sender, `a2a`, and the network runs it submits with the coordinator's key
SIGNING_ENV = {"ROBOT_LAB_SIGNING__VERIFY": "require",
               "ROBOT_LAB_SIGNING__KEYS": f'{{"a2a": {{"k1": "{SIGNING_KEY}"}}, "coordinator": {{"c1": "{SIGNING_KEY}-jobs"}}}}'}


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
    env = a2a_env(_server.url, prefix, directory, **SIGNING_ENV)
    procs = Processes(directory)
    try:
        start_worker(procs, env, "a2a_app:app", ["echo", "slow", "asker"], "worker")
        a = start_server(procs, env, "a2a_app:app", "a2a-one")
        b = start_server(procs, env, "a2a_app:app", "a2a-two")
        stack = Stack(_server.url, prefix, a, b, procs)
        wait_for_bus_worker(stack.redis, prefix, "echo")
        wait_for_bus_worker(stack.redis, prefix, "asker")
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
                                                                  ("robot", "asker"), ("network", "pipeline")}


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


def test_message_stream_of_a_robot_is_submitted_then_the_reply_then_completed(stack: Stack) -> None:
    async def go() -> list[Any]:
        client = await sdk_client(f"{stack.b}/robots/echo")
        return await collect(client.send_message(user_message("stream me")))

    events = run(go())
    assert events[0].HasField("task") and events[0].task.status.state == 1  # SUBMITTED
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [c.artifact.parts[0].text for c in chunks] == ["echo: stream me"] and chunks[-1].last_chunk
    assert events[-1].status_update.status.state == COMPLETED


def _steps(events: list[Any]) -> list[str]:
    return [e.status_update.metadata["event"] + ":" + e.status_update.metadata["task"]
            for e in events if e.HasField("status_update") and "task" in e.status_update.metadata]


def test_network_run_streams_in_order_and_a_resubscribe_on_the_other_server_loses_nothing(stack: Stack) -> None:
    from a2a.types.a2a_pb2 import GetTaskRequest, SubscribeToTaskRequest

    async def go() -> tuple[list[Any], list[Any], Any]:
        client = await sdk_client(f"{stack.a}/networks/pipeline")
        first: list[Any] = []
        async for event in client.send_message(user_message("go")):
            first.append(event)
            if _steps(first)[-1:] == ["task.completed:first"]:
                break  # the client goes away mid-run
        await client.close()
        other = await sdk_client(f"{stack.b}/networks/pipeline")
        task_id = first[0].task.id
        rest = await collect(other.subscribe(SubscribeToTaskRequest(id=task_id)))
        final = await other.get_task(GetTaskRequest(id=task_id))
        return first, rest, final

    first, rest, final = run(go())
    assert first[0].task.status.state == 1
    assert _steps(first) == ["task.started:first", "task.completed:first"]
    snapshot = rest[0].task  # the resubscription starts with the task as it stands
    assert [a.artifact_id for a in snapshot.artifacts][:1] == ["first"]
    assert snapshot.artifacts[0].parts[0].text == "echo: go"
    later = _steps(rest)
    # what happened after the snapshot, in order and once each: a tail of the run's steps (on a
    # slow machine the third task may already have started when the subscription begins, and
    # that start is then in the snapshot, not sent again)
    steps = [f"task.{what}:{task}" for task in ("first", "second", "third") for what in ("started", "completed")]
    assert later and later == steps[len(steps) - len(later):], later
    assert "task.started:first" not in later  # what the snapshot holds is not sent again
    assert rest[-1].status_update.status.state == COMPLETED
    assert rest[-1].status_update.status.message.parts[0].text == "echo: echo: echo: go"
    texts = {a.artifact_id: a.parts[0].text for a in final.artifacts}
    assert texts == {"first": "echo: go", "second": "echo: echo: go", "third": "echo: echo: echo: go"}
    assert final.status.state == COMPLETED


def test_cancel_on_one_server_cancels_the_run_and_the_other_sees_it(stack: Stack) -> None:
    from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest

    async def go() -> tuple[Any, Any, str]:
        starter = await sdk_client(f"{stack.a}/networks/pipeline", polling=True, streaming=False)
        [response] = await collect(starter.send_message(user_message("cancel me")))
        canceller = await sdk_client(f"{stack.b}/networks/pipeline")
        cancelled = await canceller.cancel_task(CancelTaskRequest(id=response.task.id))
        await asyncio.sleep(1.5)  # the running task finishes; nothing new starts
        seen = await starter.get_task(GetTaskRequest(id=response.task.id))
        record = stack.redis.hget(f"{stack.prefix}:a2a:task:{response.task.id}", "run_id").decode()
        return cancelled, seen, stack.redis.hget(f"{stack.prefix}:run:{record}", "status").decode()

    cancelled, seen, run_status = run(go())
    assert cancelled.status.state == 5  # CANCELED
    assert seen.status.state == 5
    assert run_status == "cancelled"  # the same as `robot-lab cancel RUN`
    assert "third" not in {a.artifact_id for a in seen.artifacts}


def test_a_cancelled_robot_task_stays_cancelled_when_the_reply_comes(stack: Stack) -> None:
    from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest

    async def go() -> tuple[Any, Any]:
        client = await sdk_client(f"{stack.a}/robots/slow", polling=True, streaming=False)
        [response] = await collect(client.send_message(user_message("too late")))
        cancelled = await client.cancel_task(CancelTaskRequest(id=response.task.id))
        await asyncio.sleep(1.0)  # the robot's reply lands in the task's reply stream meanwhile
        return cancelled, await client.get_task(GetTaskRequest(id=response.task.id))

    cancelled, later = run(go())
    assert cancelled.status.state == 5
    assert later.status.state == 5
    assert not later.artifacts


def _rpc(base: str, body: Any, token: str | None = TOKEN, raw: bytes | None = None,
         version: str | None = "1.0") -> httpx.Response:
    """A JSON-RPC call by hand; ``version=None`` is a 0.3 client (no A2A-Version header)."""
    headers = {"Content-Type": "application/json"}
    if version:
        headers["A2A-Version"] = version
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if raw is not None:
        return httpx.post(base, content=raw, headers=headers, timeout=30)
    return httpx.post(base, json=body, headers=headers, timeout=30)


def test_bad_input_gets_the_spec_error_codes(stack: Stack) -> None:
    url = f"{stack.a}/robots/echo/"
    assert _rpc(url, None, raw=b"{not json").json()["error"]["code"] == -32700
    assert _rpc(url, {"jsonrpc": "1.0", "id": 1, "method": "GetTask"}).json()["error"]["code"] == -32600
    assert _rpc(url, {"jsonrpc": "2.0", "id": 2, "method": "NoSuchMethod", "params": {}}).json()["error"]["code"] == -32601
    unknown = _rpc(url, {"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "nope"}}).json()
    assert unknown["error"]["code"] == -32001 and unknown["id"] == 3
    legacy = _rpc(url, {"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"id": "nope"}},
                  version=None).json()
    assert legacy["error"]["code"] == -32001  # the 0.3 method names are served too
    for token in (None, "wrong"):
        denied = _rpc(url, {"jsonrpc": "2.0", "id": 5, "method": "GetTask", "params": {"id": "x"}}, token=token)
        assert denied.status_code == 401 and "Bearer" in denied.headers["www-authenticate"]
        assert denied.json()["error"]["code"] == -32600
    by_key = httpx.post(url, json={"jsonrpc": "2.0", "id": 6, "method": "GetTask", "params": {"id": "nope"}},
                        headers={"X-API-Key": TOKEN, "A2A-Version": "1.0"})
    assert by_key.json()["error"]["code"] == -32001


def test_legacy_message_send_and_a_finished_task_refuses_more(stack: Stack) -> None:
    url = f"{stack.b}/robots/echo/"
    sent = _rpc(url, {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "kind": "message", "messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": "old school"}]}}},
        version=None).json()
    task = sent["result"]
    assert task["status"]["state"] == "completed" and task["artifacts"][0]["parts"][0]["text"] == "echo: old school"
    again = _rpc(url, {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": task["id"]}},
                 version=None).json()
    assert again["error"]["code"] == -32002  # not cancelable: it is over
    more = _rpc(url, {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": {
        "messageId": "m-2", "role": "ROLE_USER", "taskId": task["id"], "parts": [{"text": "more"}]}}}).json()
    assert more["error"]["code"] == -32004 and task["contextId"] in more["error"]["message"]


def test_tasks_belong_to_the_caller_who_started_them(stack: Stack) -> None:
    async def go() -> str:
        client = await sdk_client(f"{stack.a}/robots/echo", streaming=False)
        [response] = await collect(client.send_message(user_message("mine")))
        return response.task.id

    task_id = run(go())
    get = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
    assert _rpc(f"{stack.b}/robots/echo/", get).json()["result"]["id"] == task_id
    # another caller, with a token of its own, does not see it; nor does another agent's path
    assert _rpc(f"{stack.b}/robots/echo/", get, token=OTHER_TOKEN).json()["error"]["code"] == -32001
    assert _rpc(f"{stack.a}/robots/slow/", get).json()["error"]["code"] == -32001


def test_under_signing_require_the_tier_signs_as_its_own_sender(stack: Stack) -> None:
    """The robots' worker dead-letters unsigned messages; the tier's are signed with the
    `a2a` sender's key, so its tasks complete (the other tests) while a bare publish does not."""
    from robot_lab.bus import Bus
    from robot_lab.keys import Keys
    from tests.redis_server import wait_for

    bus = Bus(stack.redis, keys=Keys(stack.prefix))
    message = bus.publish("echo", "unsigned", from_="intruder")
    dead = wait_for(lambda: [d for d in bus.dead_letters("echo") if d.message_id == message.id], timeout=30)
    assert dead[0].reason == "unauthenticated"

    async def go() -> Any:
        client = await sdk_client(f"{stack.a}/robots/echo", streaming=False)
        [response] = await collect(client.send_message(user_message("signed")))
        return response.task

    assert run(go()).status.state == COMPLETED


def test_a_new_message_in_the_same_context_continues_the_robots_conversation(stack: Stack) -> None:
    import json

    async def go() -> tuple[Any, Any]:
        client = await sdk_client(f"{stack.a}/robots/echo", streaming=False)
        [first] = await collect(client.send_message(user_message("my name is Ada")))
        other = await sdk_client(f"{stack.b}/robots/echo", streaming=False)
        [second] = await collect(other.send_message(user_message("what is my name?",
                                                                 context_id=first.task.context_id)))
        return first.task, second.task

    first, second = run(go())
    assert second.id != first.id and second.context_id == first.context_id
    assert second.status.state == COMPLETED
    # the robot's conversation is the context of its caller (`tester`)
    history = json.loads(stack.redis.get(f"{stack.prefix}:robot:echo:conv:a2a:tester:{first.context_id}"))
    assert [m["content"] for m in history if m["role"] == "user"] == ["my name is Ada", "what is my name?"]


def test_an_a2a_process_killed_mid_task_loses_nothing(stack: Stack, tmp_path: Path) -> None:
    """The task was started on a server that dies (SIGKILL) while the run goes on; the other
    server streams the rest of it and returns the same end."""
    import os
    import signal

    from a2a.types.a2a_pb2 import SubscribeToTaskRequest

    from tests.worker_procs import Processes

    write_app(tmp_path)
    procs = Processes(tmp_path)
    env = a2a_env(stack.url, stack.prefix, tmp_path, **SIGNING_ENV)
    try:
        doomed = start_server(procs, env, "a2a_app:app", "a2a-doomed")

        async def go() -> tuple[str, list[Any]]:
            client = await sdk_client(f"{doomed}/networks/pipeline")
            task_id = ""
            async for event in client.send_message(user_message("survive")):
                task_id = task_id or event.task.id
                if _steps([event]) == ["task.started:first"]:
                    os.killpg(procs.procs[0].pid, signal.SIGKILL)
                    break
            other = await sdk_client(f"{stack.b}/networks/pipeline")
            return task_id, await collect(other.subscribe(SubscribeToTaskRequest(id=task_id)))

        task_id, rest = run(go())
    finally:
        procs.kill_all()
    assert rest[0].task.id == task_id
    assert rest[-1].status_update.status.state == COMPLETED
    assert rest[-1].status_update.status.message.parts[0].text == "echo: echo: echo: survive"


def test_status_lists_the_a2a_processes(stack: Stack) -> None:
    import json
    import subprocess

    from tests.worker_procs import VENV_BIN, child_env

    out = subprocess.run([str(VENV_BIN / "robot-lab"), "status", "--json"], env=child_env(stack.url, stack.prefix),
                         capture_output=True, text=True, timeout=60)
    data = json.loads(out.stdout)
    servers = {s["name"]: s for s in data["a2a"]}
    assert {"a2a-one", "a2a-two"} <= set(servers)  # (a killed one stays listed until its beat expires)
    assert "network/pipeline" in servers["a2a-one"]["agents"]
    table = subprocess.run([str(VENV_BIN / "robot-lab"), "status"], env=child_env(stack.url, stack.prefix),
                           capture_output=True, text=True, timeout=60)
    assert f"A2A a2a-one at {stack.a}" in table.stdout and "network/pipeline" in table.stdout


def test_a_robot_in_a_network_calls_a_remote_a2a_agent_as_a_tool(stack: Stack, tmp_path: Path) -> None:
    """caller (served by its own worker and its own `robot-lab a2a`) is given the echo agent
    of server A as a tool; its network, itself run as an A2A task, gets echo's answer."""
    from tests.a2a_procs import CALLER_MODULE
    from tests.worker_procs import Processes

    (tmp_path / "a2a_caller.py").write_text(CALLER_MODULE.format(
        remote=f"{stack.a}/robots/echo/.well-known/agent-card.json"))
    env = a2a_env(stack.url, stack.prefix, tmp_path, ROBOT_LAB_A2A__CLIENT_TOKENS=f'{{"{stack.a}": "{TOKEN}"}}')
    procs = Processes(tmp_path)
    try:
        start_worker(procs, env, "a2a_caller:app", ["caller"], "caller-worker")
        c = start_server(procs, env, "a2a_caller:app", "a2a-callers")
        wait_for_workers(stack.redis, ["robot:caller"])
        card = httpx.get(f"{c}/robots/caller/.well-known/agent-card.json").json()
        assert [s["name"] for s in card["skills"]] == ["a2a_echo"]  # the remote agent is one of its skills

        async def go() -> Any:
            client = await sdk_client(f"{c}/networks/desk", streaming=False)
            [response] = await collect(client.send_message(user_message("please ask echo")))
            return response.task

        task = run(go())
        assert task.status.state == COMPLETED, procs.logs()
        reply = task.status.message.parts[0].text
        assert "- a2a_echo: echo: a" in reply  # echo's answer to the message the model sent it
    finally:
        procs.kill_all()


INPUT_REQUIRED = 6  # TaskState.TASK_STATE_INPUT_REQUIRED
WORKING = 2


def test_a_served_robot_asks_and_the_answer_given_on_the_other_server_finishes_it(stack: Stack) -> None:
    """The asker robot (a `robot-lab worker`, signing required) asks; the SDK client's stream
    on server A ends input-required with the question; the answer, sent on server B, is
    the tier's signed `answer` envelope: B's stream goes on from the answer to the reply."""
    from a2a.types.a2a_pb2 import GetTaskRequest

    async def go() -> tuple[list[Any], Any, list[Any]]:
        client = await sdk_client(f"{stack.a}/robots/asker")
        asked = await collect(client.send_message(user_message("refund please")))
        task_id, context_id = asked[0].task.id, asked[0].task.context_id
        other = await sdk_client(f"{stack.b}/robots/asker")
        seen = await other.get_task(GetTaskRequest(id=task_id))
        rest = await collect(other.send_message(user_message("B2", task_id=task_id, context_id=context_id)))
        return asked, seen, rest

    asked, seen, rest = run(go())
    last = asked[-1].status_update.status
    assert last.state == INPUT_REQUIRED and last.message.parts[0].text == "Which order? (choices: A1, B2)"
    assert seen.status.state == INPUT_REQUIRED and seen.id == asked[0].task.id
    assert rest[0].task.status.state == WORKING  # the answer's stream starts at the answer, not the question
    assert not [e for e in rest[1:] if e.HasField("status_update") and e.status_update.status.state == INPUT_REQUIRED]
    final = rest[-1].status_update.status
    assert final.state == COMPLETED and final.message.parts[0].text == "refunding - ask_user: B2"
    replies = [decode_message(f[b"envelope"]) for _, f in stack.redis.xrange(
        f"{stack.prefix}:bus:_reply.a2a.{asked[0].task.id}")]
    [answer] = [m for m in replies if m.kind == "answer"]
    assert answer.from_ == "a2a" and answer.signature is not None  # signed as the tier's own sender
    assert [m.kind for m in replies] == ["input_required", "answer", "reply"]
    assert replies[-1].in_reply_to == answer.id


def test_a_network_run_parks_on_a_remote_agents_question_and_resumes_on_another_worker(
        stack: Stack, tmp_path: Path) -> None:
    """asking-caller, a robot in a network, calls the asker agent of server A as a tool; the
    asker asks, so the network task parks with the remote task recorded with its request.
    Its worker is stopped, `robot-lab answer` answers, and a fresh worker resumes the step:
    it sends the answer on to the same remote task and the run ends with its reply."""
    import importlib
    import os
    import signal
    import subprocess
    import sys

    from robot_lab.keys import Keys
    from robot_lab.network import human_input
    from robot_lab.network.coordinator import Coordinator, RunHandle
    from tests.a2a_procs import ASKING_CALLER_MODULE
    from tests.redis_server import wait_for
    from tests.worker_procs import VENV_BIN, Processes, child_env

    (tmp_path / "a2a_asking_caller.py").write_text(ASKING_CALLER_MODULE.format(
        remote=f"{stack.a}/robots/asker/.well-known/agent-card.json"))
    env = a2a_env(stack.url, stack.prefix, tmp_path, ROBOT_LAB_A2A__CLIENT_TOKENS=f'{{"{stack.a}": "{TOKEN}"}}')
    keys = Keys(stack.prefix)
    procs = Processes(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        first = start_worker(procs, env, "a2a_asking_caller:app", ["asking-caller"], "asking-worker-1")
        wait_for_workers(stack.redis, ["robot:asking-caller"])
        network = importlib.import_module("a2a_asking_caller").app.get_network("asking-desk")
        coordinator = Coordinator(stack.redis, keys)
        run_id = coordinator.submit(network, "go").run_id
        pending = wait_for(lambda: human_input.for_run(run_id, stack.redis, keys), timeout=90, interval=0.2)
        [request] = pending
        assert request.question == "Which order? (choices: A1, B2)" and request.request["tool"] == "a2a_asker"
        remote_task = request.request["context"]["a2a_task"]
        assert stack.redis.hget(f"{stack.prefix}:a2a:task:{remote_task}", "agent") == b"robot/asker"
        os.killpg(first.pid, signal.SIGTERM)  # the parked task holds nothing on its worker: another resumes it
        stopped(first)
        start_worker(procs, env, "a2a_asking_caller:app", ["asking-caller"], "asking-worker-2")
        answered = subprocess.run([str(VENV_BIN / "robot-lab"), "answer", run_id, "A1"],
                                  env=child_env(stack.url, stack.prefix), capture_output=True, text=True, timeout=60)
        assert answered.returncode == 0, answered.stderr
        result = RunHandle(coordinator, run_id).wait(timeout=120)
        assert result.status == "completed", procs.logs()
        assert result.reply == "- a2a_asker: refunding - ask_user: A1"
        replies = [decode_message(f[b"envelope"]) for _, f in stack.redis.xrange(
            f"{stack.prefix}:bus:_reply.a2a.{remote_task}")]
        assert [m.kind for m in replies] == ["input_required", "answer", "reply"]  # one remote task, one answer
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("a2a_asking_caller", None)
        procs.kill_all()


def test_a_context_belongs_to_its_caller_another_callers_message_on_it_starts_its_own(stack: Stack) -> None:
    """Caller `other` (its own token) sends a message with `tester`'s contextId while
    `tester`'s conversation waits on the asker's question: it gets a question of its own
    (another request), not `tester`'s; answering it finishes only its own task, and
    `tester` still answers its own question and gets its reply."""
    from a2a.types.a2a_pb2 import GetTaskRequest

    async def go() -> tuple[list[Any], list[Any], list[Any], Any, list[Any]]:
        owner = await sdk_client(f"{stack.a}/robots/asker")
        asked = await collect(owner.send_message(user_message("refund please")))
        task_id, context_id = asked[0].task.id, asked[0].task.context_id
        intruder = await sdk_client(f"{stack.b}/robots/asker", token=OTHER_TOKEN)
        theirs = await collect(intruder.send_message(user_message("what is pending?", context_id=context_id)))
        their_answer = await collect(intruder.send_message(user_message(
            "A1", task_id=theirs[0].task.id, context_id=context_id)))
        still = await owner.get_task(GetTaskRequest(id=task_id))
        mine = await collect(owner.send_message(user_message("B2", task_id=task_id, context_id=context_id)))
        return asked, theirs, their_answer, still, mine

    asked, theirs, their_answer, still, mine = run(go())
    own_request = asked[-1].status_update.metadata["request"]
    assert asked[-1].status_update.status.state == INPUT_REQUIRED
    assert theirs[0].task.context_id == asked[0].task.context_id  # the client's contextId is kept ...
    assert theirs[-1].status_update.status.state == INPUT_REQUIRED
    assert theirs[-1].status_update.metadata["request"] != own_request  # ... but the conversation is its own
    assert their_answer[-1].status_update.status.state == COMPLETED
    assert their_answer[-1].status_update.status.message.parts[0].text == "refunding - ask_user: A1"
    assert still.status.state == INPUT_REQUIRED  # the first caller's question is untouched
    assert mine[-1].status_update.status.state == COMPLETED
    assert mine[-1].status_update.status.message.parts[0].text == "refunding - ask_user: B2"


IDLE_APP_MODULE = '''
from robot_lab import App

app = App("a2aidle", import_path="a2a_idle_app:app")
app.robot("idle", model="scripted/echo", description="Served by no worker: its messages wait.")
'''


def _memory_kb(pid: int, field: str) -> int:
    """A /proc/<pid>/status memory figure (``VmRSS``, ``VmHWM``: the peak RSS), in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_an_oversized_body_is_refused_unread_and_sigterm_still_ends_the_server(stack: Stack, tmp_path: Path) -> None:
    """Bodies over `a2a.max_body_bytes` (default 4 MiB) get HTTP 413 with a JSON-RPC error,
    whether their length is declared or they stream chunked; the server's peak RSS stays
    near where it was (it never holds them); and a SIGTERM ends it while a message/send
    waits on a robot no worker serves (`idle`, of an app of its own)."""
    import os
    import signal
    import threading

    from tests.worker_procs import Processes

    (tmp_path / "a2a_idle_app.py").write_text(IDLE_APP_MODULE)
    procs = Processes(tmp_path)
    env = a2a_env(stack.url, stack.prefix, tmp_path, **SIGNING_ENV)
    big = 48 * 1024 * 1024
    body = (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x", "pad": "'
            + b"a" * big + b'"}}')
    try:
        base = start_server(procs, env, "a2a_idle_app:app", "a2a-body")
        pid = procs.procs[0].pid
        peak_before = _memory_kb(pid, "VmHWM")
        declared = _rpc(f"{base}/robots/idle/", None, raw=body)
        chunked = httpx.post(f"{base}/robots/idle/", timeout=60,
                             content=(body[i:i + 65536] for i in range(0, len(body), 65536)),
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        for refused in (declared, chunked):
            assert refused.status_code == 413, refused.text[:300]
            assert refused.json()["error"]["code"] == -32600 and "a2a.max_body_bytes" in refused.json()["error"]["message"]
        assert "transfer-encoding" not in declared.request.headers and "transfer-encoding" in chunked.request.headers
        grown_mib = (_memory_kb(pid, "VmHWM") - peak_before) / 1024
        assert grown_mib < 40, f"peak RSS grew {grown_mib:.0f} MiB for bodies of {big >> 20} MiB"
        # a body within the limit is served as before
        assert _rpc(f"{base}/robots/idle/", {"jsonrpc": "2.0", "id": 2, "method": "GetTask",
                                             "params": {"id": "nope"}}).json()["error"]["code"] == -32001
        waiting: list[Any] = []

        def wait_on_send() -> None:  # no worker takes it: the request stays in flight
            try:
                waiting.append(_rpc(f"{base}/robots/idle/", {"jsonrpc": "2.0", "id": 3, "method": "SendMessage",
                                    "params": {"message": {"messageId": "m-1", "role": "ROLE_USER",
                                                           "parts": [{"text": "anyone?"}]}}}))
            except httpx.HTTPError as exc:
                waiting.append(exc)

        from robot_lab.bus import Bus
        from robot_lab.keys import Keys

        Bus(stack.redis, keys=Keys(stack.prefix)).register("idle")  # an inbox nobody reads
        sender = threading.Thread(target=wait_on_send, daemon=True)
        sender.start()
        from tests.redis_server import wait_for
        from tests.stopping import stopped

        wait_for(lambda: stack.redis.xlen(f"{stack.prefix}:bus:idle"), timeout=60, interval=0.2)
        os.killpg(pid, signal.SIGTERM)
        stopped(procs.procs[0])  # fails with its log if the request in flight holds the process
        sender.join(60)
        assert waiting and not sender.is_alive()
    finally:
        procs.kill_all()


def test_list_tasks_shows_each_caller_its_own_tasks_filtered_and_paged(stack: Stack) -> None:
    """`ListTasks` (A2A 1.0 section 3.1.4): a caller sees only the tasks it started on the
    agent, filtered by context and state, newest status first, paged by cursor tokens; the
    other caller's task in the same contextId is not among them."""
    url = f"{stack.a}/robots/echo/"
    context = f"ctx-{uuid.uuid4().hex[:8]}"

    def send(text: str, token: str, context_id: str) -> str:
        reply = _rpc(url, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "messageId": uuid.uuid4().hex, "role": "ROLE_USER", "contextId": context_id, "parts": [{"text": text}]}}},
            token=token).json()
        return reply["result"]["task"]["id"]

    def listed(token: str = TOKEN, **params: Any) -> dict[str, Any]:
        reply = _rpc(f"{stack.b}/robots/echo/", {"jsonrpc": "2.0", "id": 2, "method": "ListTasks",
                                                  "params": params}, token=token).json()
        assert "result" in reply, reply
        return reply["result"]

    first = send("one", TOKEN, context)
    second = send("two", TOKEN, context)
    send("elsewhere", TOKEN, f"{context}-other")
    theirs = send("not yours", OTHER_TOKEN, context)
    mine = listed(contextId=context)
    assert [t["id"] for t in mine["tasks"]] == [second, first]  # newest status first
    assert mine["totalSize"] == 2 and mine.get("nextPageToken", "") == ""
    assert all("artifacts" not in t for t in mine["tasks"])  # only with includeArtifacts
    page = listed(contextId=context, pageSize=1)
    assert [t["id"] for t in page["tasks"]] == [second] and page["nextPageToken"]
    rest = listed(contextId=context, pageSize=1, pageToken=page["nextPageToken"])
    assert [t["id"] for t in rest["tasks"]] == [first] and rest.get("nextPageToken", "") == ""
    full = listed(contextId=context, includeArtifacts=True, status="TASK_STATE_COMPLETED")
    assert [t["artifacts"][0]["parts"][0]["text"] for t in full["tasks"]] == ["echo: two", "echo: one"]
    assert not listed(contextId=context, status="TASK_STATE_WORKING").get("tasks")  # all are over
    assert [t["id"] for t in listed(OTHER_TOKEN, contextId=context)["tasks"]] == [theirs]
    bad = _rpc(url, {"jsonrpc": "2.0", "id": 3, "method": "ListTasks", "params": {"pageSize": 101}}).json()
    assert bad["error"]["code"] == -32602


def test_a_part_of_a_media_type_the_card_does_not_accept_refuses_the_whole_message(stack: Stack) -> None:
    """ContentTypeNotSupportedError (-32005): a part whose mediaType is not among the card's
    input modes refuses the message, also with a text part beside it (no task starts); a
    POST that is not JSON gets HTTP 415 with the same code. The card is a 1.0 card."""
    url = f"{stack.a}/robots/echo/"
    context = f"ctx-{uuid.uuid4().hex[:8]}"
    parts = [{"text": "see attached"}, {"raw": "dGNr", "mediaType": "application/x-unsupported", "filename": "x.bin"}]
    refused = _rpc(url, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "m-ct", "role": "ROLE_USER", "contextId": context, "parts": parts}}}).json()
    assert refused["error"]["code"] == -32005 and "application/x-unsupported" in refused["error"]["message"]
    listed = _rpc(url, {"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {"contextId": context}}).json()
    assert not listed["result"].get("tasks")
    as_text = httpx.post(url, content=b"{'jsonrpc': '2.0'}", timeout=30,
                         headers={"Content-Type": "text/plain", "Authorization": f"Bearer {TOKEN}"})
    assert as_text.status_code == 415 and as_text.json()["error"]["code"] == -32005
    card = httpx.get(f"{stack.a}/robots/echo/.well-known/agent-card.json")
    assert not {"url", "preferredTransport", "protocolVersion", "security"} & set(card.json())  # no 0.3 fields
    assert [i["protocolVersion"] for i in card.json()["supportedInterfaces"]] == ["1.0"]
    assert "application/x-unsupported" not in card.json()["defaultInputModes"]
    assert "max-age" in card.headers["cache-control"] and card.headers["last-modified"].endswith("GMT")


def test_a_subscription_to_a_task_waiting_for_input_goes_on_to_its_end(stack: Stack) -> None:
    """SubscribeToTask on an input-required task (A2A 1.0 section 3.1.6: the stream ends at a
    terminal state) follows it past the question: the answer, sent on the other server,
    resumes it and the subscription ends with the reply; the message's own stream still
    ended at the question."""
    from a2a.types.a2a_pb2 import SubscribeToTaskRequest

    async def go() -> tuple[list[Any], list[Any]]:
        client = await sdk_client(f"{stack.a}/robots/asker")
        asked = await collect(client.send_message(user_message("refund please")))
        task_id, context_id = asked[0].task.id, asked[0].task.context_id
        watcher = await sdk_client(f"{stack.a}/robots/asker")
        subscription = watcher.subscribe(SubscribeToTaskRequest(id=task_id)).__aiter__()
        watched = [await subscription.__anext__()]  # subscribed (the task as it stands) before the answer
        answerer = await sdk_client(f"{stack.b}/robots/asker", streaming=False)
        await collect(answerer.send_message(user_message("A1", task_id=task_id, context_id=context_id)))
        return asked, watched + await asyncio.wait_for(collect(subscription), timeout=60)

    asked, watched = run(go())
    assert asked[-1].status_update.status.state == INPUT_REQUIRED
    assert watched[0].task.status.state == INPUT_REQUIRED  # as it stood when it began
    final = watched[-1].status_update.status
    assert final.state == COMPLETED and final.message.parts[0].text == "refunding - ask_user: A1"
