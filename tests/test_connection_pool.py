"""One client, many threads: a worker with hundreds of runs in flight holds that many Redis
connections at once. redis-py 8's pools refuse more than 100 ("Too many connections"); the
clients robot-lab builds (robot_lab/connection.py) allow the server's default maxclients."""

from __future__ import annotations

import threading
import uuid

from robot_lab.connection import SYNC_MAX_CONNECTIONS, connect, embedded_client


def test_150_threads_block_on_one_client_at_the_same_time(real_redis_url: str) -> None:
    client = connect(real_redis_url)
    key = f"pool-test-{uuid.uuid4().hex}"
    start = threading.Barrier(150, timeout=30)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            start.wait()
            assert client.blpop([key], timeout=1) is None  # each holds a connection for 1 s
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(150)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(client.connection_pool._available_connections) >= 150  # all were open at once
    client.close()


def test_every_sync_client_kind_gets_the_large_pool() -> None:
    assert connect("redis://127.0.0.1:1/0").connection_pool.max_connections == SYNC_MAX_CONNECTIONS
    assert embedded_client().connection_pool.max_connections == SYNC_MAX_CONNECTIONS
    sentinel = connect("redis+sentinel://127.0.0.1:1/mymaster")
    assert sentinel.connection_pool.max_connections == SYNC_MAX_CONNECTIONS


def test_new_connections_do_not_read_package_metadata(real_redis_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """redis-py >= 7 reads its version from the installed package for every connection it
    opens unless given a DriverInfo; robot-lab's clients share one, made once."""
    import redis.utils

    calls: list[int] = []
    real = redis.utils.get_lib_version
    monkeypatch.setattr(redis.utils, "get_lib_version", lambda: calls.append(1) or real())
    client = connect(real_redis_url)
    pool = client.connection_pool
    held = [pool.get_connection() for _ in range(20)]  # twenty connections, opened
    for connection in held:
        pool.release(connection)
    assert client.ping() and calls == []
    assert pool.connection_kwargs["driver_info"].formatted_name.startswith("redis-py(robot-lab_v")
    client.close()
