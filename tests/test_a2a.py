"""The A2A tier in one process: the state seam, the event projection, tokens, the CLI's
errors, the client tool's configuration and failures, and a task waiting for input (the
human-input seam) over the real HTTP app on the embedded Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

pytest.importorskip("a2a")

from a2a.types.a2a_pb2 import TaskState  # noqa: E402

from robot_lab.a2a.states import INPUT_STATUSES, is_interrupted, is_terminal, task_state_for  # noqa: E402
from robot_lab.a2a.task_store import TaskRecord  # noqa: E402
from robot_lab.a2a.tasks import NetworkSource, Projection, RobotSource  # noqa: E402
from robot_lab.keys import Keys  # noqa: E402
from robot_lab.schemas import RobotMessage, RunEvent  # noqa: E402
from tests.ports import free_port  # noqa: E402


def test_robot_lab_states_map_onto_a2a_task_states() -> None:
    assert task_state_for("running") == TaskState.TASK_STATE_WORKING
    assert task_state_for("completed") == TaskState.TASK_STATE_COMPLETED
    assert task_state_for("cancelled") == TaskState.TASK_STATE_CANCELED
    assert task_state_for("failed") == TaskState.TASK_STATE_FAILED
    for parked in INPUT_STATUSES:  # the human-input bridge's statuses
        assert task_state_for(parked) == TaskState.TASK_STATE_INPUT_REQUIRED
    assert is_interrupted(TaskState.TASK_STATE_INPUT_REQUIRED) and not is_terminal(TaskState.TASK_STATE_INPUT_REQUIRED)
    assert is_terminal(TaskState.TASK_STATE_CANCELED) and not is_terminal(TaskState.TASK_STATE_WORKING)


def _record(**kw: Any) -> TaskRecord:
    return TaskRecord(id="t1", agent="network/n", kind="network", target="n", context_id="c1", run_id="r1", **kw)


def test_run_events_become_status_updates_and_one_artifact_per_task() -> None:
    async def reply(run_id: str) -> str:
        return "final answer"

    source = NetworkSource(None, _record(), Keys(), reply)
    projection = Projection(_record())
    events = [
        RunEvent(run_id="r1", event="run.started"),
        RunEvent(run_id="r1", event="task.started", task="a", robot="x"),
        RunEvent(run_id="r1", event="text.delta", task="a", data={"delta": "hel"}),
        RunEvent(run_id="r1", event="text.delta", task="a", data={"delta": "lo"}),
        RunEvent(run_id="r1", event="task.completed", task="a", data={"reply": "hello"}),
        RunEvent(run_id="r1", event="task.completed", task="b", data={"reply": "no deltas"}),
        RunEvent(run_id="r1", event="run.completed"),
    ]

    async def go() -> list[Any]:
        out = []
        for event in events:
            out += await source.apply(projection, event)
        return out

    out = asyncio.run(go())
    chunks = [(e.artifact.artifact_id, e.artifact.parts[0].text, e.append, e.last_chunk)
              for e in out if type(e).__name__ == "TaskArtifactUpdateEvent"]
    assert chunks == [("a", "hel", False, False), ("a", "lo", True, False), ("a", "", True, True),
                      ("b", "no deltas", False, True)]
    assert {a.artifact_id: a.parts[0].text for a in projection.task.artifacts} == {"a": "hello", "b": "no deltas"}
    assert projection.state == TaskState.TASK_STATE_COMPLETED
    assert projection.task.status.message.parts[0].text == "final answer"


def test_a_parked_run_is_input_required_and_the_robot_error_envelope_is_failed() -> None:
    async def reply(run_id: str) -> str | None:
        return None

    projection = Projection(_record())
    asyncio.run(NetworkSource(None, _record(), Keys(), reply).apply(
        projection, RunEvent(run_id="r1", event="run.waiting", data={"question": "which account?"})))
    assert projection.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert projection.task.status.message.parts[0].text == "which account?"

    robot = TaskRecord(id="t2", agent="robot/x", kind="robot", target="x", context_id="c", message_id="m1",
                       reply_stream="_reply.a2a.t2")
    projection = Projection(robot)
    error = RobotMessage(to="_reply.a2a.t2", content="Error: expired: too late", kind="error", in_reply_to="m1",
                         headers={"error": "expired"})
    other = RobotMessage(to="_reply.a2a.t2", content="not mine", kind="reply", in_reply_to="someone-else")
    source = RobotSource(None, robot, Keys())
    assert asyncio.run(source.apply(projection, other)) == []
    [status] = asyncio.run(source.apply(projection, error))
    assert status.status.state == TaskState.TASK_STATE_FAILED and status.metadata["reason"] == "expired"


def test_tokens_come_from_settings_and_a_rotated_secret_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.a2a import auth
    from robot_lab.settings import A2ASettings

    (tmp_path / "ops").write_text("first-secret\n")
    (tmp_path / "..data").mkdir()  # Kubernetes' own entries are not callers
    tokens = auth.Tokens(A2ASettings(tokens={"ci": "ci-secret"}, tokens_dir=str(tmp_path)))
    assert tokens.caller("ci-secret") == "ci" and tokens.caller("first-secret") == "ops"
    assert tokens.caller("nope") is None
    monkeypatch.setattr(auth, "RELOAD_EVERY", 0.0)
    (tmp_path / "ops").write_text("second-secret")
    assert tokens.caller("second-secret") == "ops" and tokens.caller("first-secret") is None
    schemes, requirements = auth.security_fields(A2ASettings(tokens={"ci": "x"}))
    assert set(schemes) == {"bearer", "apiKey"} and len(requirements) == 2
    assert auth.security_fields(A2ASettings(anonymous=True)) == ({}, [])


def _cli(args: list[str], **env: str) -> Any:
    from robot_lab.cli import main

    return CliRunner().invoke(main, ["a2a", *args], env=env)


def test_the_command_refuses_to_start_without_redis_tokens_or_a_known_robot(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.settings import reload_settings

    no_redis = _cli(["--app", "robot_lab.demo:app"])
    assert no_redis.exit_code == 1 and "needs REDIS_URL" in no_redis.output
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing is connected before serving
    reload_settings()
    no_tokens = _cli(["--app", "robot_lab.demo:app"])
    assert no_tokens.exit_code == 1 and "no A2A tokens configured" in no_tokens.output
    assert "Traceback" not in no_tokens.output
    unknown = _cli(["--app", "robot_lab.demo:app", "--robots", "nobody", "--anonymous"])
    assert unknown.exit_code == 1 and "has no robot 'nobody'" in unknown.output and "billing" in unknown.output


def test_agent_tool_entries_are_checked_and_named_from_the_url() -> None:
    from robot_lab import build
    from robot_lab.errors import ConfigurationError
    from robot_lab.runtime.a2a.tool import default_name

    assert default_name("http://h:9292/robots/billing/.well-known/agent-card.json") == "a2a_billing"
    assert default_name("https://agents.example.com") == "a2a_agents_example_com"
    with pytest.raises(ConfigurationError, match="not an http"):
        build("r", a2a_agents=["ftp://x"])
    with pytest.raises(ConfigurationError, match="unknown field"):
        build("r", a2a_agents=[{"url": "http://x/a", "token": "secret-in-a-spec"}])
    with pytest.raises(ConfigurationError, match="both named"):
        build("r", a2a_agents=["http://a/robots/x/", "http://b/robots/x/"])
    robot = build("r", a2a_agents=[{"url": "http://h/robots/x/", "name": "ask_x", "description": "Ask X."}])
    assert [(t.name, t.description) for t in robot.select_tools("inherit")] == [("ask_x", "Ask X.")]
    assert robot.select_tools("none") == []  # offered only when the run asks, like every tool
    spec = robot.to_spec()
    assert msgspec.json.decode(msgspec.json.encode(spec), type=type(spec)).a2a_agents == spec.a2a_agents


def test_an_unreachable_agent_is_a_tool_error_after_the_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab import build
    from robot_lab.runtime.a2a import tool as tool_mod

    monkeypatch.setattr(tool_mod, "RETRY_BASE", 0.01)
    monkeypatch.setenv("ROBOT_LAB_A2A__CLIENT_RETRIES", "2")
    from robot_lab.settings import reload_settings

    reload_settings()
    port = free_port()  # nothing listens there
    robot = build("r", a2a_agents=[f"http://127.0.0.1:{port}/robots/x/.well-known/agent-card.json"])
    [remote] = robot.a2a_tools
    text = remote.call({"message": "hi"})
    assert text.startswith("Error (a2a_x): cannot fetch the agent card of http://127.0.0.1") and "(retryable)" in text


def test_a_message_on_a_task_waiting_for_input_reaches_the_input_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the real HTTP app on the embedded Redis: a network task whose run reports a parked
    status is input-required in tasks/get; a message naming it goes to the bridge, which finds
    no request of that run to answer."""
    from starlette.testclient import TestClient

    from robot_lab.a2a.asgi import build_a2a_app
    from robot_lab.a2a.task_store import TaskStore
    from robot_lab.connection import get_redis
    from robot_lab.demo import app as demo
    from robot_lab.keys import default_keys
    from robot_lab.settings import A2ASettings

    keys = default_keys()
    web = build_a2a_app(demo, base_url="http://testserver", networks=["support"],
                        settings=A2ASettings(tokens={"me": "tok"}), connection=get_redis())
    redis = get_redis()
    redis.xadd(keys.run_events("r-parked"), {"event": msgspec.json.encode(
        RunEvent(run_id="r-parked", event="run.waiting", data={"question": "which order?"}))})

    async def seed() -> None:
        from robot_lab.bus import Bus

        store = TaskStore(Bus(redis, keys=keys), keys, ttl=600)
        await store.create(TaskRecord(id="t-parked", agent="network/support", kind="network", target="support",
                                      context_id="c-1", owner="me", run_id="r-parked"))

    asyncio.run(seed())
    headers = {"Authorization": "Bearer tok", "A2A-Version": "1.0"}
    with TestClient(web) as client:
        got = client.post("/networks/support/", headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "t-parked"}}).json()
        assert got["result"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert got["result"]["status"]["message"]["parts"][0]["text"] == "which order?"
        answer = client.post("/networks/support/", headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {
                "messageId": "m-1", "role": "ROLE_USER", "taskId": "t-parked", "parts": [{"text": "order 42"}]}}}).json()
        # a run that reports a parked status but holds no request: nothing to answer
        assert answer["error"]["code"] == -32004 and "no question waiting" in answer["error"]["message"]
        assert client.get("/networks/support/.well-known/agent-card.json").status_code == 200  # public card
        assert client.post("/networks/support/", json={"jsonrpc": "2.0", "id": 3, "method": "GetTask",
                                                       "params": {"id": "t-parked"}}).status_code == 401


def test_a_parked_network_run_is_input_required_and_the_next_message_answers_it() -> None:
    """The human-input bridge over the real HTTP app on the embedded Redis and embedded
    workers: a task's robot asks (ask_user), the A2A task is input-required with the question,
    the client's next message on the task is the answer, and the run resumes to its end."""
    from starlette.testclient import TestClient

    from robot_lab.a2a.asgi import build_a2a_app
    from robot_lab.app import App
    from robot_lab.connection import get_redis
    from robot_lab.llm.scripted import register_script
    from robot_lab.network.embedded import EmbeddedWorkers
    from robot_lab.settings import A2ASettings

    register_script("a2a-ask", {"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?"}}]}, {"reply": "{tool_results}"}]})
    app = App("a2a-hitl")
    app.robot("a2a-asker", model="scripted/a2a-ask", local_tools=["robot_lab.runtime.durable.human:AskUser"])
    app.network("ask").task("ask", "a2a-asker", tools="inherit")
    redis = get_redis()
    web = build_a2a_app(app, base_url="http://testserver", networks=["ask"],
                        settings=A2ASettings(tokens={"me": "tok"}, send_timeout=30), connection=redis)
    headers = {"Authorization": "Bearer tok", "A2A-Version": "1.0"}

    def send(parts: list[dict[str, str]], task_id: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"messageId": f"m-{len(parts)}-{task_id}", "role": "ROLE_USER", "parts": parts}
        if task_id:
            message["taskId"] = task_id
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        return client.post("/networks/ask/", headers=headers, json=body).json()

    with EmbeddedWorkers(redis, ["a2a-asker"], threads=1), TestClient(web) as client:
        asked = send([{"text": "refund please"}])["result"]["task"]
        assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert asked["status"]["message"]["parts"][0]["text"] == "Which order?"
        done = send([{"text": "A1"}], asked["id"])["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED", done["status"]
        assert done["status"]["message"]["parts"][0]["text"] == "- ask_user: A1"
        again = send([{"text": "B2"}], asked["id"])  # a finished task takes no second answer
        assert again["error"]["code"] == -32004


def _asker_app(name: str, script: str, turns: list[dict[str, Any]], tools: list[str] | None = None) -> Any:
    from robot_lab.app import App
    from robot_lab.llm.scripted import register_script

    register_script(script, {"turns": turns})
    app = App(f"app-{name}")
    app.robot(name, model=f"scripted/{script}", local_tools=["robot_lab.runtime.durable.human:AskUser", *(tools or [])])
    return app


def test_a_served_robot_that_asks_is_input_required_and_the_next_message_answers_it() -> None:
    """Over the real HTTP app, with the robot served by a bus poller: its ``input_required``
    reply is the task's input-required status with the question; the next message on the
    task is an ``answer`` envelope from the tier's sender, recorded as ``a2a:<caller>``; the
    task follows that envelope's id to the robot's final reply. The stream of the answer
    goes on from there; a second answer and an answer to a finished task are -32004."""
    from starlette.testclient import TestClient

    from robot_lab.a2a.asgi import build_a2a_app
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.connection import get_redis
    from robot_lab.inputs import InputStore
    from robot_lab.keys import default_keys
    from robot_lab.settings import A2ASettings

    name = "a2a-desk"
    app = _asker_app(name, "a2a-desk-ask", [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?", "choices": ["A1", "B2"]}}]},
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Why?"}}]},
        {"reply": "refunding {tool_results}"}])
    redis, keys = get_redis(), default_keys()
    web = build_a2a_app(app, base_url="http://testserver", robots=[name],
                        settings=A2ASettings(tokens={"me": "tok", "you": "other"}, send_timeout=30), connection=redis)
    headers = {"Authorization": "Bearer tok", "A2A-Version": "1.0"}

    def rpc(method: str, params: dict[str, Any], token: str = "tok") -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return client.post(f"/robots/{name}/", headers={**headers, "Authorization": f"Bearer {token}"},
                           json=body).json()

    def send(text: str, task_id: str | None = None, token: str = "tok") -> dict[str, Any]:
        message: dict[str, Any] = {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}]}
        if task_id:
            message["taskId"] = task_id
        return rpc("SendMessage", {"message": message}, token)

    poller = BusPoller(name, Bus(redis, keys=keys), block_ms=50, retry_delay=0).serve(app.build_robot(name))
    with poller, TestClient(web) as client:
        asked = send("refund please")["result"]["task"]
        assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert asked["status"]["message"]["parts"][0]["text"] == "Which order? (choices: A1, B2)"
        # only the caller who started the task may answer it; a finished one takes nothing
        assert send("A1", asked["id"], token="other")["error"]["code"] == -32001
        # an answer that is no choice is refused with the reason; the question still waits (the
        # answer "2" below is taken)
        refused = send("7", asked["id"])["error"]
        assert refused["code"] == -32602 and "'7' is not a choice" in refused["message"], refused
        got = rpc("GetTask", {"id": asked["id"]})["result"]
        assert got["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # a blocking send ends at the question
        # the answer streams on from the answer: working, the next question (and nothing before it)
        stream = client.post(f"/robots/{name}/", headers=headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": {"message": {
                "messageId": "m-answer-1", "role": "ROLE_USER", "taskId": asked["id"], "parts": [{"text": "2"}]}}})
        events = [json.loads(line[len("data:"):]) for line in stream.text.splitlines() if line.startswith("data:")]
        states = [e["result"].get("task", e["result"].get("statusUpdate", {})).get("status", {}).get("state")
                  for e in events]
        assert states[0] == "TASK_STATE_WORKING" and states[-1] == "TASK_STATE_INPUT_REQUIRED", states
        assert events[-1]["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"] == "Why?"
        assert "TASK_STATE_INPUT_REQUIRED" not in states[:-1]
        done = send("it arrived broken", asked["id"])["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED", done["status"]
        reply = "refunding - ask_user: B2\n- ask_user: it arrived broken"  # "2" picked the second choice
        assert done["status"]["message"]["parts"][0]["text"] == reply
        assert done["artifacts"][0]["parts"][0]["text"] == reply
        texts = [(m["role"], m["parts"][0]["text"]) for m in done["history"]]
        assert texts == [("ROLE_USER", "refund please"), ("ROLE_AGENT", "Which order? (choices: A1, B2)"),
                         ("ROLE_USER", "2"), ("ROLE_AGENT", "Why?"), ("ROLE_USER", "it arrived broken"),
                         ("ROLE_AGENT", reply)]
        assert send("more", asked["id"])["error"]["code"] == -32004  # over: no more answers
    # the answers were recorded as the caller's, and sent as the tier's own sender
    replies = [msgspec.json.decode(f[b"envelope"]) for _, f in redis.xrange(keys.inbox(f"_reply.a2a.{asked['id']}"))]
    answers = [r for r in replies if r["kind"] == "answer"]
    assert [a["from"] for a in answers] == ["a2a", "a2a"] and [a["content"]["text"] for a in answers] == ["2", "it arrived broken"]
    final = [r for r in replies if r["kind"] == "reply"]
    assert [f["in_reply_to"] for f in final] == [answers[-1]["id"]]  # the final reply answers the last answer
    by = {InputStore(redis, keys).get(a["in_reply_to"]).answer.by for a in answers}
    assert by == {"a2a:me"}


class _RobotTier:
    """A robot served by a bus poller behind the real A2A HTTP app (Starlette's TestClient):
    ``rpc(method, params)`` and ``send(text, task_id=, context_id=)`` as the caller ``me``."""

    def __init__(self, name: str, turns: list[dict[str, Any]], tools: list[str] | None = None) -> None:
        from robot_lab.a2a.asgi import build_a2a_app
        from robot_lab.connection import get_redis
        from robot_lab.keys import default_keys
        from robot_lab.settings import A2ASettings

        self.name = name
        self.app = _asker_app(name, f"{name}-script", turns, tools)
        self.redis, self.keys = get_redis(), default_keys()
        self.web = build_a2a_app(self.app, base_url="http://testserver", robots=[name],
                                 settings=A2ASettings(tokens={"me": "tok"}, send_timeout=30), connection=self.redis)

    def __enter__(self) -> "_RobotTier":
        from starlette.testclient import TestClient

        from robot_lab.bus import Bus, BusPoller

        self.poller = BusPoller(self.name, Bus(self.redis, keys=self.keys), block_ms=50,
                                retry_delay=0).serve(self.app.build_robot(self.name))
        self.poller.__enter__()
        self.client = TestClient(self.web).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.__exit__(*exc)
        self.poller.__exit__(*exc)

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.client.post(f"/robots/{self.name}/", headers={"Authorization": "Bearer tok", "A2A-Version": "1.0"},
                                json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()

    def send(self, text: str, task_id: str = "", context_id: str = "") -> dict[str, Any]:
        message: dict[str, Any] = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}]}
        if task_id:
            message["taskId"] = task_id
        if context_id:
            message["contextId"] = context_id
        return self.rpc("SendMessage", {"message": message})


def test_two_tasks_on_a_waiting_context_the_one_answered_gets_the_reply() -> None:
    """A second message in the context while the robot's question waits is a second task,
    input-required with the same question; answering that one resumes the robot with the
    reply going to it (not to the task whose message parked), and the first stays
    input-required and takes no answer now (-32004)."""
    with _RobotTier("a2a-two-desk", [
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?", "choices": ["A1", "B2"]}}]},
            {"reply": "refunding {tool_results}"}]) as tier:
        first = tier.send("refund please", context_id="ctx-two")["result"]["task"]
        second = tier.send("and quickly", context_id="ctx-two")["result"]["task"]
        assert first["status"]["state"] == second["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert second["status"]["message"]["parts"][0]["text"] == "Which order? (choices: A1, B2)"
        done = tier.send("B2", task_id=second["id"])["result"]["task"]
        assert done["id"] == second["id"] and done["status"]["state"] == "TASK_STATE_COMPLETED", done["status"]
        assert done["status"]["message"]["parts"][0]["text"] == "refunding - ask_user: B2"
        assert tier.rpc("GetTask", {"id": first["id"]})["result"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert tier.send("A1", task_id=first["id"])["error"]["code"] == -32004


def test_cancelling_a_robot_task_waiting_for_input_withdraws_the_question() -> None:
    """tasks/cancel of a robot task that is input-required closes its question (no later
    answer runs it: robot-lab answer says so) and frees its conversation: the next message in
    the same context runs at once instead of getting the old question again."""
    from robot_lab.errors import ConfigurationError
    from robot_lab.network import human_input

    with _RobotTier("a2a-cancel-desk", [
            {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?"}}]},
            {"reply": "refunding {tool_results}"}]) as tier:
        redis, keys, name = tier.redis, tier.keys, tier.name
        asked = tier.send("refund please", context_id="ctx-cancel")["result"]["task"]
        assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        [request] = [r for r in human_input.pending(redis, keys) if r.request.get("robot") == name]
        cancelled = tier.rpc("CancelTask", {"id": asked["id"]})["result"]
        assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
        with pytest.raises(ConfigurationError, match=r"already answered by a2a:me \(cancelled\)"):
            human_input.answer(request.id, "A1", connection=redis, keys=keys)
        assert not redis.exists(keys.parked_message(name, request.id))
        again = tier.send("refund please", context_id="ctx-cancel")["result"]["task"]
        assert again["id"] != asked["id"] and again["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        [fresh] = [r for r in human_input.pending(redis, keys) if r.request.get("robot") == name]
        assert fresh.id != request.id  # a new run of the message asks anew, not the withdrawn question


def test_a_served_robots_approval_over_a2a_yes_approves_and_other_text_denies() -> None:
    from tests.fixtures import durable_tools

    turns = [{"tool_calls": [{"name": "big_refund", "arguments": {"order": "A1"}}]}, {"reply": "{tool_results}"}]
    with _RobotTier("a2a-approve-desk", turns, tools=["tests.fixtures.durable_tools:big_refund"]) as tier:
        asked = tier.send("refund A1")["result"]["task"]
        assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert "big_refund" in asked["status"]["message"]["parts"][0]["text"]
        done = tier.send("yes", task_id=asked["id"])["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        assert "refunded A1 (approved)" in done["status"]["message"]["parts"][0]["text"]
        second = tier.send("refund A1 again")["result"]["task"]
        denied = tier.send("not without a receipt", task_id=second["id"])["result"]["task"]
        assert "the user denied this call: not without a receipt" in denied["status"]["message"]["parts"][0]["text"]
    assert [r.split("|")[0] for r in durable_tools.refunds()] == ["big:A1"]  # the denied call never ran


def test_the_robot_fold_follows_question_answer_reply_and_ignores_stale_links() -> None:
    """The reply stream of a robot task, folded: the question is input-required; a resent
    question, an answer to another request and a reply to the first message after the
    answer change nothing; the answer's copy is working; the reply to it completes."""
    robot = TaskRecord(id="t3", agent="robot/x", kind="robot", target="x", context_id="c", message_id="m1",
                       reply_stream="_reply.a2a.t3")
    projection, source = Projection(robot), RobotSource(None, robot, Keys())

    def fold(message: RobotMessage) -> list[Any]:
        return asyncio.run(source.apply(projection, message))

    question = RobotMessage(to="_reply.a2a.t3", kind="input_required", in_reply_to="m1",
                            content={"request_id": "q1", "question": "Which?", "kind": "question"})
    [asked] = fold(question)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED and asked.metadata["request"] == "q1"
    assert fold(question) == []  # resent on a redelivery
    assert fold(RobotMessage(to="x", kind="answer", in_reply_to="q-other", content={"text": "no"})) == []
    answer = RobotMessage(to="x", kind="answer", in_reply_to="q1", content={"text": "that one"})
    [resumed] = fold(answer)
    assert resumed.status.state == TaskState.TASK_STATE_WORKING and source.expected == answer.id
    assert fold(RobotMessage(to="_reply.a2a.t3", kind="reply", in_reply_to="m1", content="stale")) == []
    chunk, done = fold(RobotMessage(to="_reply.a2a.t3", kind="reply", in_reply_to=answer.id, content="done"))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED and chunk.artifact.parts[0].text == "done"
    assert [m.parts[0].text for m in projection.task.history] == ["Which?", "that one", "done"]


class _Served:
    """An A2A app on a real port (uvicorn in a thread): the client tool speaks HTTP."""

    def __init__(self, build: Any) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        web = build(f"http://127.0.0.1:{self.port}")  # the cards name the served URL
        self.server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        from tests.redis_server import wait_for

        self.thread.start()
        wait_for(lambda: self.server.started, timeout=30, interval=0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def test_a_remote_agent_that_asks_becomes_the_calling_robots_own_question(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client side over real HTTP, the remote robot served by a bus poller: a robot that
    cannot ask gets a tool error naming the question; ``on_input`` answers it in-process and
    the answer goes to the same remote task; a durable run parks with the remote task
    recorded with its request, and a fresh robot resuming it continues that task (the
    remote agent sees one task, one answer)."""
    import io

    from robot_lab import build
    from robot_lab.a2a.asgi import build_a2a_app
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.connection import get_redis
    from robot_lab.errors import InputRequired
    from robot_lab.keys import default_keys
    from robot_lab.llm.scripted import register_script
    from robot_lab.network import human_input
    from robot_lab.settings import A2ASettings, reload_settings

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal to ask on
    name = "a2a-remote-desk"
    remote = _asker_app(name, "a2a-remote-ask", [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?"}}]},
        {"reply": "refunding {tool_results}"}])
    redis, keys = get_redis(), default_keys()

    def web(base_url: str) -> Any:
        return build_a2a_app(remote, base_url=base_url, robots=[name],
                             settings=A2ASettings(tokens={"caller": "tok"}, send_timeout=30), connection=redis)

    register_script("a2a-calls-desk", {"turns": [
        {"tool_calls": [{"name": "ask_desk", "arguments": {"message": "refund please"}}]}, {"reply": "{tool_results}"}]})
    poller = BusPoller(name, Bus(redis, keys=keys), block_ms=50, retry_delay=0).serve(remote.build_robot(name))
    with poller, _Served(web) as base:
        monkeypatch.setenv("ROBOT_LAB_A2A__CLIENT_TOKENS", json.dumps({base: "tok"}))
        reload_settings()

        def caller() -> Any:  # a fresh robot each time: what another worker would build
            return build("a2a-caller", model="scripted/a2a-calls-desk",
                         a2a_agents=[{"url": f"{base}/robots/{name}/", "name": "ask_desk"}])

        cannot = caller().run("go", tools="inherit").reply
        assert cannot.startswith("- ask_desk: Error (ask_desk): agent ") and "asks 'Which order?'" in cannot
        assert "cannot ask its user" in cannot

        asked: list[Any] = []
        answered = caller().run("go", tools="inherit", on_input=lambda request: asked.append(request) or "A1")
        assert [r.question for r in asked] == ["Which order?"]
        assert answered.reply == "- ask_desk: refunding - ask_user: A1"

        durable_id = f"a2a-client-{uuid4_hex()}"
        with pytest.raises(InputRequired) as parked:
            caller().run("go", tools="inherit", durable_id=durable_id)
        request = parked.value.request
        assert request["question"] == "Which order?" and request["tool"] == "ask_desk"
        context = request["context"]
        assert context["a2a_agent"] == f"{base}/robots/{name}/" and context["a2a_task"]
        human_input.answer(request["id"], "B2", by="ops", connection=redis)
        resumed = caller().run("go", tools="inherit", durable_id=durable_id)
        assert resumed.reply == "- ask_desk: refunding - ask_user: B2"
        record = redis.hgetall(keys.a2a_task(context["a2a_task"]))
        assert json.loads(record[b"final"])["status"]["state"] == "TASK_STATE_COMPLETED"
        stream = [msgspec.json.decode(f[b"envelope"])
                  for _, f in redis.xrange(keys.inbox(record[b"reply_stream"].decode()))]
        assert [m["kind"] for m in stream] == ["input_required", "answer", "reply"]  # one question, one answer


def uuid4_hex() -> str:
    import uuid

    return uuid.uuid4().hex[:10]
