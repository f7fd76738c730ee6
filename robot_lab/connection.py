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

import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis

from .errors import ConfigurationError

_embedded_lock = threading.Lock()
_embedded_server: Any = None
_clients: dict[str, redis.Redis] = {}

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss", "unix")
_BOOL_TRUE = {"1", "true", "yes", "on"}
# Query parameters passed on to the connections of sentinel/cluster URLs (typed).
_FLOAT_OPTIONS = {"socket_connect_timeout", "socket_timeout", "health_check_interval"}
_STR_OPTIONS = {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "client_name", "ssl_ca_path"}


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


@dataclass(frozen=True)
class RedisURL:
    """A parsed Redis URL. ``kind`` is ``standalone``, ``sentinel`` or ``cluster``."""

    kind: str
    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl: bool = False
    options: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def cluster(self) -> bool:
        return self.kind == "cluster"


def parse_redis_url(url: str) -> RedisURL:
    """Parse any supported URL; a malformed one raises ConfigurationError naming the part
    (with the password masked)."""
    if not url or "://" not in url:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r} has no scheme (expected redis://host:6379/0)")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in (*PLAIN_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES):
        raise ConfigurationError(
            f"Redis URL {redact_url(url)!r}: unknown scheme {scheme!r} (use redis, rediss, unix, "
            "redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster)"
        )
    if scheme in PLAIN_SCHEMES:
        return RedisURL(kind="standalone", scheme=scheme, ssl=scheme == "rediss")
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
        if not colon:  # "redis+sentinel://secret@host" -> a password, as redis-py reads it
            username, password = None, unquote(user) or None
    hosts = tuple(_host_port(item, url, 26379 if scheme in SENTINEL_SCHEMES else 6379)
                  for item in hostlist.split(",") if item.strip())
    if not hosts:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: no host given")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    path = [p for p in parts.path.split("/") if p]
    service = None
    db = 0
    if scheme in SENTINEL_SCHEMES:
        if not path:
            raise ConfigurationError(
                f"Redis URL {redact_url(url)!r}: name the Sentinel service, e.g. "
                "redis+sentinel://host:26379/mymaster/0"
            )
        service = unquote(path[0])
        db_part = path[1] if len(path) > 1 else options.pop("db", "0")
    else:
        db_part = path[0] if path else options.pop("db", "0")
    try:
        db = int(db_part)
    except ValueError:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: database {db_part!r} is not a number") from None
    if scheme in CLUSTER_SCHEMES and db != 0:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: Redis Cluster has only database 0")
    return RedisURL(
        kind="sentinel" if scheme in SENTINEL_SCHEMES else "cluster",
        scheme=scheme,
        hosts=hosts,
        service=service,
        db=db,
        username=username,
        password=password,
        ssl=scheme.startswith("rediss") or options.pop("ssl", "").lower() in _BOOL_TRUE,
        options=options,
    )


def _host_port(item: str, url: str, default_port: int) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [::1]:26379
        host, _, rest = item[1:].partition("]")
        port_text = rest.lstrip(":")
    else:
        host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: bad host {item!r}")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: bad port in {item!r}") from None
    return host, port


def redact_url(url: str | None) -> str:
    """``url`` with any password replaced by ``***`` (safe to log or print)."""
    if not url or "://" not in url:
        return url or ""
    scheme, rest = url.split("://", 1)
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:***" if colon else "***"
        netloc = f"{userinfo}@{hosts}"
    if "password=" in tail:
        import re

        tail = re.sub(r"(password=)[^&]*", r"\1***", tail)
    return f"{scheme}://{netloc}{slash}{tail}"


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    # redis-py 8 defaults to RESP3 and a 5 s socket timeout; the brief keeps RESP2 shapes,
    # and blocking reads (memory waits, XREAD BLOCK) must not trip a socket timeout.
    kwargs.setdefault("protocol", 2)
    kwargs.setdefault("socket_timeout", None)
    kwargs.setdefault("socket_keepalive", True)
    kwargs.setdefault("health_check_interval", 30)
    return kwargs


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
    from redis.cluster import ClusterNode

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
    parsed = parse_redis_url(url)
    if parsed.kind == "standalone":
        return redis.Redis.from_url(url, **_defaults(kwargs))
    if parsed.kind == "sentinel":
        from redis.sentinel import Sentinel

        conn, sentinel = sentinel_kwargs(parsed, **kwargs)
        return Sentinel(list(parsed.hosts), sentinel_kwargs=sentinel, **conn).master_for(parsed.service)
    from redis.cluster import RedisCluster

    return RedisCluster(**cluster_kwargs(parsed, **kwargs))  # type: ignore[return-value]


def is_cluster_url(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0].lower() in CLUSTER_SCHEMES  # type: ignore[union-attr]


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
