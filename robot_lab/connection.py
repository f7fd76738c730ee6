"""One way to get a Redis client: a real server from ``REDIS_URL``, or the embedded
in-process fakeredis when no URL is set (robot-lab's embedded default mode).

Clients keep RESP2 and ``decode_responses=False``: stream entries carry JSON bytes, and rq
needs raw bytes on the same connection.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

_embedded_lock = threading.Lock()
_embedded_server: Any = None
_clients: dict[str, redis.Redis] = {}


def embedded_server() -> Any:
    """The process-wide fakeredis server shared by every embedded client (with Lua)."""
    global _embedded_server
    with _embedded_lock:
        if _embedded_server is None:
            import fakeredis

            _embedded_server = fakeredis.FakeServer()
        return _embedded_server


def embedded_client() -> redis.Redis:
    import fakeredis

    return fakeredis.FakeRedis(server=embedded_server())


def connect(url: str | None = None, **kwargs: Any) -> redis.Redis:
    """A new client for ``url`` (``redis://``, ``rediss://``, ``unix://``); embedded if None."""
    if not url:
        return embedded_client()
    # redis-py 8 defaults to RESP3 and a 5 s socket timeout; the brief keeps RESP2 shapes,
    # and blocking reads (memory waits, XREAD BLOCK) must not trip a socket timeout.
    kwargs.setdefault("protocol", 2)
    kwargs.setdefault("socket_timeout", None)
    kwargs.setdefault("socket_keepalive", True)
    kwargs.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(url, **kwargs)


def get_redis(url: str | None = None) -> redis.Redis:
    """A shared client per URL (clients are thread-safe connection pools)."""
    if url is None:
        from .settings import get_settings

        url = get_settings().redis_url
    key = url or "embedded"
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = connect(url)
    return client


def reset_embedded() -> None:
    """Forget the embedded server and cached clients (tests, ``demo`` reruns)."""
    global _embedded_server
    with _embedded_lock:
        _embedded_server = None
    _clients.clear()
