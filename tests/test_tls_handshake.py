"""``rediss://`` against a plain Redis port (a TLS handshake nobody answers) fails within the
connect timeout with one clear line, instead of hanging every command
(robot_lab/connection.py, HandshakeTimedSSLConnection)."""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import redis

from robot_lab.connection import aconnect, connect
from tests.worker_procs import VENV_BIN, child_env


def _tls_url(real_redis_url: str) -> str:
    return "rediss://" + real_redis_url.split("://", 1)[1]


def _outcome(call: Any) -> list[Any]:
    """Run ``call`` on a thread; what it raised, or 'hung' when it had not ended after 60 s."""
    seen: list[Any] = []

    def run() -> None:
        try:
            call()
            seen.append("answered")
        except Exception as exc:  # noqa: BLE001
            seen.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    return seen or ["hung"]


def test_rediss_on_a_plain_port_fails_instead_of_hanging(real_redis_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_REDIS_CONNECT_TIMEOUT", "0.5")
    from robot_lab.settings import reload_settings

    reload_settings()
    url = _tls_url(real_redis_url)
    [sync] = _outcome(lambda: connect(url).ping())
    assert isinstance(sync, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)), sync

    import asyncio

    async def aping() -> None:
        client = aconnect(url)
        try:
            await client.ping()
        finally:
            await client.aclose()

    [asynchronous] = _outcome(lambda: asyncio.run(aping()))
    assert isinstance(asynchronous, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, TimeoutError)), \
        asynchronous


def test_the_cli_says_so_in_one_line(real_redis_url: str, key_prefix: str) -> None:
    env = child_env(_tls_url(real_redis_url), key_prefix, ROBOT_LAB_REDIS_CONNECT_TIMEOUT="0.5")
    done = subprocess.run([str(VENV_BIN / "robot-lab"), "status"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot reach Redis at rediss://" in done.stderr and "TLS" in done.stderr
