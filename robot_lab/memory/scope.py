"""The Redis keys of one memory scope, and the scope's change log (read side).

A scope is five keys (names from :class:`robot_lab.keys.Keys`): the value hash, the
version counter, the capped change stream, the pub/sub channel and the durable
subscribers' cursors. :class:`ScopeKeys` names them once, so no other module builds a
key. :class:`ChangeLog` is everything that *reads* the history of a scope -- the version
counter, the change stream and the cursors -- and is the one object the listener and the
subscriptions need from a Memory: they never see the Memory itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.schemas import MemoryChange

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.memory")

_decoder = msgspec.json.Decoder(MemoryChange)
_REPLAY_BATCH = 500


def decode_change(raw: bytes | str) -> MemoryChange:
    """A change record (stream field ``c`` or a notification) as a :class:`MemoryChange`."""
    return _decoder.decode(raw)


def _entry_version(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def _change_field(fields: dict[Any, Any]) -> Any:
    return fields.get(b"c") if b"c" in fields else fields.get("c")


@dataclass(frozen=True)
class ScopeKeys:
    """The five Redis keys of one scope."""

    scope: str
    hash: str
    version: str
    changes: str
    channel: str
    cursors: str

    @classmethod
    def of(cls, layout: Keys, scope: str) -> ScopeKeys:
        return cls(scope=scope, hash=layout.memory(scope), version=layout.memory_version(scope),
                   changes=layout.memory_changes(scope), channel=layout.memory_channel(scope),
                   cursors=layout.memory_cursors(scope))

    @property
    def stored(self) -> tuple[str, str, str, str]:
        """The keys that hold data (the channel holds none): what expire/destroy touch."""
        return (self.hash, self.version, self.changes, self.cursors)

    @property
    def script(self) -> list[str]:
        """KEYS of the write scripts (:mod:`robot_lab.memory.lua`)."""
        return [self.hash, self.version, self.changes]


class ChangeLog:
    """Version counter, change stream and cursors of one scope, read by version.

    ``lost`` counts versions that could not be replayed because the stream was trimmed
    (or expired) before a reader got to them.
    """

    def __init__(self, redis: RedisClient, keys: ScopeKeys) -> None:
        self.redis = redis
        self.keys = keys
        self.lost = 0

    def version(self) -> int:
        """The scope's version: the number of changes ever recorded."""
        raw = self.redis.get(self.keys.version)
        return int(raw) if raw is not None else 0

    def changes(self, since_version: int = 0, limit: int | None = None) -> list[MemoryChange]:
        """Recorded changes after ``since_version`` (oldest first), as far as the stream holds them."""
        entries = self.redis.xrange(self.keys.changes, f"{since_version + 1}-0", "+", count=limit)
        return [decode_change(_change_field(fields)) for _, fields in entries]

    def read(self, after: int, until: int | None = None) -> Iterator[MemoryChange]:
        """Changes with ``after < version (<= until)``, in batches, noting trimmed gaps."""
        expected = after + 1
        start = f"{after + 1}-0"
        end = f"{until}-0" if until is not None else "+"
        while True:
            entries = self.redis.xrange(self.keys.changes, start, end, count=_REPLAY_BATCH)
            if not entries:
                return
            for entry_id, fields in entries:
                version = _entry_version(entry_id)
                if version > expected:
                    self.note_lost(version - expected)
                yield decode_change(_change_field(fields))
                expected = version + 1
            if len(entries) < _REPLAY_BATCH:
                return
            start = f"{expected}-0"

    def note_lost(self, count: int) -> None:
        self.lost += count
        log.warning("memory.changes_lost", scope=self.keys.scope, count=count,
                    hint="the change stream was trimmed; raise changes_maxlen")

    # --- durable subscribers' cursors -----------------------------------------------------
    def cursor(self, subscriber_id: str) -> int | None:
        """The last version a durable subscriber has processed (None if never subscribed)."""
        raw = self.redis.hget(self.keys.cursors, subscriber_id)
        return int(raw) if raw is not None else None

    def start_cursor(self, subscriber_id: str, version: int) -> int:
        """Record ``version`` as the subscriber's start unless it has a cursor; returns the cursor."""
        self.redis.hsetnx(self.keys.cursors, subscriber_id, version)
        return self.cursor(subscriber_id) or 0

    def save_cursor(self, subscriber_id: str, version: int, pipe: Any = None) -> None:
        """Advance a durable cursor, on ``pipe`` (a MULTI pipeline) when given."""
        (pipe if pipe is not None else self.redis).hset(self.keys.cursors, subscriber_id, version)
