"""``send_message`` and its outbox: the Ruby gem's asynchronous messaging between robots.

The sender's outbox entry (``Keys.outbox_entry``) lives in Redis, so the reply is correlated
by whichever worker of the sender consumes it, and any process can wait for it. The mixin of
:class:`robot_lab.bus.core.Bus` that holds this concern.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.errors import AwaitTimeout, BusError
from robot_lab.keys import Keys
from robot_lab.bus.names import check_robot_name
from robot_lab.bus.records import OutboxEntry
from robot_lab.schemas import RobotMessage, decode_message, encode_message, utcnow
from robot_lab.text.strings import as_str as _s

if TYPE_CHECKING:
    from redis.commands.core import Script
    from robot_lab.connection import RedisClient
    from robot_lab.settings import BusSettings  # a name only: no pydantic models at import (start-up time)


class Outbox:
    """Outbox operations of a Bus (which sets ``redis``, ``keys``, ``settings``, the
    ``_outbox_reply`` script, and provides ``publish``)."""

    redis: RedisClient
    keys: Keys
    settings: BusSettings
    _outbox_reply: Script

    # provided by Bus (send_message passes its keyword arguments through)
    def publish(self, to: str, content: str | Mapping[str, Any], *, from_: str = ..., kind: str = ...,
                reply_to: str | None = ..., conversation_id: str | None = ..., correlation_id: str | None = ...,
                in_reply_to: str | None = ..., headers: Mapping[str, str] | None = ...,
                deadline: _dt.datetime | _dt.timedelta | float | None = ..., create: bool = ...) -> RobotMessage:
        raise NotImplementedError

    def send_message(
        self, to: str, content: str | Mapping[str, Any], *, from_: str, **kwargs: Any
    ) -> RobotMessage:
        """The Ruby gem's ``send_message``: publish and record ``outbox[id] = sent`` for
        ``from_``, so the reply is correlated (status ``replied``) by whichever worker of
        ``from_`` consumes it. ``reply_to`` defaults to ``from_``."""
        check_robot_name(from_, "sender")
        message = self.publish(to, content, from_=from_, **kwargs)
        self._record_sent(from_, message)
        return message

    def _record_sent(self, robot: str, message: RobotMessage) -> None:
        key = self.keys.outbox_entry(robot, message.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(
            key,
            mapping={"message": encode_message(message), "status": "sent", "sent_at": utcnow().isoformat()},
        )
        pipe.expire(key, int(self.settings.reply_ttl))
        pipe.execute()

    def outbox(self, robot: str, message_id: str) -> OutboxEntry | None:
        """The outbox record of a message ``robot`` sent with ``send_message``."""
        key = self.keys.outbox_entry(robot, message_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(key)
        pipe.lrange(f"{key}:replies", 0, -1)
        data, replies = pipe.execute()
        if not data:
            return None
        raw = data.get(b"message")
        return OutboxEntry(
            message_id=message_id,
            status=_s(data.get(b"status")),
            message=decode_message(raw) if raw else None,
            replies=[decode_message(r) for r in replies],
            sent_at=_s(data.get(b"sent_at")),
            replied_at=_s(data.get(b"replied_at")),
        )

    def wait_for_reply(self, robot: str, message_id: str, timeout: float = 30.0) -> RobotMessage:
        """Block until a reply to ``message_id`` (sent by ``robot``) has been correlated by
        any worker of ``robot``; returns the first reply."""
        key = self.keys.outbox_entry(robot, message_id)
        end = time.monotonic() + timeout
        while True:
            entry = self.outbox(robot, message_id)
            if entry is None:
                raise BusError(f"robot {robot!r} has no outbox entry for message {message_id!r}")
            if entry.replies:
                return entry.replies[0]
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise AwaitTimeout(f"no reply to {robot!r}'s message {message_id} within {timeout:g} s")
            self.redis.blpop([f"{key}:signal"], timeout=min(remaining, 1.0))

    def correlate_reply(self, robot: str, reply: RobotMessage) -> bool:
        """Mark ``outbox[reply.in_reply_to]`` of ``robot`` replied; False when not ours."""
        if not reply.in_reply_to:
            return False
        key = self.keys.outbox_entry(robot, reply.in_reply_to)
        done = self._outbox_reply(
            keys=[key, f"{key}:replies", f"{key}:signal"],
            args=[encode_message(reply), int(self.settings.reply_ttl), utcnow().isoformat(), reply.id],
        )
        return bool(done)

