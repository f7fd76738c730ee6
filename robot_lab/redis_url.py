"""Redis URL parsing and redaction, apart from the client factory so that settings can tell
a cluster URL without importing :mod:`robot_lab.connection` (which reads settings).

Passwords never reach a log line: use :func:`redact_url` for anything printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from robot_lab.errors import ConfigurationError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss", "unix")
_BOOL_TRUE = {"1", "true", "yes", "on"}

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
    _, userinfo, rest = split_userinfo(url)  # the password is taken out before urlsplit sees it
    parts = urlsplit(f"{scheme}://{rest}")
    hostlist = parts.netloc
    username, password = _credentials(userinfo) if userinfo is not None else (None, None)
    if scheme in PLAIN_SCHEMES:
        return _parse_plain(url, scheme, parts, hostlist, username, password)
    hosts = tuple(_host_port(item, url, 26379 if scheme in SENTINEL_SCHEMES else 6379)
                  for item in hostlist.split(",") if item.strip())
    if not hosts:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: no host given")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    path = [p for p in parts.path.split("/") if p]
    service = None
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
    db = _db_number(db_part, url)
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


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, pw = userinfo.partition(":")
    if not colon:  # "redis://secret@host" -> a password, as redis-py reads it
        return None, unquote(user) or None
    return unquote(user) or None, unquote(pw)


def _db_number(text: str, url: str) -> int:
    try:
        db = int(text)
    except ValueError:
        raise ConfigurationError(
            f"Redis URL {redact_url(url)!r}: database {text!r} is not a number (redis://host:6379/0)"
        ) from None
    if db < 0:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: database {db} is negative")
    return db


def _parse_plain(url: str, scheme: str, parts: Any, hostlist: str, username: str | None,
                 password: str | None) -> RedisURL:
    """``redis://``, ``rediss://`` and ``unix://``: checked here, so that a typo fails with a
    clear line instead of being read as database 0 (``redis://host/abc``) or failing deep in
    redis-py. The client is still built by redis-py's own ``from_url``."""
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if scheme == "unix":
        if hostlist:
            raise ConfigurationError(
                f"Redis URL {redact_url(url)!r}: a unix:// URL names a socket path, not a host "
                "(unix:///run/redis.sock?db=0 or unix://:password@/run/redis.sock)"
            )
        if not parts.path or parts.path == "/":
            raise ConfigurationError(f"Redis URL {redact_url(url)!r}: no socket path (unix:///run/redis.sock)")
        db = _db_number(options.get("db", "0"), url)
        return RedisURL(kind="standalone", scheme=scheme, db=db, username=username, password=password,
                        options=options)
    if "," in hostlist:
        raise ConfigurationError(
            f"Redis URL {redact_url(url)!r}: several hosts need redis+sentinel:// or redis+cluster://"
        )
    host, port = _host_port(hostlist, url, 6379) if hostlist.strip() else ("localhost", 6379)
    path = [p for p in parts.path.split("/") if p]
    if len(path) > 1:
        raise ConfigurationError(f"Redis URL {redact_url(url)!r}: path {parts.path!r} is not a database number")
    db = _db_number(path[0] if path else options.get("db", "0"), url)
    return RedisURL(kind="standalone", scheme=scheme, hosts=((host, port),), db=db, username=username,
                    password=password, ssl=scheme == "rediss", options=options)


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


# The userinfo ends at the last "@" after which the host list (no "@", "/", "?" or "#")
# runs up to a path, query, fragment or the end: so a raw "/", "#", "?", "@" or ":" inside a
# password is still part of the password, for parsing and redaction alike.
_AFTER_USERINFO = re.compile(r"[^@/?#]*(?:[/?#].*)?", re.S)
_QUERY_SECRET = re.compile(r"([?&](?:sentinel_)?password=)[^&#]*")


def split_userinfo(url: str) -> tuple[str, str | None, str]:
    """``(scheme, userinfo or None, rest)`` of ``scheme://[userinfo@]rest``.

    A query value may hold an "@" too (``?password=a@b``), so an "@" whose userinfo would
    contain a ``password=`` query parameter is not taken as the end of the userinfo.
    """
    scheme, rest = url.split("://", 1)
    best = None
    for i, char in enumerate(rest):
        if char == "@" and _AFTER_USERINFO.fullmatch(rest, i + 1) and not _QUERY_SECRET.search(rest[:i]):
            best = i
    if best is None:
        return scheme, None, rest
    return scheme, rest[:best], rest[best + 1:]


def redact_url(url: str | None) -> str:
    """``url`` with any password replaced by ``***`` (safe to log or print): the userinfo
    password (the user name is kept) and ``password=`` / ``sentinel_password=`` values."""
    if not url or "://" not in url:
        return url or ""
    scheme, userinfo, rest = split_userinfo(url)
    rest = _QUERY_SECRET.sub(r"\1***", rest)
    if userinfo is None:
        return f"{scheme}://{rest}"
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user + ':***' if colon else '***'}@{rest}"


def scrub(text: str, url: str | None) -> str:
    """``text`` (an error message from a library that saw ``url``) with ``url`` and every
    secret of it, raw or percent-decoded, replaced: safe to show."""
    if not url or "://" not in url:
        return text
    text = text.replace(url, redact_url(url))
    scheme, userinfo, rest = split_userinfo(url)
    secrets = [m.group(0).split("=", 1)[1] for m in _QUERY_SECRET.finditer(rest)]
    if userinfo is not None:
        secrets.append(userinfo.partition(":")[2] if ":" in userinfo else userinfo)
    for secret in sorted({s for raw in secrets for s in (raw, unquote(raw)) if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_cluster_url(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0].lower() in CLUSTER_SCHEMES  # type: ignore[union-attr]
