"""Shared fixtures. Every Redis-backed test that takes ``redis_client`` runs twice: on
in-process fakeredis and on a real server (see tests/redis_server.py for where it comes from).

The suite runs on pytest-xdist workers (``-n auto --dist loadfile`` in pyproject.toml; ``-n 0``
runs it in one process): each test file runs whole, in order, on one worker, so a module
fixture starts once, and each worker has its own Redis database (tests/redis_server.py).
Process-wide state a test may change (settings, logging) is put back after every test: which
files share a worker process differs from run to run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Iterator

import pytest

# Offline by default: no model request may leave the machine, no cost map download.
os.environ["ROBOT_LAB_ALLOW_MODEL_REQUESTS"] = "0"
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("ROBOT_LAB_LOG_FORMAT", "json")
# A failing scripted model is retried as a provider would be (3 retries, 1 s backoff doubling:
# 7 s per call); tests about those delays pass their own values to LLMGateway.
os.environ.setdefault("ROBOT_LAB_RETRY_INTERVAL", "0.01")
for _key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "ROBOT_LAB_MODEL", "REDIS_URL",
             "ROBOT_LAB_REDIS_URL", "ROBOT_LAB_APP"):
    os.environ.pop(_key, None)

from tests import hardened  # noqa: E402
from tests.redis_cluster import RedisCluster, SentinelSet  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

_server = RedisServer()
_profile: dict[str, object] = {"unavailable": "", "state": None}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--profile", choices=hardened.PROFILES, default="default",
                     help="default: as a developer runs it; hardened: only the process-level tests, each process "
                          "logged in as its own Redis ACL user, signing.verify=require with keys mounted at "
                          "/etc/robot-lab/keys, the sandbox on (tests/hardened.py, docs/contributing.md)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("profile") == "hardened":
        if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
            return  # the xdist controller runs no test: each worker makes its own server (ACL users are per server)
        reason = hardened.unavailable(shutil.which("redis-server"))
        url = None if reason else _server.start(private=True, password=secrets.token_urlsafe(24))
        if url:
            os.environ["ROBOT_LAB_TEST_REDIS_URL"] = url
            _profile["state"] = hardened.prepare(url)
            return
        _profile["unavailable"] = reason or f"no private redis-server: {_server.reason}"
    _server.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    _server.stop()
    state = _profile["state"]
    if isinstance(state, hardened.State):
        if not os.environ.get("RL_TEST_PROFILE_KEEP"):
            shutil.rmtree(state.work_dir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    hardened.select(items, config, str(_profile["unavailable"]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Hardened profile: a failed test's report names what Redis refused the processes' users
    (``ACL LOG``: user, command, key), and each test starts with an empty log."""
    report = yield
    state = _profile["state"]
    if isinstance(state, hardened.State) and call.when in ("setup", "call", "teardown"):
        if call.when == "setup":
            hardened.acl_denials(state.admin_url, reset=True)
        elif report.failed:
            denied = hardened.acl_denials(state.admin_url)
            if denied:
                report.sections.append(("Redis ACL denials (hardened profile)", "\n".join(denied)))
    return report


def pytest_report_header(config: pytest.Config) -> list[str]:
    profile = config.getoption("profile")
    lines = [f"robot-lab: test profile {profile}"
             + (" (process-level tests only; tests/hardened.py)" if profile == "hardened" else "")]
    if _profile["unavailable"]:
        lines.append(f"robot-lab: hardened profile UNAVAILABLE, its tests skip: {_profile['unavailable']}")
    if _server.url:
        workers = " (xdist worker gwN: database + N)" if getattr(config.option, "numprocesses", None) else ""
        lines.append(f"robot-lab: real Redis tests use {hardened.redact(_server.url)}{workers}")
    elif profile == "default":
        lines.append(f"robot-lab: real Redis tests SKIPPED ({_server.reason})")
    return lines


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one xdist worker per CPU plus one, at most 8. Much of the suite waits on
    worker processes, servers and timeouts, so one worker more than there are CPUs fills
    those waits; more than that overloads the CPUs and the tests that run real fleets with
    short leases or a Sentinel failover start to miss their deadlines (on 2 CPUs: 3 workers
    ran the suite in 141 s, 4 in 147 s with a lease lost to a starved worker).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return min((os.cpu_count() or 1) + 1, 8)


@pytest.fixture
def real_redis_url() -> str:
    """URL of a real Redis server (skips when none could be found or started)."""
    if not _server.url:
        pytest.skip(f"real Redis unavailable: {_server.reason}")
    return _server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A real 3-primary / 3-replica Redis Cluster on loopback for the session (started on
    first use, ~2 s; skips when redis-server / redis-cli are missing)."""
    cluster = RedisCluster()
    if not cluster.start():
        pytest.skip(f"Redis Cluster unavailable: {cluster.reason}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def sentinel_set() -> Iterator[SentinelSet]:
    """A fresh primary + replica + three sentinels (the failover test kills the primary)."""
    servers = SentinelSet()
    if not servers.start():
        pytest.skip(f"Sentinel set unavailable: {servers.reason}")
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(autouse=True)
def _isolated_settings(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees its own HOME (no user config file leaks in) and fresh settings."""
    from robot_lab import settings

    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(settings, "_settings", None)
    from robot_lab import connection

    # a task run in-process on a real Redis makes that client the default of a process with no
    # REDIS_URL (connection.adopt_default): it must not outlive the test that ran it
    monkeypatch.setattr(connection, "_clients", dict(connection._clients))
    yield
    monkeypatch.setattr(settings, "_settings", None)


@pytest.fixture(autouse=True)
def _isolated_logging() -> Iterator[None]:
    """Each test leaves structlog as it found it: the CLI run in-process (CliRunner) configures
    logging at WARNING, which would hide the info lines a later test in the same process
    captures."""
    import structlog

    from robot_lab import logging as robot_logging

    config, configured, applied = structlog.get_config(), robot_logging._configured, robot_logging._applied
    yield
    structlog.configure(**config)
    robot_logging._configured, robot_logging._applied = configured, applied


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A unique key prefix so tests sharing a real server never see each other's keys; what
    the test left under it on the real server is deleted afterwards (:func:`_forget`)."""
    prefix = f"rltest-{uuid.uuid4().hex[:10]}"
    yield prefix
    if _server.url:
        _forget(prefix)


def _forget(prefix: str) -> None:
    """Delete a test's keys from the real server, which may be shared with other users: the
    keys under its prefix, and -- rq's keys are not prefixed -- the rq queues, jobs and
    registries of the robots it registered or ran a network on. Runs after the test's other
    fixtures (its worker processes are gone)."""
    import json

    import redis
    from rq import Queue

    conn = redis.Redis.from_url(_server.url)
    try:
        robots = {r.decode() for r in conn.smembers(f"{prefix}:robots")}
        for graph in conn.scan_iter(match=f"{prefix}:run:*:graph", count=1000):
            for raw in conn.hvals(graph):
                try:
                    robots.add(str(json.loads(raw)["robot"]))
                except (ValueError, KeyError, TypeError):
                    pass
        for robot in robots:
            Queue(f"robot:{robot}", connection=conn).delete(delete_jobs=True)
            rq_keys = list(conn.scan_iter(match=f"rq:*:robot:{robot}", count=1000))
            if rq_keys:
                conn.delete(*rq_keys)
        keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
    except redis.RedisError:
        pass  # the test stopped the server, or it is gone: nothing left to clean there
    finally:
        conn.close()


@pytest.fixture
def real_client(real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A client of the real server, with this process and its child processes pointed at it
    (``REDIS_URL``) under the test's unique key prefix; the prefix's keys and the rq queues
    of its robots are deleted afterwards (``key_prefix``: rq keys are not prefixed)."""
    import redis

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    conn = redis.Redis.from_url(real_redis_url)
    yield conn
    conn.close()  # the key_prefix fixture deletes what the test left


@pytest.fixture(params=["fake", "real"])
def redis_client(request: pytest.FixtureRequest, key_prefix: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A Redis client: fakeredis (with Lua) and, when available, a real server.

    Also points the process settings at the same place and the unique ``key_prefix``.
    """
    import fakeredis
    import redis

    from robot_lab import connection

    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    if request.param == "fake":
        server = fakeredis.FakeServer()
        client = fakeredis.FakeRedis(server=server)
        monkeypatch.setattr(connection, "_embedded_server", server)
        monkeypatch.setattr(connection, "_clients", {})
        yield client
        client.close()
        return
    if not _server.url:
        pytest.skip(f"real Redis unavailable: {_server.reason}")
    monkeypatch.setenv("REDIS_URL", _server.url)
    monkeypatch.setattr(connection, "_clients", {})
    client = redis.Redis.from_url(_server.url, protocol=2)
    yield client
    client.close()  # the key_prefix fixture deletes this test's keys (the server may be shared)


@pytest.fixture
def memory_spans():  # type: ignore[no-untyped-def]
    """This process traces into an in-memory exporter for the test, then stops tracing
    (skips without the [otel] extra)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the [otel] extra is not installed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from robot_lab.observability import otel

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.configure(provider)
    try:
        yield exporter
    finally:
        otel.configure(None)
        otel.reset()


@pytest.fixture(scope="session")
def test_profile(pytestconfig: pytest.Config) -> str:
    """The profile this session runs in: ``default`` or ``hardened`` (``--profile``)."""
    return str(pytestconfig.getoption("profile"))


@pytest.fixture
def hardened_state(test_profile: str) -> hardened.State:
    """The hardened profile's keys and passwords folders (skips in the default profile)."""
    state = _profile["state"]
    if test_profile != "hardened" or not isinstance(state, hardened.State):
        pytest.skip("checks the hardened profile itself (run with --profile=hardened)")
    return state
