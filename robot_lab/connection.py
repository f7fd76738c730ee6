"""One way to get a Redis client: a real server from ``REDIS_URL``, or the embedded
in-process fakeredis when no URL is set (robot-lab's embedded default mode).

Clients keep RESP2 and ``decode_responses=False``: stream entries carry JSON bytes, and rq
needs raw bytes on the same connection.

URL forms (see docs/operations.md, "Redis at scale"):

* ``redis://[[user]:password@]host[:port][/db]`` -- plain; ``user`` is a Redis 6 ACL user;
* ``rediss://...`` -- the same over TLS (``?ssl_cert_reqs=required&ssl_ca_certs=/path``);
* ``unix:///path/redis.sock?db=0``;
* ``redis+sentinel://[[user]:password@]host:26379[,host2:26379...]/service[/db]`` -- the
  master of ``service`` found through Sentinel; ``rediss+sentinel://`` for TLS. The userinfo
  authenticates against the data nodes; ``?sentinel_username=&sentinel_password=`` against
  the sentinels themselves;
* ``redis+cluster://[[user]:password@]host:port[,host2:port...]`` -- Redis Cluster
  (``rediss+cluster://`` for TLS). Keys of one robot / run then share a hash slot
  (``Keys(cluster=True)``, chosen automatically by :func:`robot_lab.keys.default_keys`).

Passwords never reach a log line: use :func:`redact_url` for anything printed.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import weakref
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import (BlockingConnectionPool, Connection, ConnectionPool, SSLConnection,
                              UnixDomainSocketConnection)
from redis.sentinel import Sentinel

from robot_lab.errors import ConfigurationError
from robot_lab.redis_url import (  # noqa: F401  (re-exported: the public names live here too)
    CLUSTER_SCHEMES,
    PLAIN_SCHEMES,
    SENTINEL_SCHEMES,
    RedisURL,
    is_cluster_url,
    parse_redis_url,
    redact_url,
    scrub,
    split_userinfo,
)
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from typing import TypeAlias

    # What robot-lab calls a ``connection``: a redis-py client (fakeredis's FakeRedis is a
    # subclass) or a Redis Cluster client.
    RedisClient: TypeAlias = "redis.Redis | RedisCluster"
    # Their asyncio counterparts (``aconnect``, ``async_client_for``, ``Bus.aredis``).
    AsyncRedisClient: TypeAlias = "redis.asyncio.Redis | AsyncRedisCluster"

_embedded_lock = threading.Lock()
_embedded_server: Any = None
_clients: dict[str, redis.Redis] = {}

# Query parameters passed on to the connections of sentinel/cluster URLs (typed).
_FLOAT_OPTIONS = {"socket_connect_timeout", "socket_timeout", "health_check_interval"}
_STR_OPTIONS = {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "client_name", "ssl_ca_path"}


def embedded_server() -> Any:
    """The process-wide fakeredis server shared by every embedded client (with Lua)."""
    global _embedded_server
    with _embedded_lock:
        if _embedded_server is None:
            import fakeredis  # lazy: start-up time

            _embedded_server = fakeredis.FakeServer()
        return _embedded_server


def embedded_client() -> redis.Redis:
    import fakeredis  # lazy: start-up time

    return fakeredis.FakeRedis(server=embedded_server(), max_connections=SYNC_MAX_CONNECTIONS)


# Connections of one asyncio client: redis-py's asyncio pool raises "Too many connections"
# past its limit (100), and every task in a blocking read (arequest's XREAD BLOCK, aget)
# holds one. robot-lab's asyncio clients use a *blocking* pool this large instead: a task
# past the limit waits for a free connection rather than failing.
ASYNC_MAX_CONNECTIONS = 1000
# Connections of one sync client. redis-py 8's pool raises "Too many connections" past 100
# (redis-py <= 6 had no limit), and a worker with more runs in flight than that holds more at
# once: 200 in-flight bus messages failed handlers with MaxConnectionsError. The ceiling is
# the server's default ``maxclients`` instead.
SYNC_MAX_CONNECTIONS = 10_000


def embedded_async_client(server: Any = None) -> Any:
    """An asyncio fakeredis client on the embedded server (or ``server``): it sees exactly
    what the sync embedded clients see."""
    import fakeredis.aioredis  # lazy: start-up time
    from redis.asyncio import BlockingConnectionPool  # lazy: start-up time

    return fakeredis.aioredis.FakeRedis(server=server if server is not None else embedded_server(),
                                        connection_pool_class=BlockingConnectionPool,
                                        max_connections=ASYNC_MAX_CONNECTIONS, timeout=None)


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    # redis-py 8 defaults to RESP3 and a 5 s socket timeout; robot-lab keeps RESP2 shapes,
    # and blocking reads (memory waits, XREAD BLOCK) must not trip a socket timeout.
    kwargs.setdefault("protocol", 2)
    kwargs.setdefault("socket_timeout", None)
    kwargs.setdefault("socket_connect_timeout", _connect_timeout())
    kwargs.setdefault("socket_keepalive", True)
    # ...so a peer that vanished without closing (a failed-over host, a partition) must be
    # noticed by TCP keepalive: ~30 s here instead of the kernel's default two hours.
    if hasattr(socket, "TCP_KEEPIDLE"):
        kwargs.setdefault("socket_keepalive_options",
                          {socket.TCP_KEEPIDLE: 15, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3})
    kwargs.setdefault("health_check_interval", 30)
    info = _driver_info()
    if info is not None:
        kwargs.setdefault("driver_info", info)
    return kwargs


def _connect_timeout() -> float:
    return float(get_settings().redis_connect_timeout)


class HandshakeTimedSSLConnection(redis.SSLConnection):
    """redis-py's TLS connection, with the handshake bounded by the connect timeout: redis-py
    does it under the (unbounded) command timeout, so ``rediss://`` against a plain Redis
    port, or a stalled TLS peer, hung every command instead of failing."""

    def _wrap_socket_with_ssl(self, sock: Any) -> Any:
        sock.settimeout(self.socket_connect_timeout)
        wrapped = super()._wrap_socket_with_ssl(sock)
        wrapped.settimeout(self.socket_timeout)
        return wrapped


_DRIVER_INFO: list[Any] = []


def _driver_info() -> Any:
    """One ``DriverInfo`` (redis-py >= 7) for every connection robot-lab opens.

    Without it, redis-py builds one per new connection, and that reads redis-py's version
    from the installed package's metadata (``importlib.metadata``, an e-mail header parser):
    in a worker opening 200 connections for its first burst of in-flight runs, a fifth of
    that burst's CPU. ``CLIENT LIST`` shows ``lib-name=redis-py(robot-lab_v<version>)`` (Redis >= 7.2)."""
    if not _DRIVER_INFO:
        try:
            from redis.driver_info import DriverInfo  # redis-py >= 7 only (ImportError below)
        except ImportError:  # redis-py < 7: the version is read once, at import
            _DRIVER_INFO.append(None)
            return None
        try:
            ours = version("robot-lab")
        except PackageNotFoundError:
            ours = "0"
        _DRIVER_INFO.append(DriverInfo().add_upstream_driver("robot-lab", ours))
    return _DRIVER_INFO[0]


def _typed_options(parsed: RedisURL) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parsed.options.items():
        if key in _FLOAT_OPTIONS:
            out[key] = float(value)
        elif key in _STR_OPTIONS:
            out[key] = value
        elif key in ("sentinel_username", "sentinel_password"):
            continue
        else:
            raise ConfigurationError(f"Redis URL option {key!r} is not supported for {parsed.scheme}:// URLs")
    return out


def sentinel_kwargs(parsed: RedisURL, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(connection kwargs of the master, kwargs of the sentinel connections)."""
    conn = _defaults({**_typed_options(parsed), **kwargs})
    conn.update(db=parsed.db, username=parsed.username, password=parsed.password)
    if parsed.ssl:
        conn["ssl"] = True
    sentinel = {"socket_timeout": 5.0, "protocol": 2}
    if parsed.options.get("sentinel_username"):
        sentinel["username"] = parsed.options["sentinel_username"]
    if parsed.options.get("sentinel_password"):
        sentinel["password"] = parsed.options["sentinel_password"]
    if parsed.ssl:
        sentinel["ssl"] = True
        for key in ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if key in conn:
                sentinel[key] = conn[key]
    return conn, sentinel


def cluster_kwargs(parsed: RedisURL, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for ``redis.cluster.RedisCluster`` (startup nodes, auth, TLS)."""
    conn = _defaults({**_typed_options(parsed), **kwargs})
    conn.pop("health_check_interval", None)  # per-node pools manage their own checks
    conn.update(username=parsed.username, password=parsed.password,
                startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts])
    if parsed.ssl:
        conn["ssl"] = True
    return conn


def connect(url: str | None = None, **kwargs: Any) -> redis.Redis:
    """A new client for ``url`` (any form in the module docstring); embedded if None.

    Sentinel clients resolve the master on each new connection (failover is followed);
    cluster clients are ``redis.cluster.RedisCluster`` and need every multi-key operation
    inside one hash slot, which robot-lab's key layout guarantees with ``Keys(cluster=True)``.
    """
    if not url:
        return embedded_client()
    client = _checked_connect(url, kwargs, aio=False)
    client._robot_lab_source = (url, dict(kwargs))  # type: ignore[union-attr]  # for async_twin()
    return client


def aconnect(url: str | None = None, **kwargs: Any) -> Any:
    """:func:`connect` on redis-py's asyncio client (``redis.asyncio``): the same URL forms,
    options and defaults; embedded fakeredis (sharing the sync clients' server) if None.
    Use it from one event loop (asyncio connections belong to the loop that opened them)."""
    if not url:
        return embedded_async_client()
    return _checked_connect(url, kwargs, aio=True)


def _checked_connect(url: str, kwargs: dict[str, Any], *, aio: bool) -> Any:
    try:
        return _connect(url, parse_redis_url(url), dict(kwargs), aio=aio)
    except ConfigurationError:
        raise
    except (ValueError, TypeError) as exc:
        # redis-py's URL errors quote parts of the URL, password included: translate them.
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: {scrub(str(exc), url)}") from None


def _check_standalone_options(url: str, parsed: RedisURL) -> None:
    """A query option redis-py's connection does not take is refused here, naming it: redis-py
    would pass it on as a keyword and fail with a TypeError at the first command."""
    if not parsed.options:  # nothing to check: no signatures walked on every connect (start-up time)
        return
    import difflib  # lazy: start-up time

    kind = UnixDomainSocketConnection if parsed.scheme == "unix" else SSLConnection if parsed.ssl else Connection
    known = {"db"}
    for cls in (*kind.__mro__, ConnectionPool, BlockingConnectionPool):  # the pool takes max_connections
        init = cls.__dict__.get("__init__")
        if init is not None:
            known |= {name for name, p in inspect.signature(init).parameters.items()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self"}
    for key in parsed.options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see redis-py's connection options"
            raise ConfigurationError(f"Redis URL {redact_url(url)!r}: unknown option {key!r} ({hint})")


def _connect(url: str, parsed: RedisURL, kwargs: dict[str, Any], *, aio: bool = False) -> Any:
    if aio:
        import redis.asyncio as flavour  # the asyncio flavour (aio=True)
        from redis.asyncio.cluster import ClusterNode as AsyncClusterNode  # the asyncio flavour (aio=True)
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel  # the asyncio flavour (aio=True)
    else:
        flavour = redis  # type: ignore[assignment]
    if parsed.kind == "standalone":
        _check_standalone_options(url, parsed)
        # READONLY: the host behind the URL was demoted by a failover (DNS of a managed
        # Redis moves to the new primary). Retrying it drops the connection, so the next one
        # resolves the name again (robot_lab/outage.py rides out the rest).
        kwargs.setdefault("retry_on_error", [redis.exceptions.ReadOnlyError])
        options = _defaults(kwargs)
        if parsed.scheme == "unix":  # a unix socket has no TCP keepalive (redis-py rejects the option)
            options.pop("socket_keepalive", None)
            options.pop("socket_keepalive_options", None)
        # redis-py gets the URL without its userinfo (its parser breaks on a "/", "#" or "?"
        # in a password) and the credentials robot-lab parsed as arguments.
        scheme, userinfo, rest = split_userinfo(url)
        if userinfo is not None:
            options.update(username=parsed.username, password=parsed.password)
        if aio:
            options.setdefault("max_connections", ASYNC_MAX_CONNECTIONS)
            options.setdefault("timeout", None)  # wait for a free connection as long as it takes
            pool = flavour.BlockingConnectionPool.from_url(f"{scheme}://{rest}", **options)
            client = flavour.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True
            return client
        options.setdefault("max_connections", SYNC_MAX_CONNECTIONS)
        if scheme == "rediss":
            options.setdefault("connection_class", HandshakeTimedSSLConnection)
        return flavour.Redis.from_url(f"{scheme}://{rest}", **options)
    if parsed.kind == "sentinel":
        conn, sentinel = sentinel_kwargs(parsed, **kwargs)
        if aio:
            conn.setdefault("max_connections", ASYNC_MAX_CONNECTIONS)
            return AsyncSentinel(list(parsed.hosts), sentinel_kwargs=sentinel, **conn).master_for(parsed.service)
        conn.setdefault("max_connections", SYNC_MAX_CONNECTIONS)
        return Sentinel(list(parsed.hosts), sentinel_kwargs=sentinel, **conn).master_for(parsed.service)

    options = cluster_kwargs(parsed, **kwargs)
    if aio:
        options["startup_nodes"] = [AsyncClusterNode(n.host, n.port) for n in options["startup_nodes"]]
        return AsyncRedisCluster(**options)
    options.setdefault("max_connections", SYNC_MAX_CONNECTIONS)  # per node
    client = RedisCluster(**options)
    # what robot_lab.rq_connection needs to open a plain connection to one node
    client._robot_lab_node_kwargs = {k: v for k, v in options.items() if k != "startup_nodes"}
    return client  # type: ignore[return-value]


# Connection options an asyncio twin of a hand-made sync client copies (the rest -- retry
# objects, pool handlers -- are sync-only objects).
_TWIN_OPTIONS = ("host", "port", "path", "db", "username", "password", "socket_timeout", "socket_connect_timeout",
                 "socket_keepalive", "socket_keepalive_options", "health_check_interval", "client_name", "protocol",
                 "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_check_hostname",
                 "decode_responses", "encoding", "encoding_errors")


def async_twin(client: Any) -> Any:
    """A new asyncio client to the server of the sync ``client``: the embedded fakeredis
    server it uses, the URL and options :func:`connect` built it from, or (a plain
    ``redis.Redis`` made by hand) its connection options."""
    pool = getattr(client, "connection_pool", None)
    options = dict(getattr(pool, "connection_kwargs", None) or {})
    if "server" in options:  # fakeredis: the same in-process server
        return embedded_async_client(options["server"])
    source = getattr(client, "_robot_lab_source", None)
    if source is not None:
        url, kwargs = source
        return aconnect(url, **kwargs)
    if not isinstance(client, redis.Redis) or "host" not in options and "path" not in options:
        raise ConfigurationError(
            f"cannot derive an asyncio client from {type(client).__name__}: build it with "
            "robot_lab.connection.connect(url), or pass the asyncio client yourself (aredis=...)"
        )

    # type(v) is object: redis-py's "unset" sentinel (socket_keepalive_options)
    kwargs = {k: options[k] for k in _TWIN_OPTIONS if k in options and type(options[k]) is not object}
    connection_class = getattr(pool, "connection_class", None)
    if connection_class is not None and issubclass(connection_class, redis.UnixDomainSocketConnection):
        kwargs["connection_class"] = aredis.UnixDomainSocketConnection
    elif connection_class is not None and issubclass(connection_class, redis.SSLConnection):
        kwargs["connection_class"] = aredis.SSLConnection
    else:
        kwargs.pop("path", None)
    kwargs.update(max_connections=ASYNC_MAX_CONNECTIONS, timeout=None)
    return aredis.Redis(connection_pool=aredis.BlockingConnectionPool(**kwargs))


# Loops that take no attributes (uvloop's): their twins live here instead.
_twins: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def async_client_for(client: Any) -> Any:
    """The asyncio twin of ``client`` for the running event loop (one per client and loop:
    asyncio connections cannot move between loops). The twins hang on the loop object, so
    a closed, unreferenced loop is collected with its clients."""
    loop = asyncio.get_running_loop()
    per_loop = getattr(loop, "_robot_lab_twins", None)
    if per_loop is None:
        per_loop = {}
        try:
            loop._robot_lab_twins = per_loop  # type: ignore[attr-defined]
        except AttributeError:
            per_loop = _twins.setdefault(loop, per_loop)
    entry = per_loop.get(id(client))
    if entry is None or entry[0] is not client:
        entry = per_loop[id(client)] = (client, async_twin(client))
    return entry[1]


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` is redis-py's ``RedisCluster`` (its pipelines refuse scripts and
    keyless commands go to a node of its choosing)."""
    return type(client).__module__.startswith("redis.cluster")


def mget(client: Any, keys: list[str]) -> list[Any]:
    """MGET that also works on Redis Cluster, where ``keys`` may sit in different slots
    (redis-py's ``mget_nonatomic`` splits them by slot; no atomicity is needed by callers)."""
    many = getattr(client, "mget_nonatomic", None)
    return many(keys) if many is not None else client.mget(keys)


def waits_for_replicas(client: Any) -> bool:
    """Whether :func:`durable` adds a WAIT for ``client``'s writes."""
    return int(get_settings().redis_wait_replicas) > 0 and not is_cluster_client(client) \
        and not type(client).__module__.startswith("fakeredis")


def durable(client: Any, write: Any) -> Any:
    """``write(target)`` -- one write queued on ``target`` -- made durable per the
    ``redis_wait_replicas`` setting: the write and a ``WAIT <replicas> <timeout>`` go in one
    pipeline, so they share a connection (WAIT counts the replicas that acknowledged *this
    connection's* writes). Returns the write's result. When fewer replicas acknowledged in
    time, the write stands and ``redis.replication_lag`` is logged: WAIT narrows the window
    in which a failover loses an acknowledged write, it does not make replication
    synchronous.

    Off (a plain call) when the setting is 0, on the embedded fakeredis, and on Redis
    Cluster clients: redis-py's cluster pipeline sends a keyless WAIT to a node of its
    choosing, not over the connection that wrote."""
    settings = get_settings()
    replicas = int(settings.redis_wait_replicas)
    if replicas <= 0 or is_cluster_client(client) or type(client).__module__.startswith("fakeredis"):
        return write(client)
    pipe = client.pipeline(transaction=False)
    write(pipe)
    pipe.execute_command("WAIT", replicas, int(settings.redis_wait_timeout_ms))
    result, acked = pipe.execute()
    if int(acked) < replicas:
        from robot_lab.logging import get_logger  # lazy: start-up time

        get_logger("robot_lab.redis").warning("redis.replication_lag", wanted=replicas, acked=int(acked),
                                              timeout_ms=int(settings.redis_wait_timeout_ms))
    return result


def get_redis(url: str | None = None) -> redis.Redis:
    """A shared client per URL (clients are thread-safe connection pools)."""
    if url is None:
        url = get_settings().redis_url
    key = url or "embedded"
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = connect(url)
    return client


def adopt_default(client: Any) -> None:
    """Make ``client`` what :func:`get_redis` returns in a process configured with no Redis
    URL (no ``REDIS_URL``), unless that process already has its default.

    A worker started with ``robot-lab worker --url URL`` or ``rq worker --url URL`` and no
    ``REDIS_URL`` takes its jobs and messages from URL, but everything a robot reaches
    through the default client -- its own memory and learnings, conversations, a served
    robot's inbox registration -- went to an in-process fakeredis of its own: lost with the process, shared with no other
    worker, and its first use imported fakeredis and numpy (~0.3 s of CPU) under a task's
    lease. The worker's Redis is the one its runs live on, as the embedded mode's worker
    is the embedded server. A configured ``REDIS_URL`` is left alone (it names the default)."""
    _clients.setdefault("embedded", client)


def reset_embedded() -> None:
    """Forget the embedded server and cached clients (tests, ``demo`` reruns)."""
    global _embedded_server
    with _embedded_lock:
        _embedded_server = None
    _clients.clear()
