"""Find or start a real Redis for the tests.

Order: ``ROBOT_LAB_TEST_REDIS_URL`` if set; else a private ``redis-server`` on a free
loopback port when the binary exists (stopped at the end of the session); else None, and
tests marked ``real_redis`` skip saying why.

Under pytest-xdist the controller finds or starts the server (its workers inherit
``ROBOT_LAB_TEST_REDIS_URL``) and worker ``gwN`` uses database ``base + N`` of it: rq's
keys (queues ``robot:<name>``, ``rq:workers``, registries) carry no key prefix, so two
tests running at once on one database would see each other's queues and workers. A worker
that cannot have a database of its own there starts a private server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.ports import free_port


def worker_database(url: str) -> str | None:
    """``url`` with its database moved to ``base + N`` under pytest-xdist worker ``gwN``:
    ``url`` itself outside xdist, None for a URL with no numbered database to move
    (``redis+sentinel://``, ``redis+cluster://``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return url
    offset = int(worker[2:])
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss") and (parts.path.strip("/") or "0").isdigit():
        return urlunsplit(parts._replace(path=f"/{int(parts.path.strip('/') or 0) + offset}"))
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        if str(query.get("db", "0")).isdigit():
            query["db"] = str(int(query.get("db", 0)) + offset)
            return f"{url.split('?', 1)[0]}?{urlencode(query)}"
    return None


def _selectable(url: str) -> bool:
    """Whether the server of ``url`` answers on the database it names."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.ResponseError:  # "DB index is out of range"
        return False
    except redis.RedisError:
        return True  # unreachable: the tests say so themselves, as without xdist
    finally:
        client.close()
    return True


class RedisServer:
    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self.reason = ""
        self.dir: str | None = None

    def bench_url(self, url: str | None) -> str:
        """A benchmark's Redis: ``url`` (its ``--url`` / REDIS_URL) when given, else a private
        server started here (``stop()`` it after); exits saying why when neither is there."""
        found = url or self.start(private=True)
        if not found:
            raise SystemExit(f"no --url, no REDIS_URL and no private server: {self.reason}")
        return found

    def start(self, *, private: bool = False, password: str | None = None) -> str | None:
        """The test server's URL; ``private=True`` always starts a new server (for tests that
        change server-wide state, such as ACL users) and leaves the environment alone;
        ``password`` is the ``default`` user's (``requirepass``), in the URL returned."""
        url = None if private else os.environ.get("ROBOT_LAB_TEST_REDIS_URL")
        if url:
            own = worker_database(url)
            if own is not None and (own == url or _selectable(own)):
                self.url = own
                return own
            # no database of its own for this xdist worker there (a cluster or sentinel URL,
            # or fewer databases than workers): a private server
        binary = shutil.which("redis-server")
        if not binary:
            self.reason = "no ROBOT_LAB_TEST_REDIS_URL and no redis-server binary on PATH"
            return None
        port = free_port()
        self.dir = tempfile.mkdtemp(prefix="robot-lab-redis-")
        self.process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, *(["--requirepass", password] if password else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    self.url = f"redis://{f'default:{password}@' if password else ''}127.0.0.1:{port}/0"
                    if not private:
                        os.environ["ROBOT_LAB_TEST_REDIS_URL"] = self.url
                    return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        self.reason = "redis-server did not start within 10 s"
        return None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.02):  # type: ignore[no-untyped-def]
    """Poll until ``predicate()`` is truthy; return its value or raise AssertionError.

    ``timeout`` bounds a wait for an event that never comes, not how long it should take: on
    a loaded 2-core machine a process start, a stop or a thread's turn has taken tens of
    seconds, so waits keep this default unless the event is known to take longer."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


REPO_ROOT = Path(__file__).resolve().parent.parent
