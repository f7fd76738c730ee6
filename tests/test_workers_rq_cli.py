"""A 3-robot network on three separate, unmodified `rq worker` processes (the real rq CLI)
against a real Redis, compared with the same network in embedded mode."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.worker_procs import VENV_BIN, child_env, processes, uid, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow


def three_robot_network(suffix: str):
    net = create_network("three")
    net.task("draft", build(f"drafter-{suffix}", model="scripted/text:draft v1"))
    net.task("review", build(f"reviewer-{suffix}", model="scripted/echo"), depends_on="draft")
    net.task("publish", build(f"publisher-{suffix}", model="scripted/echo"), depends_on=["draft", "review"])
    return net


def test_three_robots_on_three_plain_rq_workers_match_embedded_mode(real_redis_url, key_prefix, monkeypatch,
                                                                     processes):  # noqa: F811
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    suffix = uid()
    net = three_robot_network(suffix)
    robots = sorted({t.robot for t in net.spec.tasks})
    env = child_env(real_redis_url, key_prefix)
    for name in robots:
        # the unmodified rq CLI, no flags: `rq worker robot:<name> --url ...`
        processes.start([str(VENV_BIN / "rq"), "worker", f"robot:{name}", "--url", real_redis_url], env, name)
    client = redis.Redis.from_url(real_redis_url)
    try:
        wait_for_workers(client, [f"robot:{r}" for r in robots], timeout=60)
        handle = Coordinator(connection=client).submit(net, "write the post")
        try:
            distributed = handle.wait(timeout=90)
        except Exception:
            print(processes.logs())
            raise
        embedded = three_robot_network(suffix).run("write the post", connection=fakeredis.FakeRedis())
        assert distributed.status == embedded.status == "completed"
        assert distributed.reply == embedded.reply == "echo: ## draft\ndraft v1\n\n## review\necho: draft v1"
        assert {k: v.reply for k, v in distributed.context.items()} == {k: v.reply for k, v in embedded.context.items()}
        workers = {e.task: e.data["worker"] for e in handle.events() if e.event == "task.started"}
        assert len(set(workers.values())) == 3  # each task ran in its own rq worker process
    finally:
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def test_a_worker_with_a_foreign_serializer_fails_the_task_clearly(real_redis_url, key_prefix,
                                                                   monkeypatch, processes):  # noqa: F811
    """A worker started with `-S json` cannot decode robot-lab's data-only pickle jobs; the
    sweeper turns the DeserializationError into a failed task instead of a hanging run."""
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    bot = build(f"jsonworker-{uid()}", model="scripted/echo")
    net = create_network("plain")
    net.task("only", bot)
    env = child_env(real_redis_url, key_prefix)
    processes.start([str(VENV_BIN / "rq"), "worker", "-S", "json", f"robot:{bot.name}", "--url", real_redis_url],
                    env, "json")
    client = redis.Redis.from_url(real_redis_url)
    try:
        wait_for_workers(client, [f"robot:{bot.name}"], timeout=30)
        result = Coordinator(connection=client).submit(net, "hi").wait(timeout=60)
        assert result.states == {"only": "failed"}
        error = result["only"].error
        assert "DeserializationError" in error and "rq worker robot:<name>" in error
    finally:
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
