"""Shared memory in Redis: robot_lab's reactive Memory, made to work across processes.

A scope (``run:<id>``, ``network:<name>``, ``robot:<name>`` or any name you give) is one
Redis hash of JSON values plus a version counter, a capped change stream and a pub/sub
channel (key names in :class:`robot_lab.keys.Keys`). Every write runs as one Lua script
(:mod:`.lua`) that stores the value, bumps the version, appends the
:class:`MemoryChange` to the stream and publishes it, so a change can never be seen without
its record or the other way round.

Reads are plain ``HGET``/``HMGET``. Blocking reads and subscriptions use a background
listener thread per Memory (:mod:`.listener`) that turns notifications into wake-ups
and callbacks, and falls back to the change stream whenever pub/sub may have dropped
something, so subscribers see every change once, in version order.

See docs/memory.md for the guarantees and the deliberate differences from robot_lab.
"""

from __future__ import annotations

import contextvars
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import msgspec
import redis as redis_lib

from robot_lab.errors import AwaitTimeout, ConfigurationError, RobotLabError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.schemas import MemoryChange, RobotResult
from robot_lab.schemas.messages import Message
from robot_lab.memory import lua as memory_lua
from robot_lab.memory.listener import Listener, Subscription, Waiter, decode_change, glob_to_regex
from robot_lab.memory.reserved import (
    RESERVED_KEYS,
    DataProxy,
    MemoryValueError,
    decode_messages,
    decode_results,
    normalize_message,
    normalize_reserved,
    normalize_result,
    reserved_default,
)

__all__ = ["BROADCAST_KEY", "RESERVED_KEYS", "Memory", "MemoryValueError", "ReservedKeyError", "resolve_memory"]

log = get_logger("robot_lab.memory")

BROADCAST_KEY = "_network_broadcast"
DEFAULT_CHANGES_MAXLEN = 10_000

_encoder = msgspec.json.Encoder()
_writer_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("robot_lab_memory_writer",
                                                                              default=None)


class ReservedKeyError(RobotLabError, ValueError):
    """A reserved key (data, results, messages, session_id) was deleted."""


def _decode(raw: bytes | str) -> Any:
    return msgspec.json.decode(raw)


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
        redis: redis_lib.Redis | None = None,
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
            from robot_lab.connection import get_redis

            redis = get_redis()
        self.scope = scope
        self.redis = redis
        self.keys_layout = keys or default_keys()
        self.network_name = network_name
        self._writer = writer
        self.changes_maxlen = changes_maxlen
        self.poll_interval = poll_interval
        self.listener_idle_timeout = listener_idle_timeout
        self._lost = 0
        self._hash_key = self.keys_layout.memory(scope)
        self._version_key = self.keys_layout.memory_version(scope)
        self._changes_key = self.keys_layout.memory_changes(scope)
        self._channel = self.keys_layout.memory_channel(scope)
        self._cursors_key = self.keys_layout.memory_cursors(scope)
        self._script_keys = [self._hash_key, self._version_key, self._changes_key]
        self._scope_json = _encoder.encode(scope)
        self._network_json = _encoder.encode(network_name)
        self._write = redis.register_script(memory_lua.WRITE)
        self._delete = redis.register_script(memory_lua.DELETE)
        self._listener: Listener | None = None
        # Re-entrant: a replayed callback may subscribe again while we register it.
        self._listener_lock = threading.RLock()

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
        """Rebuild a memory from :meth:`to_dict` output (robot_lab's ``Memory.from_hash``)."""
        memory = cls(scope, **kwargs)
        values = {k: data[k] for k in RESERVED_KEYS if k in data}
        values.update(data.get("custom") or {})
        memory.merge(values)
        return memory

    # --- writer ---------------------------------------------------------------------------
    @property
    def current_writer(self) -> str | None:
        """Recorded as ``writer`` on every change (robot_lab sets it to the running robot)."""
        override = _writer_override.get()
        return override if override is not None else self._writer

    @current_writer.setter
    def current_writer(self, name: str | None) -> None:
        self._writer = name

    @contextmanager
    def writing_as(self, name: str) -> Iterator[None]:
        """Attribute writes in this context (thread/task) to ``name`` without touching others."""
        token = _writer_override.set(name)
        try:
            yield
        finally:
            _writer_override.reset(token)

    # --- encoding -------------------------------------------------------------------------
    def _check_key(self, key: Any) -> str:
        if not isinstance(key, str) or not key:
            raise MemoryValueError(
                f"memory {self.scope!r}: key {key!r} must be a non-empty string, not {type(key).__name__}",
                path="$", kind="memory",
            )
        return key

    def _encode(self, key: str, value: Any) -> bytes:
        if key in RESERVED_KEYS:
            value = normalize_reserved(key, value)
        try:
            return _encoder.encode(value)
        except (TypeError, msgspec.EncodeError) as exc:
            raise MemoryValueError(
                f"memory {self.scope!r}: value for key {key!r} is not JSON-serializable "
                f"({type(value).__name__}): {exc}",
                path=f"$.{key}", kind="memory",
            ) from exc

    def _meta(self) -> bytes:
        return (b',"writer":' + _encoder.encode(self.current_writer) + b',"network_name":' + self._network_json
                + b',"timestamp":' + repr(time.time()).encode() + b"}")

    def _value(self, key: str, raw: bytes | str | None) -> Any:
        if raw is None:
            return reserved_default(key) if key in RESERVED_KEYS else None
        return _decode(raw)

    # --- writes ---------------------------------------------------------------------------
    def _run_write(self, groups: list[bytes | str], count: int) -> list[Any]:
        return self._write(
            keys=self._script_keys,
            args=[self._channel, self.changes_maxlen, self._meta(), self._scope_json, count, *groups],
        )

    def set(self, key: str, value: Any) -> Any:
        """Store ``value`` under ``key``, record and publish the change; returns ``value``."""
        key = self._check_key(key)
        data = self._encode(key, value)
        self._run_write([key, _encoder.encode(key), data, "0", ""], 1)
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def merge(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Set every pair in one atomic script (one change and version per key, in order)."""
        if not isinstance(values, Mapping):
            raise MemoryValueError(f"memory {self.scope!r}: merge needs a mapping, got {type(values).__name__}",
                                   path="$", kind="memory")
        groups: list[bytes | str] = []
        for key, value in values.items():
            key = self._check_key(key)
            groups += [key, _encoder.encode(key), self._encode(key, value), "0", ""]
        if groups:
            self._run_write(groups, len(values))
        return dict(values)

    def update(self, key: str, fn: Callable[[Any], Any], *, default: Any = None,
               max_attempts: int = 10_000) -> Any:
        """Replace ``key``'s value with ``fn(current)`` by compare-and-set; returns the new value.

        ``fn`` gets ``default`` (or the reserved key's default) when the key is absent. On a
        conflict with another writer ``fn`` is called again with the newer value, so ``fn``
        must be free of side effects. N processes incrementing a counter lose no increment.
        """
        key = self._check_key(key)
        key_json = _encoder.encode(key)
        raw: bytes | str | None = self.redis.hget(self._hash_key, key)
        for attempt in range(1, max_attempts + 1):
            if raw is None:
                current = reserved_default(key) if key in RESERVED_KEYS else default
            else:
                current = _decode(raw)
            new = fn(current)
            data = self._encode(key, new)
            mode, expected = ("1", b"") if raw is None else ("2", raw)
            result = self._run_write([key, key_json, data, mode, expected], 1)
            if result[0] == 1:
                return new if key not in RESERVED_KEYS else _decode(data)
            raw = result[2] if len(result) > 2 else None
            if attempt % 4 == 0:  # heavy contention: step aside briefly
                time.sleep(random.uniform(0, 0.001 * min(attempt // 4, 10)))
        raise RobotLabError(f"memory {self.scope!r}: update of {key!r} gave up after {max_attempts} conflicts")

    def delete(self, key: str) -> Any:
        """Remove ``key`` and return its value (None if absent); emits a ``deleted`` change."""
        key = self._check_key(key)
        if key in RESERVED_KEYS:
            raise ReservedKeyError(f"memory {self.scope!r}: cannot delete reserved key {key!r} "
                                   f"(reserved: {', '.join(RESERVED_KEYS)})")
        result = self._run_delete("keys", [key])
        return _decode(result[2]) if len(result) > 2 else None

    def __delitem__(self, key: str) -> None:
        self.delete(key)

    def clear(self) -> int:
        """Delete every non-reserved key (one ``deleted`` change each); returns how many."""
        return int(self._run_delete("clear", list(RESERVED_KEYS))[0])

    def reset(self) -> int:
        """Delete every key, reserved ones included, so they read as their defaults again."""
        return int(self._run_delete("all", [])[0])

    def _run_delete(self, mode: str, fields: list[str]) -> list[Any]:
        return self._delete(
            keys=self._script_keys,
            args=[self._channel, self.changes_maxlen, self._meta(), self._scope_json, mode, *fields],
        )

    # --- reads ----------------------------------------------------------------------------
    def get(self, *keys: str, wait: bool | float | None = False) -> Any:
        """One key -> its value; several -> ``{key: value}``. Missing keys read as None.

        ``wait=True`` blocks until every key exists, ``wait=<seconds>`` at most that long
        (one deadline for all keys), then raises :class:`AwaitTimeout`. Existence, not
        non-None-ness, satisfies a wait: a stored null returns at once.
        """
        if not keys:
            raise ConfigurationError(f"memory {self.scope!r}: get needs at least one key")
        names = [self._check_key(k) for k in keys]
        if wait is None or wait is False:
            raws = self._read_raw(names)
            values = {k: self._value(k, raws[k]) for k in names}
        else:
            if wait is True:
                timeout = None
            elif isinstance(wait, (int, float)) and wait >= 0:
                timeout = float(wait)
            else:
                raise ConfigurationError(f"memory {self.scope!r}: wait must be a bool or seconds >= 0, got {wait!r}")
            values = self._wait_for(names, timeout)
        return values[names[0]] if len(names) == 1 else values

    def _read_raw(self, names: list[str]) -> dict[str, Any]:
        if len(names) == 1:
            return {names[0]: self.redis.hget(self._hash_key, names[0])}
        return dict(zip(names, self.redis.hmget(self._hash_key, names)))

    def _wait_for(self, names: list[str], timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        waitable = frozenset(k for k in names if k not in RESERVED_KEYS)
        current = threading.current_thread()
        if waitable and isinstance(current, Listener) and current.memory is self:
            raise RobotLabError(f"memory {self.scope!r}: a subscription callback cannot block on get(wait=...) "
                                "of its own Memory (the listener delivering changes is the one waiting)")
        waiter = Waiter(waitable)
        # Register, then read: a write after the read is notified to a registered waiter.
        listener = self._with_listener(lambda lst: lst.add_waiter(waiter)) if waitable else None
        try:
            raws = self._read_raw(names)
            found = {k: self._value(k, raws[k]) for k in names if raws[k] is not None or k in RESERVED_KEYS}
            missing = [k for k in names if k not in found]
            while missing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    err = AwaitTimeout(f"Timeout waiting for {', '.join(':' + k for k in missing)} "
                                       f"after {timeout:g} seconds")
                    err.keys = list(missing)  # type: ignore[attr-defined]
                    err.timeout = timeout  # type: ignore[attr-defined]
                    raise err
                waiter.event.wait(remaining)
                if waiter.closed:
                    raise RobotLabError(f"memory {self.scope!r} was closed while waiting for {missing}")
                waiter.event.clear()
                for k in list(missing):
                    if k in waiter.values:
                        found[k] = waiter.values[k]
                        missing.remove(k)
            return {k: found[k] for k in names}
        finally:
            if listener is not None:
                listener.remove_waiter(waiter)

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def has_key(self, key: str) -> bool:
        """robot_lab's ``key?``: reserved keys always exist; a stored null exists."""
        key = self._check_key(key)
        return key in RESERVED_KEYS or bool(self.redis.hexists(self._hash_key, key))

    include = has_key

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(key) and self.has_key(key)

    def keys(self) -> list[str]:
        """Stored keys, reserved ones left out (robot_lab's ``keys``), sorted."""
        return sorted(k for k in self._all_stored() if k not in RESERVED_KEYS)

    def all_keys(self) -> list[str]:
        return sorted(set(self._all_stored()) | set(RESERVED_KEYS))

    def _all_stored(self) -> list[str]:
        return [k.decode() if isinstance(k, bytes) else k for k in self.redis.hkeys(self._hash_key)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def to_dict(self) -> dict[str, Any]:
        """``{data, results, messages, session_id, custom}`` like robot_lab's ``to_h``."""
        stored = {
            (k.decode() if isinstance(k, bytes) else k): _decode(v)
            for k, v in self.redis.hgetall(self._hash_key).items()
        }
        out: dict[str, Any] = {k: stored.pop(k, reserved_default(k)) for k in RESERVED_KEYS}
        out["custom"] = dict(sorted(stored.items()))
        return out

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

    # --- versions and the change stream ---------------------------------------------------
    @property
    def version(self) -> int:
        """The scope's version: the number of changes ever recorded."""
        raw = self.redis.get(self._version_key)
        return int(raw) if raw is not None else 0

    def changes(self, since_version: int = 0, limit: int | None = None) -> list[MemoryChange]:
        """Recorded changes after ``since_version`` (oldest first), as far as the stream holds them."""
        entries = self.redis.xrange(self._changes_key, f"{since_version + 1}-0", "+", count=limit)
        return [decode_change(fields.get(b"c") or fields.get("c")) for _, fields in entries]

    def cursor(self, subscriber_id: str) -> int | None:
        """The last version a durable subscriber has processed (None if never subscribed)."""
        raw = self.redis.hget(self._cursors_key, subscriber_id)
        return int(raw) if raw is not None else None

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
        names = frozenset(self._check_key(k) for k in keys_list)
        return self._add_subscription(names, None, callback, subscriber_id, since_version, transactional)

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
        return self._add_subscription(None, glob_to_regex(pattern), callback, subscriber_id, since_version,
                                      transactional)

    def _add_subscription(self, names: frozenset[str] | None, pattern: Any, callback: Callable[..., Any] | None,
                          subscriber_id: str | None, since_version: int | None, transactional: bool) -> str:
        if callback is None or not callable(callback):
            raise ConfigurationError(f"memory {self.scope!r}: subscribe needs a callback")
        if since_version is not None and (not isinstance(since_version, int) or since_version < 0):
            raise ConfigurationError(f"memory {self.scope!r}: since_version must be an int >= 0, got {since_version!r}")
        sub = Subscription(id=str(uuid.uuid4()), callback=callback, version=0, keys=names,
                           pattern=pattern, subscriber_id=subscriber_id, transactional=transactional)

        def register(listener: Listener) -> None:
            if since_version is not None:
                sub.version = since_version
            else:
                sub.version = listener.head
                if subscriber_id is not None:
                    # Record the starting point at once, so a crash before the first delivery
                    # doesn't make the restarted subscriber skip what came in between.
                    self.redis.hsetnx(self._cursors_key, subscriber_id, sub.version)
                    sub.version = self.cursor(subscriber_id) or 0
            listener.add_subscription(sub)

        self._with_listener(register)
        return sub.id

    def unsubscribe(self, subscription_id: str) -> bool:
        """Stop a subscription; no callback of it runs after this returns (outside callbacks)."""
        listener = self._listener
        if listener is None:
            return False
        with listener.dispatch_lock:
            return listener.subscriptions.pop(subscription_id, None) is not None

    def unsubscribe_keys(self, *keys: str) -> int:
        """Drop ``keys`` from every key subscription; returns how many subscriptions ended."""
        listener = self._listener
        if listener is None:
            return 0
        drop = frozenset(keys)
        ended = 0
        with listener.dispatch_lock:
            for sub_id, sub in list(listener.subscriptions.items()):
                if sub.keys is not None and sub.keys & drop:
                    sub.keys = sub.keys - drop
                    if not sub.keys:
                        del listener.subscriptions[sub_id]
                        ended += 1
        return ended

    def subscribed(self, key: str) -> bool:
        """robot_lab's ``subscribed?``: does any subscription of this Memory cover ``key``?"""
        listener = self._listener
        return bool(listener) and any(s.matches(key) for s in list(listener.subscriptions.values()))

    # --- broadcast (robot_lab's Network#broadcast) ---------------------------------------
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
    def _with_listener(self, register: Callable[[Listener], None]) -> Listener:
        """Run ``register`` on a live listener, starting one if needed.

        Under ``_listener_lock``, which an idle listener also takes to retire, so a waiter
        or subscription is never registered on a listener that is about to exit.
        """
        with self._listener_lock:
            listener = self._listener
            if listener is None or listener.retired or not listener.is_alive():
                listener = Listener(self, self.poll_interval, self.listener_idle_timeout)
                listener.start_and_wait()
                self._listener = listener
            register(listener)
            return listener

    def _ensure_listener(self) -> Listener:
        return self._with_listener(lambda _: None)

    @property
    def lost_changes(self) -> int:
        """Versions this Memory could not deliver because the stream was trimmed first."""
        return self._lost

    def close(self) -> None:
        """Stop the listener thread: subscriptions end, blocked waits raise. Reads and
        writes keep working; a later wait or subscribe starts a new listener."""
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def expire(self, seconds: int) -> None:
        """Let every key of the scope expire (a finished run's memory, say)."""
        for key in (self._hash_key, self._version_key, self._changes_key, self._cursors_key):
            self.redis.expire(key, seconds)

    def destroy(self) -> None:
        """Delete the scope's keys outright (tests, teardown); don't keep using this scope."""
        self.close()
        self.redis.delete(self._hash_key, self._version_key, self._changes_key, self._cursors_key)

    def __repr__(self) -> str:
        return f"Memory(scope={self.scope!r}, network_name={self.network_name!r})"


def resolve_memory(memory: Memory | Mapping[str, Any] | str | None, default: Memory) -> Memory:
    """The memory a run or task should use, with robot_lab's rules for ``run(memory=...)``.

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
