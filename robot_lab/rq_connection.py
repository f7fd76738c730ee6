"""The connection rq gets on Redis Cluster: a plain client of the primary that owns rq's slot.

rq is not cluster-aware (it uses ``pipeline.explicit_transaction``, MULTI/WATCH and Lua
scripts that build key names), so it cannot take a ``RedisCluster`` client. With
``RQ_KEY_PREFIX={rq}`` every rq key shares one hash slot, so rq can run unchanged on a plain
connection to the primary that serves that slot. This module makes that connection and
keeps it pointed at the slot's owner: every new socket asks the cluster client which node
serves the slot, and a failed connect refreshes the cluster's slot map first, so after a
failover the next reconnect lands on the promoted replica.

robot-lab's own keys (runs, bus, memory) live in other slots: code that receives rq's
connection (an rq job) gets the cluster client back with :func:`data_connection`.

Consequence, documented in docs/operations.md: all of rq (queues, jobs, registries) sits on
ONE primary of the cluster; the bus, run state, memory and budgets spread over all of them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import redis
from redis.connection import Connection, SSLConnection

from robot_lab.connection import is_cluster_client
from robot_lab.errors import ConfigurationError

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

_TAG = re.compile(r"\{([^}]+)\}")


def rq_prefix() -> str:
    from rq.defaults import RQ_KEY_PREFIX  # lazy: start-up time

    return RQ_KEY_PREFIX


class _SlotOwnerMixin:
    """Connects to the node serving ``slot_key``'s slot, asked anew on every connect."""

    def __init__(self, *, cluster: Any, slot_key: str, **kwargs: Any) -> None:
        self._cluster = cluster
        self._slot_key = slot_key
        self._refresh = False
        super().__init__(host="127.0.0.1", port=6379, **kwargs)  # type: ignore[call-arg]

    def _connect(self) -> Any:
        manager = self._cluster.nodes_manager
        if self._refresh:
            manager.initialize()
        node = manager.get_node_from_slot(self._cluster.keyslot(self._slot_key))
        self.host, self.port = node.host, node.port  # type: ignore[attr-defined]
        try:
            sock = super()._connect()  # type: ignore[misc]
        except (OSError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self._refresh = True  # the owner is gone: re-read the slot map next time
            raise
        self._refresh = False
        return sock


class _SlotOwnerConnection(_SlotOwnerMixin, Connection):
    pass


class _SlotOwnerSSLConnection(_SlotOwnerMixin, SSLConnection):
    pass


def rq_connection(connection: RedisClient) -> Any:
    """The client to hand rq: ``connection`` itself unless it is a ``RedisCluster``; then a
    plain client of the primary serving rq's slot (one per cluster client, cached on it).

    Raises ConfigurationError when ``RQ_KEY_PREFIX`` has no hash tag: rq's keys would then
    spread over slots and its transactions fail with CROSSSLOT."""
    if not is_cluster_client(connection):
        return connection
    cached = getattr(connection, "_robot_lab_rq", None)
    if cached is not None:
        return cached
    prefix = rq_prefix()
    if not _TAG.search(prefix):
        raise ConfigurationError(
            f"Redis Cluster needs RQ_KEY_PREFIX with a hash tag (RQ_KEY_PREFIX='{{rq}}'), not {prefix!r}: "
            "set it in the environment of every process, before rq is imported")
    kwargs = dict(getattr(connection, "_robot_lab_node_kwargs", {}))
    cls = _SlotOwnerSSLConnection if kwargs.pop("ssl", False) else _SlotOwnerConnection
    pool = redis.ConnectionPool(connection_class=cls, cluster=connection, slot_key=prefix + ":queue:x", **kwargs)
    client = redis.Redis(connection_pool=pool)
    client._robot_lab_data = connection  # type: ignore[attr-defined]
    connection._robot_lab_rq = client  # type: ignore[union-attr]
    return client


def data_connection(connection: RedisClient) -> Any:
    """The client for robot-lab's own keys behind a connection rq was given (the cluster
    client for a connection made by :func:`rq_connection`, else the same connection)."""
    return getattr(connection, "_robot_lab_data", connection)
