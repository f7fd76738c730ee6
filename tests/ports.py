"""Free loopback ports for the servers tests start (Redis, Redis Cluster, dashboards,
metrics endpoints, MCP and A2A servers, provider stubs): the one place tests ask for one."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on now, chosen by the OS.

    The probe socket is closed again before the caller binds, so another process may take
    the port in between: callers start their server on it at once (and tests that want a
    port where nothing listens use it as it is)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
