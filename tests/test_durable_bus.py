"""Served robots that ask a person over the bus: ``input_required`` replies, ``answer``
envelopes, the conversation waiting in order, answers from the CLI, and who may answer
under ``signing.verify=require`` (fakeredis and a real server)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from robot_lab.bus import Bus, BusPoller
from robot_lab.bus.keyring import Keyring
from robot_lab.network import human_input as waiting
from robot_lab.llm.recording import clear_recorded_calls, recorded_calls
from robot_lab.llm.scripted import register_script
from robot_lab.runtime.robot import build
from robot_lab.schemas import RobotMessage, decode_message

CLIENT_KEY = "client-key-0001-0123456789abcdef"
OTHER_KEY = "other-key-00001-0123456789abcdef"
ROBOT_KEY = "robot-key-00001-0123456789abcdef"


def _robot(name: str):
    script = f"bus-ask-{uuid.uuid4().hex[:8]}"
    register_script(script, {"turns": [
        {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which order?", "choices": ["A1", "B2"]}}]},
        {"reply": "refunding {tool_results}"}]})
    return build(name, model=f"scripted/{script}", local_tools=["robot_lab.runtime.durable.human:AskUser"])


def _inbox(bus: Bus, name: str):
    return [decode_message(fields[b"envelope"]) for _, fields in bus.redis.xrange(bus.keys.inbox(name))]


def _drain(poller: BusPoller) -> None:
    for _ in range(20):
        if poller.poll(block_ms=0) == 0 and not poller.held:
            return


def _serve(bus: Bus, robot, **kwargs) -> BusPoller:
    poller = BusPoller(robot.name, bus, block_ms=0, retry_delay=0, consumer="c1", **kwargs).serve(robot)
    poller.poll(block_ms=0)  # registers the inbox
    return poller


def test_a_served_robot_asks_over_the_bus_and_the_answer_resumes_it(redis_client) -> None:
    bus = Bus(redis_client)
    bus.register("client")
    robot = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    poller = _serve(bus, robot)
    clear_recorded_calls()
    first = bus.publish(robot.name, "refund please", from_="client", conversation_id="c-1")
    _drain(poller)
    [question] = _inbox(bus, "client")
    assert question.kind == "input_required" and question.in_reply_to == first.id
    assert question.content["question"] == "Which order?" and question.content["choices"] == ["A1", "B2"]
    request_id = question.content["request_id"]
    # the conversation waits in order behind the question: a message that does not answer it runs nothing
    bus.publish(robot.name, "hello?", from_="client", conversation_id="c-1")
    _drain(poller)
    again = _inbox(bus, "client")[-1]
    assert again.kind == "input_required" and again.content["request_id"] == request_id
    assert len(recorded_calls()) == 1
    answer = bus.publish(robot.name, "2", from_="client", kind="answer", in_reply_to=request_id,
                         conversation_id="c-1")
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.in_reply_to == answer.id
    assert final.content == "refunding - ask_user: B2"
    assert len(recorded_calls()) == 2  # the first model call was replayed from the message's journal
    # the answer is recorded once: a second one is refused, from the CLI and over the bus
    with pytest.raises(Exception, match="already answered by client"):
        waiting.answer(request_id, "A1", connection=redis_client)
    bus.publish(robot.name, "1", from_="client", kind="answer", in_reply_to=request_id, conversation_id="c-1")
    _drain(poller)
    [letter] = bus.dead_letters(robot.name)
    assert letter.reason == "answer_refused" and "already answered" in letter.error
    assert len(recorded_calls()) == 2
    # the conversation goes on normally
    bus.publish(robot.name, "thanks", from_="client", conversation_id="c-1")
    _drain(poller)
    assert _inbox(bus, "client")[-1].kind == "input_required"  # a new run of the script asks again
    assert _inbox(bus, "client")[-1].content["request_id"] != request_id


def test_a_message_without_a_conversation_parks_and_resumes_on_the_robots_own_history(redis_client) -> None:
    """No conversation id: the robot's default conversation. The parked turn leaves it as it
    was (no tool call without its result), and the answer replays the turn on it."""
    bus = Bus(redis_client)
    bus.register("client")
    robot = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    robot.messages.extend([{"role": "user", "content": "an earlier message"}, {"role": "assistant", "content": "ok"}])
    before = list(robot.messages)
    poller = _serve(bus, robot)
    clear_recorded_calls()
    first = bus.publish(robot.name, "refund please", from_="client")
    _drain(poller)
    [question] = _inbox(bus, "client")
    assert question.kind == "input_required" and question.in_reply_to == first.id
    assert robot.messages == before  # the parked turn left nothing behind
    answer = bus.publish(robot.name, "1", from_="client", kind="answer", in_reply_to=question.content["request_id"])
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.in_reply_to == answer.id and final.content == "refunding - ask_user: A1"
    assert len(recorded_calls()) == 2  # the first model call was replayed, not made again
    users = [m["content"] for m in robot.messages if m["role"] == "user"]
    assert users == ["an earlier message", "refund please"]
    calls = {c["id"] for m in robot.messages for c in m.get("tool_calls") or []}
    assert calls == {m["tool_call_id"] for m in robot.messages if m["role"] == "tool"}
    assert bus.dead_letters(robot.name) == []


def _served_question(bus: Bus, conversation_id: str) -> tuple[Any, BusPoller, RobotMessage]:
    """A served robot that asked ``client`` which order (choices A1, B2) in
    ``conversation_id``: the robot, its poller and the question the client received."""
    bus.register("client")
    robot = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    poller = _serve(bus, robot)
    bus.publish(robot.name, "refund please", from_="client", conversation_id=conversation_id)
    _drain(poller)
    [question] = _inbox(bus, "client")
    return robot, poller, question


def test_an_answer_from_the_cli_wakes_the_served_message(redis_client) -> None:
    bus = Bus(redis_client)
    _robot_, poller, question = _served_question(bus, "c-2")
    [listed] = [r for r in waiting.pending(redis_client) if r.id == question.content["request_id"]]
    assert listed.owner["kind"] == "message"
    waiting.answer(listed.id, "A1", by="ops", connection=redis_client)
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.content == "refunding - ask_user: A1"


def _park_as_an_older_release(bus: Bus, robot: str, request_id: str) -> None:
    """Where releases before the parked keys moved kept a parked message: under the inbox,
    with nothing on the request's record."""
    keys = bus.keys
    bus.redis.rename(keys.parked_message(robot, request_id), keys.legacy_parked_message(robot, request_id))
    bus.redis.hdel(keys.input_request(request_id), "parked")


@pytest.mark.parametrize("answered_by", ["bus", "cli"])
def test_a_message_parked_by_an_older_release_is_still_answered(redis_client, answered_by) -> None:
    """A rolling upgrade: the message parked under the inbox before it is still run again by
    its answer -- a bus ``answer`` from its sender, or ``robot-lab answer`` -- and forgotten."""
    bus = Bus(redis_client)
    robot, poller, question = _served_question(bus, "c-old")
    request_id = question.content["request_id"]
    _park_as_an_older_release(bus, robot.name, request_id)
    if answered_by == "bus":
        bus.publish(robot.name, "B2", from_="client", kind="answer", in_reply_to=request_id, conversation_id="c-old")
    else:
        waiting.answer(request_id, "B2", by="ops", connection=redis_client)
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.content == "refunding - ask_user: B2"
    assert not redis_client.exists(bus.keys.legacy_parked_message(robot.name, request_id))
    assert bus.dead_letters(robot.name) == []


def test_under_require_only_an_allowed_signed_sender_may_answer(redis_client, monkeypatch) -> None:
    name = f"desk-{uuid.uuid4().hex[:6]}"
    keys = {"client": {"k1": CLIENT_KEY}, "other": {"k1": OTHER_KEY}, name: {"k1": ROBOT_KEY}}
    bus = Bus(redis_client, keyring=Keyring(keys))
    for who in ("client", "other"):
        bus.register(who)
    robot = _robot(name)
    poller = _serve(bus, robot, verify="require")
    bus.publish(name, "refund please", from_="client", conversation_id="c-3")
    _drain(poller)
    [question] = _inbox(bus, "client")
    request_id = question.content["request_id"]
    # "other" signs correctly but is not allowed to answer for this robot (default: the asker only)
    bus.publish(name, "1", from_="other", kind="answer", in_reply_to=request_id, conversation_id="c-3",
                reply_to="other")
    _drain(poller)
    [letter] = bus.dead_letters(name)
    assert letter.reason == "answer_refused" and "'other' may not answer" in letter.error
    bus.publish(name, "1", from_="client", kind="answer", in_reply_to=request_id, conversation_id="c-3")
    _drain(poller)
    assert _inbox(bus, "client")[-1].content == "refunding - ask_user: A1"
    # durable.answerers names who else may answer
    monkeypatch.setenv("ROBOT_LAB_DURABLE__ANSWERERS", json.dumps({name: ["oth*"]}))
    from robot_lab import settings

    monkeypatch.setattr(settings, "_settings", None)
    bus.publish(name, "refund again", from_="client", conversation_id="c-4")
    _drain(poller)
    second = _inbox(bus, "client")[-1]
    bus.publish(name, "2", from_="other", kind="answer", in_reply_to=second.content["request_id"],
                conversation_id="c-4", reply_to="other")
    _drain(poller)
    assert _inbox(bus, "other")[-1].content == "refunding - ask_user: B2"


def _asked_under_require(redis_client, conversation: str):
    """A robot served under require that has asked ``client`` a question: (bus, name, poller, request id)."""
    name = f"desk-{uuid.uuid4().hex[:6]}"
    bus = Bus(redis_client, keyring=Keyring({"client": {"k1": CLIENT_KEY}, name: {"k1": ROBOT_KEY}}))
    for who in ("client", "mallory"):
        bus.register(who)
    poller = _serve(bus, _robot(name), verify="require")
    bus.publish(name, "refund please", from_="client", conversation_id=conversation)
    _drain(poller)
    [question] = _inbox(bus, "client")
    return bus, name, poller, question.content["request_id"]


def test_under_require_an_answer_from_the_cli_wakes_the_message_and_a_forged_wake_does_nothing(redis_client) -> None:
    """The CLI (or dashboard) records the answer in Redis and wakes the parked message with
    an unsigned envelope: accepted under require only once the answer is recorded, its content
    ignored, the reply sent to the asker whatever the envelope's reply_to says."""
    bus, name, poller, request_id = _asked_under_require(redis_client, "c-5")
    unsigned = Bus(redis_client)  # an append-only publisher holding no key
    unsigned.publish(name, {"text": "2"}, from_="client", kind="answer", in_reply_to=request_id,
                     conversation_id="c-5", reply_to="mallory")
    _drain(poller)
    [letter] = bus.dead_letters(name)
    assert letter.reason == "unauthenticated"  # nothing answered yet: an unsigned answer is refused
    waiting.answer(request_id, "A1", by="ops", connection=redis_client)  # robot-lab answer
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.content == "refunding - ask_user: A1"
    assert len(bus.dead_letters(name)) == 1
    # a forged wake after the fact: the message is no longer parked, so it is refused again
    unsigned.publish(name, {"text": "2"}, from_="client", kind="answer", in_reply_to=request_id,
                     conversation_id="c-5", reply_to="mallory")
    _drain(poller)
    assert [d.reason for d in bus.dead_letters(name)] == ["unauthenticated", "unauthenticated"]
    assert _inbox(bus, "mallory") == []


def test_under_require_a_wake_with_a_forged_reply_to_replies_to_the_asker(redis_client) -> None:
    bus, name, poller, request_id = _asked_under_require(redis_client, "c-6")
    from robot_lab.inputs import Answer, InputStore

    InputStore(redis_client, bus.keys).answer(request_id, Answer(text="B2", by="ops"))  # recorded, not yet woken
    Bus(redis_client).publish(name, {"text": "A1"}, from_="mallory", kind="answer", in_reply_to=request_id,
                              conversation_id="c-6", reply_to="mallory")
    _drain(poller)
    assert _inbox(bus, "mallory") == []
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.content == "refunding - ask_user: B2"  # the recorded answer


def _delegating_boss(desk: str, bus: Bus, name: str | None = None):
    """A robot whose one tool delegates to the served robot ``desk`` by name (``name``: the
    same robot again, as another worker builds it)."""
    from robot_lab.runtime.tools import tool

    @tool
    def ask_desk(request: str) -> str:
        """Pass the request to the desk."""
        from robot_lab.runtime.delegation import delegate

        return delegate(desk, request, delegated_by="boss", timeout=30, bus=bus).reply

    name = name or f"boss-{uuid.uuid4().hex[:6]}"
    register_script(name, {"turns": [{"tool_calls": [{"name": "ask_desk", "arguments": {"request": "refund please"}}]},
                                     {"reply": "desk says {tool_results}"}]})
    return build(name, model=f"scripted/{name}", local_tools=[ask_desk])


def test_a_delegation_by_name_that_meets_a_question_fails_naming_it_when_the_robot_cannot_ask(redis_client) -> None:
    from robot_lab.errors import InferenceError
    from robot_lab.runtime.delegation import delegate

    bus = Bus(redis_client)
    robot = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    poller = _serve(bus, robot)
    poller.start()
    try:
        with pytest.raises(InferenceError, match=r"waits for a person's answer to 'Which order\?' \(request [0-9a-f]+\) "
                                                 r"and 'boss' cannot ask its user"):
            delegate(robot.name, "refund please", delegated_by="boss", timeout=30, bus=bus)
    finally:
        poller.stop()


def test_a_delegatees_question_is_the_delegating_robots_own_answered_by_its_on_input(redis_client) -> None:
    bus = Bus(redis_client)
    desk = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    poller = _serve(bus, desk)
    poller.start()
    asked = []
    try:
        result = _delegating_boss(desk.name, bus).run(
            "go", tools="inherit", on_input=lambda request: asked.append(request.question) or "2")
    finally:
        poller.stop()
    assert asked == ["Which order?"]
    assert result.reply == "desk says - ask_desk: refunding - ask_user: B2"


def test_a_delegatees_question_parks_the_delegating_run_and_the_answer_goes_on_to_the_delegatee(redis_client) -> None:
    from robot_lab.errors import InputRequired

    bus = Bus(redis_client)
    desk = _robot(f"desk-{uuid.uuid4().hex[:6]}")
    poller = _serve(bus, desk)
    poller.start()
    durable_id = uuid.uuid4().hex
    clear_recorded_calls()
    try:
        boss = _delegating_boss(desk.name, bus)
        with pytest.raises(InputRequired) as parked:
            boss.run("go", tools="inherit", durable_id=durable_id)
        request = parked.value.request
        assert request["question"] == "Which order?" and request["context"]["delegatee"] == desk.name
        assert request["choices"] == ["A1", "B2"]
        waiting.answer(request["id"], "1", connection=redis_client)
        # a fresh robot object (another worker, say) resumes the run: the desk's run goes on
        result = _delegating_boss(desk.name, bus, boss.name).run("go", tools="inherit", durable_id=durable_id)
    finally:
        poller.stop()
    assert result.reply == "desk says - ask_desk: refunding - ask_user: A1"
    desk_calls = [c for c in recorded_calls() if c["robot"] == desk.name]
    assert len(desk_calls) == 2  # the desk asked once: its first model call was replayed, not made again
    assert bus.dead_letters(desk.name) == []


def _asked(bus: Bus, conversation: str) -> tuple[BusPoller, str]:
    """:func:`_served_question`'s poller and request id."""
    _robot_, poller, question = _served_question(bus, conversation)
    return poller, question.content["request_id"]


def test_an_answer_that_is_no_choice_or_too_long_is_refused_and_the_question_still_waits(redis_client) -> None:
    """"7" for a two-choice question and a megabyte of text never reach the model: over the
    bus the sender is asked again with the reason; through ``human_input.answer`` (the CLI,
    the dashboard API, ``RunHandle.answer``) it is an InvalidAnswer naming the choices or the
    limit. Nothing is recorded, and a good answer then resumes the message."""
    from robot_lab.inputs import InputStore, InvalidAnswer

    bus = Bus(redis_client)
    poller, request_id = _asked(bus, "c-7")
    clear_recorded_calls()
    robot = poller.robot
    bus.publish(robot, "7", from_="client", kind="answer", in_reply_to=request_id, conversation_id="c-7")
    _drain(poller)
    again = _inbox(bus, "client")[-1]
    assert again.kind == "input_required" and again.content["request_id"] == request_id
    assert again.content["error"] == f"'7' is not a choice of input request {request_id}: answer one of 'A1', " \
                                     "'B2', or its number 1-2"
    with pytest.raises(InvalidAnswer, match=r"'7' is not a choice .* 'A1', 'B2', or its number 1-2"):
        waiting.answer(request_id, "7", by="ops", connection=redis_client)
    with pytest.raises(InvalidAnswer, match=r"is 1000000 characters; at most 10000 are taken "
                                            r"\(durable.max_answer_chars\)"):
        waiting.answer(request_id, "x" * 1_000_000, by="ops", connection=redis_client)
    assert InputStore(redis_client, bus.keys).get(request_id).answer is None
    assert recorded_calls() == []  # the model saw none of them
    assert [r.id for r in waiting.pending(redis_client)] == [request_id]
    bus.publish(robot, "2", from_="client", kind="answer", in_reply_to=request_id, conversation_id="c-7")
    _drain(poller)
    final = _inbox(bus, "client")[-1]
    assert final.kind == "reply" and final.content == "refunding - ask_user: B2"
    assert bus.dead_letters(robot) == []


def test_robot_lab_answer_refuses_an_answer_that_is_no_choice(real_client, monkeypatch) -> None:
    """The CLI: one line naming the choices, exit 1, the question still pending; the limit on
    an answer's size is the ``durable.max_answer_chars`` setting."""
    from click.testing import CliRunner

    from robot_lab.cli import main
    from robot_lab.settings import reload_settings

    bus = Bus(real_client)
    poller, request_id = _asked(bus, "c-8")
    out = CliRunner().invoke(main, ["answer", request_id, "7"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.output.strip() == (f"Error: '7' is not a choice of input request {request_id}: answer one of 'A1', "
                                  "'B2', or its number 1-2")
    monkeypatch.setenv("ROBOT_LAB_DURABLE__MAX_ANSWER_CHARS", "5")
    reload_settings()
    out = CliRunner().invoke(main, ["answer", request_id, "B2 please"])
    assert out.exit_code == 1 and "is 9 characters; at most 5 are taken" in out.output
    out = CliRunner().invoke(main, ["answer", request_id, "B2"])
    assert out.exit_code == 0, out.output
    _drain(poller)
    assert _inbox(bus, "client")[-1].content == "refunding - ask_user: B2"
