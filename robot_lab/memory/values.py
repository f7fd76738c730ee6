"""Reads and writes of one scope's values: the Memory's data path, without waits or callbacks.

Every write runs one script from :mod:`.lua` that stores the value, bumps the version,
appends the change record and publishes it, so a change is never seen without its record.
Reads are plain ``HGET``/``HMGET``/``HGETALL``. Values are JSON (msgspec); the reserved keys
are validated and defaulted by :mod:`.reserved`. ``writer`` is a callable because the
writer recorded on a change can be overridden per thread or task (``Memory.writing_as``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab import coalesce
from robot_lab.connection import durable
from robot_lab.errors import RobotLabError
from robot_lab.memory import lua as memory_lua
from robot_lab.memory.reserved import (
    RESERVED_KEYS,
    MemoryValueError,
    ReservedKeyError,
    normalize_reserved,
    reserved_default,
)
from robot_lab.memory.scope import ScopeKeys

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

encoder = msgspec.json.Encoder()

# Writes this process has sent, per scope. A network task whose process sent none to its
# scope while it ran has no ``memory.changed`` event of its own to report, and skips reading
# the change stream (robot_lab/network/task_job.py).
_local_writes: Counter[str] = Counter()
_local_writes_lock = threading.Lock()


def local_writes(scope: str) -> int:
    """How many writes this process has sent to ``scope`` (a counter to compare, not a version)."""
    return _local_writes[scope]


def _count_write(scope: str) -> None:
    with _local_writes_lock:
        _local_writes[scope] += 1


def decode(raw: bytes | str) -> Any:
    return msgspec.json.decode(raw)


def _text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


class Values:
    """The values of one scope in Redis (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: ScopeKeys, *, network_name: str | None,
                 changes_maxlen: int, writer: Callable[[], str | None]) -> None:
        self.redis = redis
        self.keys = keys
        self.scope = keys.scope
        self.changes_maxlen = changes_maxlen
        self._writer = writer
        self._scope_json = encoder.encode(keys.scope)
        self._network_json = encoder.encode(network_name)
        self._write_script: Any = None  # made on first use: most memories of a task are only read
        self._delete_script: Any = None

    @property
    def _write(self) -> Any:
        if self._write_script is None:
            self._write_script = self.redis.register_script(memory_lua.WRITE)
        return self._write_script

    @property
    def _delete(self) -> Any:
        if self._delete_script is None:
            self._delete_script = self.redis.register_script(memory_lua.DELETE)
        return self._delete_script

    # --- encoding -------------------------------------------------------------------------
    def check_key(self, key: Any) -> str:
        if not isinstance(key, str) or not key:
            raise MemoryValueError(
                f"memory {self.scope!r}: key {key!r} must be a non-empty string, not {type(key).__name__}",
                path="$", kind="memory",
            )
        return key

    def encode(self, key: str, value: Any) -> bytes:
        if key in RESERVED_KEYS:
            value = normalize_reserved(key, value)
        try:
            return encoder.encode(value)
        except (TypeError, msgspec.EncodeError) as exc:
            raise MemoryValueError(
                f"memory {self.scope!r}: value for key {key!r} is not JSON-serializable "
                f"({type(value).__name__}): {exc}",
                path=f"$.{key}", kind="memory",
            ) from exc

    def _meta(self) -> bytes:
        return (b',"writer":' + encoder.encode(self._writer()) + b',"network_name":' + self._network_json
                + b',"timestamp":' + repr(time.time()).encode() + b"}")

    @staticmethod
    def value(key: str, raw: bytes | str | None) -> Any:
        """A stored value decoded; an absent one as None or the reserved key's default."""
        if raw is None:
            return reserved_default(key) if key in RESERVED_KEYS else None
        return decode(raw)

    # --- writes ---------------------------------------------------------------------------
    def _run_write(self, groups: list[bytes | str], count: int, *, critical: bool = False) -> list[Any]:
        args = [self.keys.channel, self.changes_maxlen, self._meta(), self._scope_json, count, *groups]
        _count_write(self.scope)
        if critical:  # compare-and-set: replicated before the caller sees it succeed (setting)
            return durable(self.redis, lambda target: self._write(keys=self.keys.script, args=args, client=target))
        return self._write(keys=self.keys.script, args=args)

    def set(self, key: str, value: Any) -> None:
        key = self.check_key(key)
        self._run_write([key, encoder.encode(key), self.encode(key, value), "0", ""], 1)

    def merge(self, values: Mapping[str, Any]) -> None:
        if not isinstance(values, Mapping):
            raise MemoryValueError(f"memory {self.scope!r}: merge needs a mapping, got {type(values).__name__}",
                                   path="$", kind="memory")
        groups: list[bytes | str] = []
        for key, value in values.items():
            key = self.check_key(key)
            groups += [key, encoder.encode(key), self.encode(key, value), "0", ""]
        if groups:
            self._run_write(groups, len(values))

    def update(self, key: str, fn: Callable[[Any], Any], default: Any, max_attempts: int) -> Any:
        """Compare-and-set ``fn(current)`` until no other writer interleaves (see Memory.update)."""
        key = self.check_key(key)
        key_json = encoder.encode(key)
        raw: bytes | str | None = self.redis.hget(self.keys.hash, key)
        for attempt in range(1, max_attempts + 1):
            if raw is None:
                current = reserved_default(key) if key in RESERVED_KEYS else default
            else:
                current = decode(raw)
            new = fn(current)
            data = self.encode(key, new)
            mode, expected = ("1", b"") if raw is None else ("2", raw)
            result = self._run_write([key, key_json, data, mode, expected], 1, critical=True)
            if result[0] == 1:
                return new if key not in RESERVED_KEYS else decode(data)
            raw = result[2] if len(result) > 2 else None
            if attempt % 4 == 0:  # heavy contention: step aside briefly
                time.sleep(random.uniform(0, 0.001 * min(attempt // 4, 10)))
        raise RobotLabError(f"memory {self.scope!r}: update of {key!r} gave up after {max_attempts} conflicts")

    def delete(self, key: str) -> Any:
        key = self.check_key(key)
        if key in RESERVED_KEYS:
            raise ReservedKeyError(f"memory {self.scope!r}: cannot delete reserved key {key!r} "
                                   f"(reserved: {', '.join(RESERVED_KEYS)})")
        result = self._run_delete("keys", [key])
        return decode(result[2]) if len(result) > 2 else None

    def clear(self) -> int:
        return int(self._run_delete("clear", list(RESERVED_KEYS))[0])

    def reset(self) -> int:
        return int(self._run_delete("all", [])[0])

    def _run_delete(self, mode: str, fields: list[str]) -> list[Any]:
        _count_write(self.scope)
        return self._delete(
            keys=self.keys.script,
            args=[self.keys.channel, self.changes_maxlen, self._meta(), self._scope_json, mode, *fields],
        )

    # --- reads ----------------------------------------------------------------------------
    def read_raw(self, names: list[str]) -> dict[str, Any]:
        """``{key: raw bytes or None}`` in one round trip."""
        # with other threads' round trips (robot_lab.coalesce): each run of an in-flight
        # worker reads its robot's learnings
        if len(names) == 1:
            return {names[0]: coalesce.call(self.redis, "hget", self.keys.hash, names[0])}
        return dict(zip(names, coalesce.call(self.redis, "hmget", self.keys.hash, names)))

    async def aread_raw(self, aredis: Any, names: list[str]) -> dict[str, Any]:
        """:meth:`read_raw` on an asyncio client of the same server."""
        if len(names) == 1:
            return {names[0]: await aredis.hget(self.keys.hash, names[0])}
        return dict(zip(names, await aredis.hmget(self.keys.hash, names)))

    def read(self, names: list[str]) -> dict[str, Any]:
        raws = self.read_raw(names)
        return {k: self.value(k, raws[k]) for k in names}

    def exists(self, key: str) -> bool:
        key = self.check_key(key)
        return key in RESERVED_KEYS or bool(self.redis.hexists(self.keys.hash, key))

    def stored_keys(self) -> list[str]:
        return [_text(k) for k in self.redis.hkeys(self.keys.hash)]

    def to_dict(self) -> dict[str, Any]:
        stored = {_text(k): decode(v) for k, v in self.redis.hgetall(self.keys.hash).items()}
        out: dict[str, Any] = {k: stored.pop(k, reserved_default(k)) for k in RESERVED_KEYS}
        out["custom"] = dict(sorted(stored.items()))
        return out
