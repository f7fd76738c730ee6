"""A worker told its Redis only by ``--url`` (no REDIS_URL in its environment) keeps what its
robots reach through the default client on that Redis, not in an in-process fakeredis of its
own (connection.adopt_default): here a served robot's inbox and its own memory; a network's
budget shared by two such workers: tests/test_network_budget_procs.py."""

from __future__ import annotations

import pytest
import redis

from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, child_env, delete_prefix, processes, wait_for_workers  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_a_robot_served_by_a_worker_given_only_a_url_keeps_its_memory_on_that_redis(real_redis_url, key_prefix,
                                                                                     monkeypatch, processes):  # noqa: F811
    """The robot's own memory (``robot.memory``, scope ``robot:<name>``: "shared by all workers
    of that robot") written by a tool while the worker serves a bus message."""
    from robot_lab.bus import Bus
    from robot_lab.keys import Keys
    from robot_lab.memory.store import Memory
    from tests.fixtures.noter import APP

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    keys = Keys(prefix=key_prefix)
    env = child_env(real_redis_url, key_prefix)
    del env["REDIS_URL"]
    processes.start([str(VENV_BIN / "robot-lab"), "worker", "noter", "--app", APP, "--url", real_redis_url],
                    env, "noter")
    client = redis.Redis.from_url(real_redis_url)
    try:
        wait_for_workers(client, ["robot:noter"], timeout=90)
        wait_for(lambda: client.exists(keys.inbox("noter")), timeout=60, interval=0.1)  # the bus poller's inbox
        reply = Bus(client, keys=keys).request("noter", "take a note", timeout=60)
        assert reply.content.startswith("echo: take a note") and "noted" in reply.content, reply.content
        assert Memory.for_robot("noter", redis=client, keys=keys).get("noted") == "a"
    except Exception:
        print(processes.logs())
        raise
    finally:
        delete_prefix(client, key_prefix)
        client.close()
