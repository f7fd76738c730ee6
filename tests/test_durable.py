"""Durable runs in one process and on embedded workers (fakeredis and a real server): the
step journal's replay and divergence, step events, human input through ``on_input``, a
terminal and parked network tasks (answer, approve, deny, timeout, cancel)."""

from __future__ import annotations

import io
import time
import uuid

import pytest

from robot_lab.errors import ConfigurationError, InputRequired, StepDivergence
from robot_lab.keys import default_keys
from robot_lab.network import human_input as waiting
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.runtime.durable import AskUser, Answer, current_step
from robot_lab.llm.recording import clear_recorded_calls, recorded_calls
from robot_lab.llm.scripted import register_script
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool
from tests.fixtures import durable_tools
from tests.redis_server import wait_for

TOOLS = "tests.fixtures.durable_tools"


def uid() -> str:
    return uuid.uuid4().hex[:8]


class Crash(BaseException):
    """Stands in for a process dying mid-run: no handler catches it."""


def _script(turns):
    name = f"durable-{uid()}"
    register_script(name, {"turns": turns})
    return f"scripted/{name}"


REFUNDS3 = [{"tool_calls": [{"name": "refund", "arguments": {"order": o}}]} for o in "ABC"] + [
    {"tool_calls": [{"name": "crash_once", "arguments": {}}]}, {"reply": "all done"}]


def _crash_once_tool(state):
    @tool
    def crash_once() -> str:
        """Crash the first time."""
        state["calls"] += 1
        if state["calls"] == 1:
            raise Crash()
        return "survived"

    return crash_once


def _model_calls(robot):
    return sum(1 for c in recorded_calls() if c["robot"] == robot)


@pytest.mark.parametrize("driver", ["run", "arun"])
def test_a_durable_run_replays_finished_steps_after_a_crash(redis_client, driver):
    state = {"calls": 0}
    model = _script(REFUNDS3)
    name = f"refunder-{uid()}"
    durable_id = uid()
    clear_recorded_calls()

    def attempt():
        bot = build(name, model=model, local_tools=[f"{TOOLS}:refund", _crash_once_tool(state)])
        if driver == "run":
            return bot.run("refund", tools="inherit", durable_id=durable_id)
        import asyncio

        return asyncio.run(bot.arun("refund", tools="inherit", durable_id=durable_id))

    with pytest.raises(Crash):
        attempt()
    assert [r.split("|")[0] for r in durable_tools.refunds()] == ["A", "B", "C"]
    assert _model_calls(name) == 4
    result = attempt()
    assert result.reply == "all done"
    assert [r.split("|")[0] for r in durable_tools.refunds()] == ["A", "B", "C"]  # none ran twice
    assert _model_calls(name) == 5  # the four journaled model calls were not made again
    assert [r.split("|")[1] for r in durable_tools.refunds()] == [f"durable:{durable_id}:{i}" for i in (1, 3, 5)]
    assert "refund" in result.reply or result.tool_calls[0].tool.name == "refund"
    assert result.input_tokens > 0 and len(result.tool_calls) == 4  # replayed steps count in the result


def test_a_replay_on_another_history_does_not_diverge(redis_client):
    """A message without a conversation id runs on the serving robot's own default
    conversation, which differs between slots, workers and deliveries: the journal
    fingerprints the turn, so a redelivery on a robot with another history replays it."""
    state = {"calls": 0}
    model = _script(REFUNDS3)
    name = f"histories-{uid()}"
    durable_id = uid()
    clear_recorded_calls()
    first = build(name, model=model, system_prompt="refund things",
                  local_tools=[f"{TOOLS}:refund", _crash_once_tool(state)])
    first.messages.extend([{"role": "user", "content": "an earlier message on this slot"},
                           {"role": "assistant", "content": "noted"}])
    with pytest.raises(Crash):
        first.run("refund", tools="inherit", durable_id=durable_id)
    calls = _model_calls(name)
    fresh = build(name, model=model, system_prompt="refund things",
                  local_tools=[f"{TOOLS}:refund", _crash_once_tool(state)])
    result = fresh.run("refund", tools="inherit", durable_id=durable_id)
    assert result.reply == "all done"
    assert [r.split("|")[0] for r in durable_tools.refunds()] == ["A", "B", "C"]  # none ran twice
    assert _model_calls(name) == calls + 1  # only the step after the crash was called


def test_a_changed_prompt_between_attempts_is_a_divergence_error_or_runs_live(redis_client, monkeypatch):
    state = {"calls": 0}
    model = _script(REFUNDS3)
    durable_id = uid()
    name = f"diverge-{uid()}"
    with pytest.raises(Crash):
        build(name, model=model, system_prompt="v1", local_tools=[f"{TOOLS}:refund", _crash_once_tool(state)]).run(
            "refund", tools="inherit", durable_id=durable_id)
    changed = build(name, model=model, system_prompt="v2", local_tools=[f"{TOOLS}:refund", _crash_once_tool(state)])
    with pytest.raises(StepDivergence, match=r"step 0 \(model .*changed since it was recorded.*on_divergence=live"):
        changed.run("refund", tools="inherit", durable_id=durable_id)
    monkeypatch.setenv("ROBOT_LAB_DURABLE__ON_DIVERGENCE", "live")
    from robot_lab import settings

    monkeypatch.setattr(settings, "_settings", None)
    result = changed.run("refund", tools="inherit", durable_id=durable_id)
    assert result.reply == "all done"
    assert [r.split("|")[0] for r in durable_tools.refunds()] == ["A", "B", "C", "A", "B", "C"]  # live again


def test_on_input_answers_ask_user_and_approvals(redis_client):
    model = _script([
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which?", "choices": ["A1", "B2"]}}]},
        {"tool_calls": [{"name": "big_refund", "arguments": {"order": "B2"}}]},
        {"reply": "{tool_results}"}])
    asked = []

    def on_input(request):
        asked.append((request.kind, request.question, request.tool))
        return "2" if request.kind == "question" else False

    bot = build(f"asker-{uid()}", model=model, local_tools=[AskUser, f"{TOOLS}:big_refund"])
    result = bot.run("go", tools="inherit", on_input=on_input)
    assert asked == [("question", "Which?", None), ("approval", "Allow big_refund(order='B2')?", "big_refund")]
    assert result.tool_calls[0].content == {"data": "B2"}  # "2" picks the second choice
    assert result.tool_calls[1].content == {"error": "Error (big_refund): the user denied this call"}
    assert durable_tools.refunds() == []  # a denied call never runs
    approved = build(f"asker-{uid()}", model=model, local_tools=[AskUser, f"{TOOLS}:big_refund"]).run(
        "go", tools="inherit", on_input=lambda r: Answer(text="A1", approved=True))
    assert "refunded B2 (approved)" in approved.reply


def test_without_on_input_or_a_terminal_a_plain_run_raises_a_clear_error(redis_client, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    model = _script([{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Name?"}}]}, {"reply": "x"}])
    with pytest.raises(InputRequired, match=r"asks .Name\?. and nothing here can answer: pass on_input="):
        build(f"asker-{uid()}", model=model, local_tools=[AskUser]).run("go", tools="inherit")


def test_a_terminal_answers_like_robot_labs_ask_user(redis_client, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Tty("\n"))
    model = _script([{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Size?", "default": "M",
                                                                         "choices": ["S", "M"]}}]},
                     {"reply": "{tool_results}"}])
    result = build(f"tty-{uid()}", model=model, local_tools=[AskUser]).run("go", tools="inherit")
    assert result.reply.endswith("ask_user: M")  # an empty line is the default
    assert "Size?" in capsys.readouterr().err


def test_current_step_outside_a_tool_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="inside a robot's tool call"):
        current_step()


# --- network tasks on embedded workers ---------------------------------------------------

ASK_THEN_APPROVE = [
    {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?", "default": "A1"}}]},
    {"tool_calls": [{"name": "big_refund", "arguments": {"order": "A1"}}]},
    {"reply": "{tool_results}"}]


def _submit(redis_client, turns, **robot_kwargs):
    bot = build(f"parker-{uid()}", model=_script(turns), local_tools=[AskUser, f"{TOOLS}:big_refund"], **robot_kwargs)
    net = create_network("park")
    net.task("ask", bot, tools="inherit")
    workers = EmbeddedWorkers(redis_client, [bot.name], threads=2).start()
    handle = Coordinator(connection=redis_client).submit(net, "refund")
    return bot, handle, workers


def _parked(handle, kind="question"):
    return wait_for(lambda: [r for r in handle.pending() if r.request.get("kind") == kind], timeout=30)[0]


def test_a_parked_task_answered_and_approved_resumes_without_repeating_model_calls(redis_client):
    clear_recorded_calls()
    bot, handle, workers = _submit(redis_client, ASK_THEN_APPROVE)
    try:
        question = _parked(handle)
        assert handle.states() == {"ask": "waiting"}
        pytest.importorskip("prometheus_client")
        from robot_lab.workers.fleet_gauges import RedisCollector

        gauges = {m.name: m.samples[0].value for m in RedisCollector(redis_client, default_keys(), []).collect()
                  if m.samples and not m.samples[0].labels}
        assert gauges["robot_lab_inputs_pending"] == 1
        assert not redis_client.exists(default_keys().run_lease(handle.run_id, "ask"))
        requested = [e for e in handle.events() if e.event == "hitl.requested"]
        assert requested[0].data["question"] == "Which order?" and requested[0].data["id"] == question.id
        handle.answer("B2", by="bob")
        with pytest.raises(ConfigurationError, match="already answered by bob"):
            waiting.answer(question.id, "again", connection=redis_client)
        approval = _parked(handle, "approval")
        assert approval.request["tool"] == "big_refund" and approval.request["arguments"] == {"order": "A1"}
        handle.answer(approve=True, by="carol")
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
    assert "ask_user: B2" in result.reply and "refunded A1 (approved)" in result.reply
    assert _model_calls(bot.name) == 3
    resolved = [(e.data["by"], e.data.get("approved")) for e in handle.events() if e.event == "hitl.resolved"]
    assert resolved == [("bob", None), ("carol", True)]
    steps = [e for e in handle.events() if e.event == "step.completed"]
    assert [s.data["kind"] for s in steps] == ["model", "tool", "model", "tool", "model"]
    assert all("duration" in s.data for s in steps) and steps[0].data["input_tokens"] > 0


def test_a_network_task_delegating_to_a_robot_that_asks_parks_and_its_answer_goes_on(redis_client):
    """The delegatee's question is the delegating task's own: the task parks, and the answer
    (from any answerer) resumes it on a worker, which sends it on to the delegatee."""
    from robot_lab.bus import Bus, BusPoller

    desk = build(f"desk-{uid()}", model=_script([
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?", "choices": ["A1", "B2"]}}]},
        {"reply": "refunding {tool_results}"}]), local_tools=[AskUser])
    poller = BusPoller(desk.name, Bus(redis_client), block_ms=50, retry_delay=0).serve(desk).start()
    boss = build(f"boss-{uid()}", model=_script([
        {"tool_calls": [{"name": "ask_desk", "arguments": {"desk": desk.name, "request": "refund please"}}]},
        {"reply": "desk says {tool_results}"}]), local_tools=[f"{TOOLS}:ask_desk"])
    net = create_network("delegating")
    net.task("boss", boss, tools="inherit")
    workers = EmbeddedWorkers(redis_client, [boss.name], threads=2).start()
    clear_recorded_calls()
    try:
        handle = Coordinator(connection=redis_client).submit(net, "go")
        question = _parked(handle)
        assert question.question == "Which order?" and question.request["context"]["delegatee"] == desk.name
        assert handle.states() == {"boss": "waiting"}
        handle.answer("2", by="ops")
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
        poller.stop()
    assert result.reply == "desk says - ask_desk: refunding - ask_user: B2"
    assert _model_calls(desk.name) == 2 and _model_calls(boss.name) == 2  # no model call made twice


def test_resumes_after_answers_do_not_count_as_lost_workers(redis_client, monkeypatch):
    """Each resume after an answer is a new attempt of the task, not a lost worker: a task
    that asked twice and then lost its worker once is requeued under max_attempts 2."""
    monkeypatch.setenv("ROBOT_LAB_TASK_MAX_ATTEMPTS", "2")
    net = create_network("asks-a-lot")
    net.task("ask", build(f"asker-{uid()}", model="scripted/echo"))
    coordinator = Coordinator(connection=redis_client)
    handle = coordinator.submit(net, "x")
    store, keys = handle.store, default_keys()
    for i in range(2):  # claimed, asks, parks; answered, resumed
        assert store.claim("ask", store.job_id("ask"), f"worker-{i}") == "ok"
        question = InputRequired(f"Question {i}?")
        question.request = {"id": uid(), "question": f"Question {i}?"}
        assert waiting.park(store, "ask", store.job_id("ask"), question)["status"] == "waiting"
        assert waiting.resume(redis_client, keys, handle.run_id, "ask", {"request_id": question.request["id"]}) == "ok"
    assert store.attempts()["ask"] == 3 and store.resumes()["ask"] == 2
    assert store.claim("ask", store.job_id("ask"), "doomed", lease_ms=200) == "ok"  # then the worker dies
    wait_for(lambda: not redis_client.exists(keys.run_lease(handle.run_id, "ask")))
    coordinator.sweep_run(handle.run_id)
    assert store.states()["ask"] == "queued"  # requeued: one lost worker, not three
    assert store.attempts()["ask"] == 4 and not [e for e in handle.events() if e.event == "task.failed"]


def test_a_denied_approval_is_a_refusal_the_model_sees(redis_client):
    bot, handle, workers = _submit(redis_client, ASK_THEN_APPROVE)
    try:
        handle.answer("A1", request_id=_parked(handle).id)
        handle.answer("too large", approve=False, request_id=_parked(handle, "approval").id)
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
    assert "the user denied this call: too large" in result.reply
    assert durable_tools.refunds() == []


def test_an_unanswered_request_times_out_to_its_default_or_fails_the_task(redis_client):
    bot, handle, workers = _submit(redis_client, ASK_THEN_APPROVE, config={"input_timeout": 0.1})
    try:
        _parked(handle)
        assert waiting.sweep(redis_client, default_keys(), now=time.time() + 5) == 1
        approval = _parked(handle, "approval")  # the default answered the question
        waiting.sweep(redis_client, default_keys(), now=approval.request["deadline"] + 1)
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
    assert "ask_user: A1" in result.reply and "denied" in result.reply  # an approval times out denied
    no_default = [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Name?"}}]}, {"reply": "x"}]
    bot, handle, workers = _submit(redis_client, no_default, config={"input_timeout": 0.1})
    try:
        _parked(handle)
        waiting.sweep(redis_client, default_keys(), now=time.time() + 5)
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
    assert result.states == {"ask": "failed"}
    assert "InputTimeout" in (result.value.error or "") and "timed out with no default" in result.value.error


def test_cancel_ends_a_waiting_run_and_its_request(redis_client):
    bot, handle, workers = _submit(redis_client, ASK_THEN_APPROVE)
    try:
        request = _parked(handle)
        assert Coordinator(connection=redis_client).cancel(handle.run_id) == "cancelled"
    finally:
        workers.stop()
    assert handle.states() == {"ask": "cancelled"}
    with pytest.raises(ConfigurationError, match="is cancelled"):
        waiting.answer(request.id, "late", connection=redis_client)
    assert waiting.pending(redis_client, default_keys()) == []


def test_a_prompt_changed_while_a_task_waits_fails_the_resumed_attempt_naming_the_step(redis_client):
    import json as _json

    bot, handle, workers = _submit(redis_client, ASK_THEN_APPROVE, system_prompt="v1")
    try:
        request = _parked(handle)
        key = default_keys().run(handle.run_id)
        robots = _json.loads(redis_client.hget(key, "robots"))
        spec = _json.loads(robots[bot.name])
        robots[bot.name] = _json.dumps({**spec, "system_prompt": "v2"})  # a redeploy changed the prompt
        redis_client.hset(key, "robots", _json.dumps(robots))
        handle.answer("A1", request_id=request.id)
        result = handle.wait(timeout=30)
    finally:
        workers.stop()
    assert result.states == {"ask": "failed"}
    assert "StepDivergence" in result.value.error and "step 0 (model" in result.value.error


def test_a_robot_run_nested_in_a_tool_asks_through_the_outer_run(redis_client, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    inner_model = _script([{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Inner?"}}]},
                           {"reply": "inner got {tool_results}"}])
    inner = build(f"inner-{uid()}", model=inner_model, local_tools=[AskUser])

    @tool
    def consult() -> str:
        """Ask the inner robot."""
        return inner.run("help", tools="inherit").reply

    outer_model = _script([{"tool_calls": [{"name": "consult", "arguments": {}}]}, {"reply": "outer: {tool_results}"}])
    durable_id = uid()
    outer = build(f"outer-{uid()}", model=outer_model, local_tools=[consult])
    with pytest.raises(InputRequired) as parked:
        outer.run("go", tools="inherit", durable_id=durable_id)
    assert parked.value.request["question"] == "Inner?"
    waiting.answer(parked.value.request["id"], "yes", connection=redis_client)
    result = build(outer.name, model=outer_model, local_tools=[consult]).run("go", tools="inherit",
                                                                           durable_id=durable_id)
    assert result.reply == "outer: - consult: inner got - ask_user: yes"


def test_an_approved_tool_that_asks_again_parks_twice_in_one_step(redis_client, monkeypatch):
    from robot_lab.runtime.durable import request_input

    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    @tool(requires_approval=True)
    def ship(order: str) -> str:
        """Ship an order."""
        return f"shipped {order} by {request_input('Which carrier?').text}"

    model = _script([{"tool_calls": [{"name": "ship", "arguments": {"order": "A1"}}]}, {"reply": "{tool_results}"}])
    durable_id = uid()

    def attempt():
        return build(f"shipper-{uid()}", model=model, local_tools=[ship]).run("go", tools="inherit",
                                                                              durable_id=durable_id)

    with pytest.raises(InputRequired) as first:
        attempt()
    assert first.value.request["kind"] == "approval"
    waiting.answer(first.value.request["id"], approve=True, connection=redis_client)
    with pytest.raises(InputRequired) as second:
        attempt()
    assert second.value.request["question"] == "Which carrier?"
    waiting.answer(second.value.request["id"], "bike", connection=redis_client)
    assert attempt().reply == "- ship: shipped A1 by bike"


def test_a_request_recorded_just_before_its_task_parks_is_not_dropped_by_a_listing(redis_client):
    """The job records the request, then the PARK transition runs: a `pending` listing (or an
    answer) in between must neither lose the request nor refuse it."""
    from robot_lab.errors import InputRequired as Asked
    from robot_lab.inputs import InputStore
    from robot_lab.network.run_state import RunStore

    net = create_network("race")
    net.task("t", build(f"racer-{uid()}", model="scripted/echo"))
    store = RunStore(redis_client, default_keys(), f"race-{uid()}")
    [(task, job, _)] = store.create(net.validate(), message="m", context={}, app=None, max_concurrent=None)
    assert store.claim(task, job, "w") == "ok"
    request = {"id": uid(), "question": "now?", "created_at": time.time()}
    InputStore(redis_client, default_keys()).create(request, {"kind": "task", "run_id": store.run_id, "task": task}, 60)
    assert waiting.pending(redis_client, default_keys()) == []  # running: not listed yet ...
    asked = Asked("now?")
    asked.request = request
    waiting.park(store, task, job, asked)
    assert [r.id for r in waiting.pending(redis_client, default_keys())] == [request["id"]]  # ... nor dropped


def test_on_deny_fail_makes_a_denial_fail_the_run(redis_client, monkeypatch):
    from robot_lab import settings
    from robot_lab.errors import ToolLoopError

    monkeypatch.setenv("ROBOT_LAB_DURABLE__ON_DENY", "fail")
    monkeypatch.setattr(settings, "_settings", None)
    model = _script([{"tool_calls": [{"name": "big_refund", "arguments": {"order": "B2"}}]}, {"reply": "x"}])
    bot = build(f"strict-{uid()}", model=model, local_tools=[f"{TOOLS}:big_refund"])
    with pytest.raises(ToolLoopError, match="the call of big_refund was denied: too much"):
        bot.run("go", tools="inherit", on_input=lambda request: Answer(text="too much", approved=False))
    assert durable_tools.refunds() == []


def test_a_model_steps_journal_record_is_asdict_of_its_response() -> None:
    """The journal's record of a model step is built without dataclasses.asdict (it runs
    once per model step): the same dict, key order included, and a deep copy."""
    import json
    from dataclasses import asdict

    from robot_lab.llm.response import LLMResponse, ToolCallRequest
    from robot_lab.runtime.durable.steps import response_from, response_record

    response = LLMResponse(content="x", tool_calls=[ToolCallRequest("c1", "add", {"a": [1, {"b": 2}]}, "raw")],
                           input_tokens=3, output_tokens=2, cost=0.5, finish_reason="tool_calls", model="m",
                           reasoning="r", usage_estimated=True)
    record = response_record(response)
    assert json.dumps(record) == json.dumps(asdict(response))
    record["tool_calls"][0]["arguments"]["a"][1]["b"] = 9
    assert response.tool_calls[0].arguments == {"a": [1, {"b": 2}]}
    assert response_from(json.loads(json.dumps(asdict(response)))) == response


def test_a_deferred_last_step_waits_for_its_owners_round_trip(redis_client) -> None:
    """``defer_last``: a ``last`` step stays pending until the owner's pipeline
    (``queue_unwritten``/``sent``), the next step's write, or ``flush``; others go out at once."""
    from robot_lab.runtime.durable.journal import Journal

    key = default_keys().durable_steps(uid())
    journal = Journal(redis_client, key, 60, scope="s", defer_last=True)
    journal.write(0, {"kind": "model", "status": "done"}, last=True)
    assert redis_client.hgetall(key) == {} and journal.steps()[0]["kind"] == "model"
    pipe = redis_client.pipeline(transaction=False)
    assert journal.queue_unwritten(pipe) == 2
    pipe.execute()
    journal.sent()
    assert set(redis_client.hgetall(key)) == {b"0"} and journal.unwritten == {}
    journal.write(1, {"kind": "model"}, last=True)
    journal.write(2, {"kind": "tool"})  # not last: written now, with the pending one
    assert set(redis_client.hgetall(key)) == {b"0", b"1", b"2"} and journal.queue_unwritten(pipe) == 0
    journal.write(3, {"kind": "model"}, last=True)
    journal.flush()
    assert b"3" in redis_client.hgetall(key) and redis_client.ttl(key) > 0
    plain = Journal(redis_client, key + "x", 60, scope="s")  # not deferring: every step at once
    plain.write(0, {"kind": "model"}, last=True)
    assert set(redis_client.hgetall(key + "x")) == {b"0"}
