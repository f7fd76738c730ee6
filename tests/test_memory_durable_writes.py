"""``redis_wait_replicas``: critical writes (a task's recorded result, memory compare-and-set)
WAIT for replicas on the connection that wrote them (robot_lab.connection.durable)."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from robot_lab.connection import durable
from robot_lab.keys import Keys
from robot_lab.memory import Memory

pytestmark = pytest.mark.real_redis


def test_off_by_default_and_on_fakeredis(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fakeredis.FakeRedis()
    assert durable(fake, lambda target: target.set("k", "v")) is True
    monkeypatch.setenv("ROBOT_LAB_REDIS_WAIT_REPLICAS", "1")
    assert durable(fake, lambda target: target.incr("n")) == 1  # no WAIT on the embedded server


def test_a_write_stands_and_lag_is_logged_when_no_replica_acknowledges(
        real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ROBOT_LAB_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("ROBOT_LAB_REDIS_WAIT_TIMEOUT_MS", "20")
    client = redis.Redis.from_url(real_redis_url)
    memory = Memory(f"durable-{key_prefix}", redis=client, keys=Keys(prefix=key_prefix))
    assert memory.update("n", lambda v: (v or 0) + 1) == 1  # compare-and-set goes through durable()
    assert memory.get("n") == 1
    err = capsys.readouterr().err
    assert '"event": "redis.replication_lag"' in err and '"acked": 0' in err
    memory.destroy()


def test_wait_counts_the_replica_that_has_the_write(redis_cluster, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """On a plain connection to a primary with a replica (one of the session cluster's
    primaries), the write is on the replica when durable() returns."""
    from robot_lab.connection import connect

    monkeypatch.setenv("ROBOT_LAB_REDIS_WAIT_REPLICAS", "1")
    monkeypatch.setenv("ROBOT_LAB_REDIS_WAIT_TIMEOUT_MS", "10000")  # WAIT returns at the ack; a loaded box is slow
    cluster = connect(redis_cluster.url)
    key = "durable-key"
    owner = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key))
    [replica] = [p for p in redis_cluster.replicas()
                 if redis.Redis(port=p).info("replication")["master_port"] == owner.port]
    primary = redis.Redis(port=owner.port)
    assert durable(primary, lambda target: target.set(key, "v")) is True
    reader = redis.Redis(port=replica, single_connection_client=True)
    reader.execute_command("READONLY")  # a cluster replica serves reads only when asked to
    assert reader.get(key) == b"v"  # already on the replica
    assert "redis.replication_lag" not in capsys.readouterr().err
