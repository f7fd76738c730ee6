"""Redis at scale: URL forms for TLS, ACL users, Sentinel and Cluster (parsing and the client
each one builds; no sentinel or cluster runs here, so nothing connects), key hash tags from
settings, and passwords never printed."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

from robot_lab import connection
from robot_lab.connection import cluster_kwargs, connect, parse_redis_url, redact_url, sentinel_kwargs
from robot_lab.errors import ConfigurationError
from robot_lab.keys import default_keys


def test_rediss_url_builds_an_ssl_connection_with_acl_user_without_connecting():
    client = connect("rediss://app-user:s3cret@redis.example.com:6380/3?ssl_cert_reqs=required")
    pool = client.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)  # with the handshake under the connect timeout
    kw = pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("redis.example.com", 6380, 3)
    assert (kw["username"], kw["password"]) == ("app-user", "s3cret")
    assert kw["protocol"] == 2 and kw["socket_timeout"] is None


def test_plain_url_with_acl_user():
    kw = connect("redis://worker:pw@10.0.0.5:6379/0").connection_pool.connection_kwargs
    assert (kw["username"], kw["password"], kw["host"]) == ("worker", "pw", "10.0.0.5")


def test_sentinel_url_parses_hosts_service_db_and_auth():
    parsed = parse_redis_url("redis+sentinel://app:p%40ss@s1:26379,s2:26380,s3/mymaster/2"
                             "?sentinel_password=sentpw&socket_connect_timeout=2")
    assert parsed.kind == "sentinel" and not parsed.ssl
    assert parsed.hosts == (("s1", 26379), ("s2", 26380), ("s3", 26379))
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == ("mymaster", 2, "app", "p@ss")
    conn, sentinel = sentinel_kwargs(parsed)
    assert conn["db"] == 2 and conn["password"] == "p@ss" and conn["socket_connect_timeout"] == 2.0
    assert sentinel["password"] == "sentpw" and "username" not in sentinel
    assert "sentpw" not in repr(parsed) and "p@ss" not in repr(parsed)


def test_sentinel_client_is_a_master_pool_and_tls_variant_uses_ssl_connections():
    client = connect("redis+sentinel://app:pw@s1:26379,s2:26379/mymaster/1")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster" and pool.is_master
    assert pool.connection_class is SentinelManagedConnection
    assert pool.connection_kwargs["db"] == 1 and pool.connection_kwargs["username"] == "app"
    assert [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"])
            for c in pool.sentinel_manager.sentinels] == [("s1", 26379), ("s2", 26379)]
    tls = connect("rediss+sentinel://s1/mymaster").connection_pool
    assert tls.connection_class is SentinelManagedSSLConnection
    assert tls.sentinel_manager.sentinels[0].connection_pool.connection_class is redis.SSLConnection


def test_sentinel_password_only_userinfo():
    parsed = parse_redis_url("redis+sentinel://onlypw@s1/mymaster")
    assert parsed.username is None and parsed.password == "onlypw" and parsed.db == 0


def test_cluster_url_kwargs():
    parsed = parse_redis_url("rediss+cluster://app:pw@c1:7000,c2:7001")
    assert parsed.cluster and parsed.ssl
    kw = cluster_kwargs(parsed)
    assert [(n.host, n.port) for n in kw["startup_nodes"]] == [("c1", 7000), ("c2", 7001)]
    assert (kw["username"], kw["password"], kw["ssl"], kw["protocol"]) == ("app", "pw", True, 2)


def test_cluster_connect_passes_startup_nodes(monkeypatch):
    seen = {}

    class FakeCluster:
        def __init__(self, **kw):
            seen.update(kw)

    from robot_lab import connection

    monkeypatch.setattr(connection, "RedisCluster", FakeCluster)  # the name connect() calls
    connect("redis+cluster://c1:7000")
    assert [(n.host, n.port) for n in seen["startup_nodes"]] == [("c1", 7000)]


@pytest.mark.parametrize("url, message", [
    ("localhost:6379", "has no scheme"),
    ("http://localhost", "unknown scheme 'http'"),
    ("redis+sentinel://s1:26379", "name the Sentinel service"),
    ("redis+sentinel://s1:abc/mymaster", "bad port"),
    ("redis+sentinel://s1/mymaster/x", "database 'x' is not a number"),
    ("redis+cluster://c1:7000/3", "only database 0"),
    ("redis+cluster://:secretpw@c1:7000?bogus=1", "option 'bogus' is not supported"),
])
def test_bad_urls_name_the_problem_and_hide_the_password(url, message):
    with pytest.raises(ConfigurationError) as info:
        if "bogus" in url:
            cluster_kwargs(parse_redis_url(url))
        else:
            parse_redis_url(url)
    assert message in str(info.value)
    assert "secretpw" not in str(info.value)


@pytest.mark.parametrize("url, expected", [
    ("redis://user:hunter2@h:6379/0", "redis://user:***@h:6379/0"),
    ("rediss://:hunter2@h", "rediss://:***@h"),
    ("redis+sentinel://hunter2@s1,s2/m?sentinel_password=hunter2&x=1", "redis+sentinel://***@s1,s2/m?sentinel_password=***&x=1"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_default_keys_use_hash_tags_with_cluster_setting_or_url(monkeypatch):
    from robot_lab import settings

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", "p")
    assert default_keys().inbox("billing") == "p:bus:billing"
    monkeypatch.setenv("ROBOT_LAB_CLUSTER", "true")
    settings.reload_settings()
    assert default_keys().inbox("billing") == "p:bus:{billing}"
    assert default_keys().run("r1") == "p:run:{r1}"
    monkeypatch.delenv("ROBOT_LAB_CLUSTER")
    monkeypatch.setenv("REDIS_URL", "redis+cluster://c1:7000")
    settings.reload_settings()
    assert default_keys().cluster


def test_get_redis_caches_per_url(monkeypatch):
    monkeypatch.setattr(connection, "_clients", {})
    a = connection.get_redis("redis+sentinel://s1/mymaster")
    assert connection.get_redis("redis+sentinel://s1/mymaster") is a


@pytest.mark.parametrize("url, message", [
    ("redis://:secretpw@h:6379/0?bogus=1", "unknown option 'bogus'"),
    ("redis://h:6379/0?socket_timout=1", "unknown option 'socket_timout' (did you mean 'socket_timeout'?)"),
    ("unix:///run/redis.sock?db=0&ssl_certfile=x", "unknown option 'ssl_certfile'"),
])
def test_an_unknown_query_option_of_a_plain_url_is_named_before_connecting(url, message):
    """redis-py passes unknown options on as keywords: a TypeError at the first command."""
    with pytest.raises(ConfigurationError) as info:
        connect(url)
    assert message in str(info.value) and "secretpw" not in str(info.value)


def test_known_query_options_of_a_plain_url_are_taken():
    client = connect("redis://h:6379/0?socket_timeout=2&max_connections=5&client_name=rl&health_check_interval=3")
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 2.0
