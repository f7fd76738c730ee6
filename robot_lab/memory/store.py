"""Shared memory in Redis: the Ruby gem's reactive Memory, made to work across processes.

A scope (``run:<id>``, ``network:<name>``, ``robot:<name>`` or any name you give) is one
Redis hash of JSON values plus a version counter, a capped change stream and a pub/sub
channel (key names in :class:`robot_lab.keys.Keys`, gathered per scope in
:class:`~.scope.ScopeKeys`).

:class:`Memory` is the public face; the work is done by small parts, one job each:

* :mod:`.values` -- reads and writes (one Lua script per write, :mod:`.lua`);
* :mod:`.scope` -- the scope's keys and its change log (version, change stream, cursors);
* :mod:`.feed` and :mod:`.listener` -- the background thread that turns notifications into
  wake-ups and callbacks, falling back to the change stream whenever pub/sub may have
  dropped something;
* :mod:`.waits` -- blocking reads; :mod:`.subscriptions` -- callbacks;
* :mod:`.reserved` -- the Ruby gem's reserved keys.

See docs/memory.md for the guarantees and the deliberate differences from robot_lab.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.connection import async_client_for, get_redis
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.memory.feed import Feed
from robot_lab.memory.listener import Listener
from robot_lab.memory.reserved import (
    RESERVED_KEYS,
    DataProxy,
    MemoryValueError,
    ReservedKeyError,
    decode_messages,
    decode_results,
    normalize_message,
    normalize_result,
)
from robot_lab.memory.scope import ChangeLog, ScopeKeys
from robot_lab.memory.subscriptions import Subscriptions, glob_to_regex
from robot_lab.memory.values import Values
from robot_lab.memory.waits import await_for, wait_for
from robot_lab.memory.writer import Writer, writing_as
from robot_lab.schemas import MemoryChange, RobotResult
from robot_lab.schemas.messages import Message

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

__all__ = ["BROADCAST_KEY", "RESERVED_KEYS", "Memory", "MemoryValueError", "ReservedKeyError", "resolve_memory"]

BROADCAST_KEY = "_network_broadcast"
DEFAULT_CHANGES_MAXLEN = 10_000



class Memory:
    """Key/value memory of one scope, shared by every process that names the same scope.

    ``redis`` defaults to :func:`robot_lab.connection.get_redis` (a real server from
    ``REDIS_URL`` or the embedded fakeredis) and ``keys`` to the configured key layout.
    """

    RESERVED_KEYS = RESERVED_KEYS

    def __init__(
        self,
        scope: str,
        *,
        redis: RedisClient | None = None,
        keys: Keys | None = None,
        network_name: str | None = None,
        writer: str | None = None,
        changes_maxlen: int = DEFAULT_CHANGES_MAXLEN,
        poll_interval: float = 1.0,
        listener_idle_timeout: float | None = 30.0,
    ) -> None:
        if not isinstance(scope, str) or not scope.strip():
            raise ConfigurationError(f"memory scope must be a non-empty string, got {scope!r}")
        if changes_maxlen < 1:
            raise ConfigurationError(f"memory {scope!r}: changes_maxlen must be >= 1, got {changes_maxlen}")
        if redis is None:
            redis = get_redis()
        self.scope = scope
        self.redis = redis
        self.keys_layout = keys or default_keys()
        self.network_name = network_name
        self._writer_of = Writer(writer)
        self.changes_maxlen = changes_maxlen
        self.poll_interval = poll_interval
        self.listener_idle_timeout = listener_idle_timeout
        scope_keys = ScopeKeys.of(self.keys_layout, scope)
        self._values = Values(redis, scope_keys, network_name=network_name, changes_maxlen=changes_maxlen,
                              writer=self._writer_of)
        self._log = ChangeLog(redis, scope_keys)
        self._feed = Feed(self._log, poll_interval=poll_interval, idle_timeout=listener_idle_timeout)
        self._subs = Subscriptions(self._feed, scope)

    # --- constructors for the usual scopes ----------------------------------------------
    @classmethod
    def for_run(cls, run_id: str, *, network_name: str | None = None, **kwargs: Any) -> Memory:
        """The memory of one network run (scope ``run:<run_id>``): what a network uses by default."""
        return cls(f"run:{run_id}", network_name=network_name, **kwargs)

    @classmethod
    def for_network(cls, name: str, **kwargs: Any) -> Memory:
        """Memory that outlives runs and is shared by every run of network ``name``."""
        kwargs.setdefault("network_name", name)
        return cls(f"network:{name}", **kwargs)

    @classmethod
    def for_robot(cls, name: str, **kwargs: Any) -> Memory:
        """A robot's inherent memory (scope ``robot:<name>``), used when it runs standalone."""
        kwargs.setdefault("writer", name)
        return cls(f"robot:{name}", **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], scope: str, **kwargs: Any) -> Memory:
        """Rebuild a memory from :meth:`to_dict` output (the Ruby gem's ``Memory.from_hash``)."""
        memory = cls(scope, **kwargs)
        values = {k: data[k] for k in RESERVED_KEYS if k in data}
        values.update(data.get("custom") or {})
        memory.merge(values)
        return memory

    # --- writer ---------------------------------------------------------------------------
    @property
    def current_writer(self) -> str | None:
        """Recorded as ``writer`` on every change (robot_lab sets it to the running robot)."""
        return self._writer_of()

    @current_writer.setter
    def current_writer(self, name: str | None) -> None:
        self._writer_of.name = name

    @property
    def _writer(self) -> str | None:
        """The memory's own writer (None: unattributed), under any context override."""
        return self._writer_of.name

    def writing_as(self, name: str) -> Any:
        """Attribute writes in this context (thread/task) to ``name`` without touching others."""
        return writing_as(name)

    # --- writes (see .values) -----------------------------------------------------------
    def set(self, key: str, value: Any) -> Any:
        """Store ``value`` under ``key``, record and publish the change; returns ``value``."""
        self._values.set(key, value)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def merge(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Set every pair in one atomic script (one change and version per key, in order)."""
        self._values.merge(values)
        return dict(values)

    def update(self, key: str, fn: Callable[[Any], Any], *, default: Any = None,
               max_attempts: int = 10_000) -> Any:
        """Replace ``key``'s value with ``fn(current)`` by compare-and-set; returns the new value.

        ``fn`` gets ``default`` (or the reserved key's default) when the key is absent. On a
        conflict with another writer ``fn`` is called again with the newer value, so ``fn``
        must be free of side effects. N processes incrementing a counter lose no increment.
        """
        return self._values.update(key, fn, default, max_attempts)

    def delete(self, key: str) -> Any:
        """Remove ``key`` and return its value (None if absent); emits a ``deleted`` change."""
        return self._values.delete(key)

    def __delitem__(self, key: str) -> None:
        self.delete(key)

    def clear(self) -> int:
        """Delete every non-reserved key (one ``deleted`` change each); returns how many."""
        return self._values.clear()

    def reset(self) -> int:
        """Delete every key, reserved ones included, so they read as their defaults again."""
        return self._values.reset()

    # --- reads ----------------------------------------------------------------------------
    def get(self, *keys: str, wait: bool | float | None = False) -> Any:
        """One key -> its value; several -> ``{key: value}``. Missing keys read as None.

        ``wait=True`` blocks until every key exists, ``wait=<seconds>`` at most that long
        (one deadline for all keys), then raises :class:`AwaitTimeout`. Existence, not
        non-None-ness, satisfies a wait: a stored null returns at once.
        """
        names, waits, timeout = self._read_args(keys, wait)
        values = wait_for(self._values, self._feed, names, timeout) if waits else self._values.read(names)
        return values[names[0]] if len(names) == 1 else values

    async def aget(self, *keys: str, wait: bool | float | None = False) -> Any:
        """:meth:`get` for an event loop: read on redis-py's asyncio client, and a wait
        that suspends this task (not the loop) until the keys exist or time runs out."""
        names, waits, timeout = self._read_args(keys, wait)
        if waits:
            values = await await_for(self._values, self._feed, self.aredis, names, timeout)
        else:
            raws = await self._values.aread_raw(self.aredis, names)
            values = {k: self._values.value(k, raws[k]) for k in names}
        return values[names[0]] if len(names) == 1 else values

    @property
    def aredis(self) -> Any:
        """The asyncio client of :meth:`aget`: one to the same server as ``redis`` per event
        loop (:func:`robot_lab.connection.async_client_for`)."""
        return async_client_for(self.redis)

    def _read_args(self, keys: tuple[str, ...], wait: bool | float | None) -> tuple[list[str], bool, float | None]:
        """(checked key names, whether to wait, the wait's timeout: None = forever)."""
        if not keys:
            raise ConfigurationError(f"memory {self.scope!r}: get needs at least one key")
        names = [self._values.check_key(k) for k in keys]
        if wait is None or wait is False:
            return names, False, None
        if wait is True:
            return names, True, None
        if isinstance(wait, (int, float)) and wait >= 0:
            return names, True, float(wait)
        raise ConfigurationError(f"memory {self.scope!r}: wait must be a bool or seconds >= 0, got {wait!r}")

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def has_key(self, key: str) -> bool:
        """The Ruby gem's ``key?``: reserved keys always exist; a stored null exists."""
        return self._values.exists(key)

    include = has_key

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(key) and self.has_key(key)

    def keys(self) -> list[str]:
        """Stored keys, reserved ones left out (the Ruby gem's ``keys``), sorted."""
        return sorted(k for k in self._values.stored_keys() if k not in RESERVED_KEYS)

    def all_keys(self) -> list[str]:
        return sorted(set(self._values.stored_keys()) | set(RESERVED_KEYS))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def to_dict(self) -> dict[str, Any]:
        """``{data, results, messages, session_id, custom}`` like the Ruby gem's ``to_h``."""
        return self._values.to_dict()

    to_h = to_dict

    # --- reserved keys --------------------------------------------------------------------
    @property
    def data(self) -> DataProxy:
        return DataProxy(self)

    @data.setter
    def data(self, value: Mapping[str, Any]) -> None:
        self.set("data", value)

    @property
    def results(self) -> list[RobotResult]:
        return decode_results(self.get("results"))

    @results.setter
    def results(self, value: list[Any]) -> None:
        self.set("results", value)

    set_results = results.fset

    def append_result(self, result: RobotResult | Mapping[str, Any]) -> RobotResult:
        item = normalize_result(result)
        self.update("results", lambda current: [*(current or []), item])
        return RobotResult.from_dict(item)

    def results_from(self, index: int) -> list[RobotResult]:
        return self.results[index:]

    @property
    def messages(self) -> list[Message]:
        return decode_messages(self.get("messages"))

    @messages.setter
    def messages(self, value: list[Any]) -> None:
        self.set("messages", value)

    def append_message(self, message: Message | Mapping[str, Any]) -> None:
        item = normalize_message(message)
        self.update("messages", lambda current: [*(current or []), item])

    @property
    def session_id(self) -> Any:
        return self.get("session_id")

    @session_id.setter
    def session_id(self, value: Any) -> None:
        self.set("session_id", value)

    # --- versions and the change stream (see .scope) -----------------------------------
    @property
    def version(self) -> int:
        """The scope's version: the number of changes ever recorded."""
        return self._log.version()

    def changes(self, since_version: int = 0, limit: int | None = None) -> list[MemoryChange]:
        """Recorded changes after ``since_version`` (oldest first), as far as the stream holds them."""
        return self._log.changes(since_version, limit)

    def cursor(self, subscriber_id: str) -> int | None:
        """The last version a durable subscriber has processed (None if never subscribed)."""
        return self._log.cursor(subscriber_id)

    # --- subscriptions --------------------------------------------------------------------
    def subscribe(
        self,
        *keys: Any,
        callback: Callable[..., Any] | None = None,
        subscriber_id: str | None = None,
        since_version: int | None = None,
        transactional: bool = False,
    ) -> str:
        """Call ``callback(change)`` for every change of ``keys``; returns a subscription id.

        The callback may be passed last positionally. Callbacks run on this Memory's
        listener thread, one at a time, in version order. Where delivery starts:

        * ``since_version=v`` -- replay every change after version ``v``, then go live;
        * ``subscriber_id="name"`` -- durable: resume after the last version this id
          processed (kept in Redis, ``Keys.memory_cursors``), or from now on first use;
        * neither -- changes from now on.

        With ``transactional=True`` the callback is ``callback(change, pipe)``: it queues its
        Redis effects on ``pipe`` (a MULTI pipeline) and robot-lab adds the cursor update to
        the same transaction, so effects and cursor commit together: exactly once across
        crashes. Without it a durable subscriber is at-least-once (a crash between the
        callback and the cursor write repeats that one change).
        """
        keys_list = list(keys)
        if callback is None and keys_list and callable(keys_list[-1]):
            callback = keys_list.pop()
        if not keys_list:
            raise ConfigurationError(f"memory {self.scope!r}: subscribe needs at least one key")
        names = frozenset(self._values.check_key(k) for k in keys_list)
        return self._subs.add(names, None, callback, subscriber_id, since_version, transactional)

    def subscribe_pattern(
        self,
        pattern: str,
        callback: Callable[..., Any] | None = None,
        *,
        subscriber_id: str | None = None,
        since_version: int | None = None,
        transactional: bool = False,
    ) -> str:
        """Like :meth:`subscribe` for every key matching a glob (``*`` any run, ``?`` one char)."""
        if not isinstance(pattern, str) or not pattern:
            raise ConfigurationError(f"memory {self.scope!r}: pattern must be a non-empty string, got {pattern!r}")
        return self._subs.add(None, glob_to_regex(pattern), callback, subscriber_id, since_version, transactional)

    def unsubscribe(self, subscription_id: str) -> bool:
        """Stop a subscription; no callback of it runs after this returns (outside callbacks)."""
        return self._subs.remove(subscription_id)

    def unsubscribe_keys(self, *keys: str) -> int:
        """Drop ``keys`` from every key subscription; returns how many subscriptions ended."""
        return self._subs.remove_keys(frozenset(keys))

    def subscribed(self, key: str) -> bool:
        """The Ruby gem's ``subscribed?``: does any subscription of this Memory cover ``key``?"""
        return self._subs.covers(key)

    # --- broadcast (the Ruby gem's Network#broadcast) ---------------------------------------
    def broadcast(self, payload: Any) -> dict[str, Any]:
        """Write ``{payload, network, timestamp}`` to ``_network_broadcast``; every
        ``on_broadcast`` handler in every process gets it, durably and in order."""
        message = {"payload": payload, "network": self.network_name, "timestamp": time.time()}
        self.set(BROADCAST_KEY, message)
        return message

    def on_broadcast(self, callback: Callable[[Any], Any], **kwargs: Any) -> str:
        """Call ``callback(message)`` for every broadcast; returns the subscription id."""
        if not callable(callback):
            raise ConfigurationError(f"memory {self.scope!r}: on_broadcast needs a callback")

        def handler(change: MemoryChange) -> None:
            if change.op == "set":
                callback(change.value)

        return self.subscribe(BROADCAST_KEY, callback=handler, **kwargs)

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def _listener(self) -> Listener | None:
        """The live listener thread, if any (tests and benchmarks look at it)."""
        return self._feed.listener

    def _ensure_listener(self) -> Listener:
        return self._feed.ensure_listener()

    @property
    def lost_changes(self) -> int:
        """Versions this Memory could not deliver because the stream was trimmed first."""
        return self._log.lost

    def close(self) -> None:
        """Stop the listener thread: subscriptions end, blocked waits raise. Reads and
        writes keep working; a later wait or subscribe starts a new listener."""
        self._feed.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def expire(self, seconds: int) -> None:
        """Let every key of the scope expire (a finished run's memory, say)."""
        for key in self._log.keys.stored:
            self.redis.expire(key, seconds)

    def destroy(self) -> None:
        """Delete the scope's keys outright (tests, teardown); don't keep using this scope."""
        self.close()
        self.redis.delete(*self._log.keys.stored)

    def __repr__(self) -> str:
        return f"Memory(scope={self.scope!r}, network_name={self.network_name!r})"


def resolve_memory(memory: Memory | Mapping[str, Any] | str | None, default: Memory) -> Memory:
    """The memory a run or task should use, with the Ruby gem's rules for ``run(memory=...)``.

    * ``None`` -- ``default`` (a network run's ``Memory.for_run``; a robot's own memory);
    * a :class:`Memory` -- replaces ``default`` for this run;
    * a scope name -- that scope, on ``default``'s Redis, key layout and network;
    * a mapping -- merged into ``default`` (one atomic write), which is returned.
    """
    if memory is None:
        return default
    if isinstance(memory, Memory):
        return memory
    if isinstance(memory, str):
        return Memory(memory, redis=default.redis, keys=default.keys_layout, network_name=default.network_name,
                      writer=default._writer, changes_maxlen=default.changes_maxlen,
                      poll_interval=default.poll_interval)
    if isinstance(memory, Mapping):
        default.merge(memory)
        return default
    raise ConfigurationError(f"memory must be a Memory, a scope name or a mapping, got {type(memory).__name__}")
