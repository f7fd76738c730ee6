"""learn() with robot_lab's dedupe, shared through Redis memory; delegation in process."""

from __future__ import annotations

import pytest

import robot_lab
from robot_lab.errors import DelegationTimeout
from robot_lab.runtime.delegation import DelegationFuture
from robot_lab.runtime.robot import Robot


def test_learn_dedupes_and_is_injected(redis_client) -> None:
    robot = robot_lab.build(name="student")
    robot.learn("refunds need an order id")
    robot.learn("refunds need an order id and a reason")  # contains the first: replaces it
    robot.learn("order id")  # contained in an existing one: dropped
    robot.learn("   ")
    assert robot.learnings == ["refunds need an order id and a reason"]
    reply = robot.run("help me").reply
    assert reply.startswith("echo: LEARNINGS FROM PREVIOUS RUNS:\n- refunds need an order id and a reason\n\nhelp me")


def test_learnings_are_shared_by_robots_of_the_same_name(redis_client) -> None:
    robot_lab.build(name="shared-learner").learn("always greet")
    other = Robot("shared-learner")  # e.g. the same robot on another worker
    assert "LEARNINGS FROM PREVIOUS RUNS:\n- always greet" in other.run("hi").reply


def test_delegate_sync_and_async_in_process() -> None:
    boss = robot_lab.build(name="boss")
    helper = robot_lab.build(name="helper", model="scripted/text:done it")
    result = boss.delegate(helper, "do the thing")
    assert result.reply == "done it" and result.delegated_by == "boss"
    future = boss.delegate(helper, "again", async_=True)
    assert isinstance(future, DelegationFuture)
    assert future.value(timeout=30).reply == "done it" and future.resolved


def test_future_timeout_and_error_re_raised() -> None:
    future = DelegationFuture("slowpoke")
    with pytest.raises(DelegationTimeout, match="Delegation to 'slowpoke' timed out after 0.05s"):
        future.value(timeout=0.05)
    future.reject(ValueError("bad"))
    for _ in range(2):
        with pytest.raises(ValueError, match="bad"):
            future.value(timeout=1)


SERVE = """
import sys, threading
import robot_lab
from robot_lab.bus import BusPoller
robot = robot_lab.build(name=sys.argv[1], model="scripted/text:remote answer")
poller = BusPoller(sys.argv[1], block_ms=100)
poller.serve(robot)
poller.start()  # registers the inbox before it returns
print("ready", flush=True)
threading.Event().wait()
"""


def test_delegate_async_to_a_robot_served_by_another_process(real_redis_url, key_prefix, monkeypatch) -> None:
    import os
    import subprocess
    import sys
    import uuid

    from robot_lab.bus import Bus

    monkeypatch.setenv("REDIS_URL", real_redis_url)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    from robot_lab import connection

    monkeypatch.setattr(connection, "_clients", {})
    name = f"remote-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    worker = subprocess.Popen([sys.executable, "-c", SERVE, name], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        boss = robot_lab.build(name="boss")
        future = boss.delegate(name, "please answer", async_=True, timeout=60)
        result = future.value(timeout=60)
        assert result.reply == "remote answer" and result.delegated_by == "boss"

        Bus().register("idle-robot-" + name)  # known robot, but no worker serves it
        late = boss.delegate("idle-robot-" + name, "anyone?", async_=True, timeout=0.5)
        with pytest.raises(DelegationTimeout, match=r"Delegation to 'idle-robot-.*' timed out after 0.5s"):
            late.value(timeout=10)
    finally:
        worker.kill()
        worker.wait()


def test_conversation_history_is_continued_by_another_robot_instance(redis_client) -> None:
    first = robot_lab.build(name="support", system_prompt="Be brief.")
    first.run("my name is Ada", conversation_id="c-42")
    second = Robot("support", system_prompt="Be brief.")  # another worker, fresh object
    second.run("what is my name?", conversation_id="c-42")
    from robot_lab.runtime.conversations import ConversationStore

    history = ConversationStore().load("support", "c-42")
    assert [m["content"] for m in history if m["role"] == "user"] == ["my name is Ada", "what is my name?"]
    assert second.messages == [{"role": "system", "content": "Be brief."}]  # the robot's own chat untouched
    assert ConversationStore().load("support", "other") == []


def test_compress_history_drops_drifted_turns_and_fires_hooks() -> None:
    from robot_lab.runtime.rails.hooks import Hook

    seen: list[int] = []

    class Watch(Hook):
        @classmethod
        def after_compaction(cls, ctx):
            seen.append(len(ctx.compacted_messages))

    robot = robot_lab.build(name="chatty", hooks=[Watch])
    robot.replace_messages(
        [{"role": "user", "content": "tell me about medieval castle architecture and moats"}]
        + [{"role": "user", "content": f"python asyncio event loop question number {i} about tasks"} for i in range(8)]
    )
    robot.compress_history()
    assert all("castle" not in m["content"] for m in robot.messages)
    assert seen == [8]
    hits = robot.search_history("asyncio tasks", limit=2)
    assert len(hits) == 2 and "asyncio" in hits[0].text


def test_serving_robot_keeps_conversation_history_across_pollers(redis_client) -> None:
    from robot_lab.bus import Bus, BusPoller
    from robot_lab.runtime.conversations import ConversationStore

    bus = Bus()
    first = BusPoller("concierge", bus, block_ms=0).serve(robot_lab.build(name="concierge"))
    second = BusPoller("concierge", bus, consumer="other", block_ms=0).serve(robot_lab.build(name="concierge"))
    bus.publish("concierge", "my name is Ada", conversation_id="t-1", from_="client", reply_to="client", create=True)
    assert first.poll(max_messages=1, block_ms=0) == 1
    bus.publish("concierge", "what is my name?", conversation_id="t-1", from_="client", reply_to="client")
    assert second.poll(max_messages=1, block_ms=0) == 1
    users = [m["content"] for m in ConversationStore().load("concierge", "t-1") if m["role"] == "user"]
    assert users == ["my name is Ada", "what is my name?"]


def test_a_failing_remote_delegatee_fails_the_future_fast(redis_client) -> None:
    from robot_lab.bus import BusPoller
    from robot_lab.llm.gateway import LLMGateway

    broken = robot_lab.build(name="fragile-remote", model="scripted/fail:model down")
    broken._gateway = LLMGateway(max_retries=0)
    poller = BusPoller("fragile-remote", max_deliveries=2, retry_delay=0.01, block_ms=50,
                       visibility_timeout=5).serve(broken)
    poller.start()
    try:
        future = robot_lab.build(name="boss").delegate("fragile-remote", "please", async_=True, timeout=60)
        with pytest.raises(robot_lab.InferenceError, match="Delegation to 'fragile-remote' failed: .*model down"):
            future.value(timeout=60)
    finally:
        poller.stop()
