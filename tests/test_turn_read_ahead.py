"""A run in a stored conversation reads its history, its step journal (a ``durable_id``) and
its robot's learnings in one round trip (robot_lab/runtime/robot/turn.py read_ahead), and
uses what it read: no read of its own for the journal or the learnings."""

from __future__ import annotations

from typing import Any

import pytest

import robot_lab
from robot_lab import coalesce


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command names of each round trip made through robot_lab.coalesce."""
    seen: list[list[str]] = []
    execute, call = coalesce.execute, coalesce.call

    def spy_execute(pipe: Any, raise_on_error: bool = True, **kw: Any) -> Any:
        seen.append([str(args[0]).upper() for args, _ in pipe.command_stack])
        return execute(pipe, raise_on_error, **kw)

    def spy_call(client: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        seen.append([name.upper()])
        return call(client, name, *args, **kwargs)

    monkeypatch.setattr(coalesce, "execute", spy_execute)
    monkeypatch.setattr(coalesce, "call", spy_call)
    return seen


def test_history_journal_and_learnings_are_read_in_one_round_trip_and_used(redis_client: Any,
                                                                           reads: list[list[str]]) -> None:
    robot_lab.build(name="reader").learn("say please")
    robot = robot_lab.build(name="reader")
    reads.clear()
    first = robot.run("one", conversation_id="c1", durable_id="bus:reader:me:m1")
    assert "LEARNINGS FROM PREVIOUS RUNS:\n- say please" in first.reply
    assert reads[0] == ["GET", "HGETALL", "HGET"]  # history, journal, learnings: one round trip
    assert ["HGETALL"] not in reads and ["HGET"] not in reads  # the run used what was read
    reads.clear()
    again = robot.run("one", conversation_id="c2", durable_id="bus:reader:me:m1")  # the journal replays
    assert again.reply == first.reply and reads[0] == ["GET", "HGETALL", "HGET"]
    assert not any("HSET" in r for r in reads)  # the model step came from the preloaded journal
    robot.run("two", conversation_id="c1")
    from robot_lab.runtime.conversations import ConversationStore

    users = [m["content"] for m in ConversationStore().load("reader", "c1") if m.get("role") == "user"]
    assert [u.rsplit("\n", 1)[-1] for u in users] == ["one", "two"]  # the history read ahead was continued

def test_learnings_read_ahead_but_not_used_are_not_kept_for_the_next_run(redis_client: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    robot = robot_lab.build(name="forgetful")
    robot_lab.build(name="forgetful").learn("old lesson")

    def fail(self: Any, message: Any) -> Any:
        raise RuntimeError("failed before the learnings were read")

    from robot_lab.runtime.robot.learning import Learning

    inject = Learning.inject
    monkeypatch.setattr(Learning, "inject", fail)
    with pytest.raises(RuntimeError):
        robot.run("one", conversation_id="c1")
    monkeypatch.setattr(Learning, "inject", inject)
    robot_lab.build(name="forgetful").learn("a completely different lesson")
    reply = robot.run("two").reply  # no conversation: nothing read ahead for this run
    assert "a completely different lesson" in reply  # read afresh, not what the failed run read ahead
