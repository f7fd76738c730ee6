"""Request / reply on the bus: publish to a robot and block (or await) for its answer.

A request gets a private reply stream ``<prefix>:bus:_reply.<from>.<id>`` (created with a
TTL, deleted afterwards), so the caller needs no inbox or worker of its own. Under
``signing.verify`` warn/require only a reply from the robot asked, signed with one of its
keys, is taken. The mixin of :class:`robot_lab.bus.core.Bus` that holds this concern.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.bus.replies import REPLY_STREAM_PREFIX
from robot_lab.bus.keyring import Keyring
from robot_lab.errors import AwaitTimeout, RemoteError, SchemaError
from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.outage import out_of_memory
from robot_lab.schemas import RobotMessage, decode_message, new_id
from robot_lab.text.strings import as_str as _s

if TYPE_CHECKING:
    from robot_lab.connection import AsyncRedisClient, RedisClient

log = get_logger("robot_lab.bus")

REPLY_PREFIX = REPLY_STREAM_PREFIX  # reply streams: "_reply.<from>.<id>" (replies.reply_allowed lets them through)


class Requests:
    """Request / reply operations of a Bus (which sets ``redis``, ``keys``, ``keyring``,
    ``verify`` and provides ``publish`` / ``apublish`` / ``aredis``)."""

    redis: RedisClient
    keys: Keys
    keyring: Keyring
    verify: str

    if TYPE_CHECKING:
        @property
        def aredis(self) -> AsyncRedisClient: ...  # provided by Bus

    # provided by Bus: the arguments these operations pass
    def publish(self, to: str, content: str | Mapping[str, Any], *, from_: str = ..., reply_to: str | None = ...,
                conversation_id: str | None = ..., headers: Mapping[str, str] | None = ...,
                deadline: _dt.datetime | _dt.timedelta | float | None = ...,
                extensions: Mapping[str, Any] | None = ..., kind: str = ...,
                in_reply_to: str | None = ...) -> RobotMessage:
        raise NotImplementedError

    async def apublish(self, to: str, content: str | Mapping[str, Any], *, from_: str = ..., reply_to: str | None = ...,
                       conversation_id: str | None = ..., headers: Mapping[str, str] | None = ...,
                       deadline: _dt.datetime | _dt.timedelta | float | None = ...) -> RobotMessage:
        raise NotImplementedError

    def request(
        self,
        to: str,
        content: str | Mapping[str, Any],
        *,
        timeout: float = 30.0,
        from_: str = "client",
        conversation_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: _dt.datetime | _dt.timedelta | float | None = None,
        extensions: Mapping[str, Any] | None = None,
        kind: str = "message",
        in_reply_to: str | None = None,
    ) -> RobotMessage:
        """Publish to ``to`` and block until its reply arrives; returns the reply envelope
        (``kind="answer", in_reply_to=<request id>`` answers an ``input_required`` reply).

        Replies go to a private stream ``<prefix>:bus:_reply.<from_>.<id>`` (created here with a
        TTL, deleted afterwards), so the caller needs no inbox or worker of its own.
        Raises AwaitTimeout naming the robot and the seconds waited.
        """
        reply_name, reply_key, ttl = self._reply_stream(from_, timeout)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xgroup_create(reply_key, "_", id="$", mkstream=True)
        pipe.expire(reply_key, ttl)
        with out_of_memory(f"the reply stream of a request to {to!r}"):
            pipe.execute()
        try:
            message = self.publish(
                to,
                content,
                from_=from_,
                reply_to=reply_name,
                conversation_id=conversation_id,
                headers=headers,
                deadline=deadline,
                extensions=extensions,
                kind=kind,
                in_reply_to=in_reply_to,
            )
            return self._await_reply(reply_key, message, to, timeout)
        finally:
            self.redis.delete(reply_key)

    async def arequest(
        self,
        to: str,
        content: str | Mapping[str, Any],
        *,
        timeout: float = 30.0,
        from_: str = "client",
        conversation_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: _dt.datetime | _dt.timedelta | float | None = None,
        kind: str = "message",
        in_reply_to: str | None = None,
    ) -> RobotMessage:
        """:meth:`request` on the asyncio client: the wait for the reply is an awaited
        ``XREAD BLOCK``, so one event loop waits on many requests at once."""
        reply_name, reply_key, ttl = self._reply_stream(from_, timeout)
        r = self.aredis
        pipe = r.pipeline(transaction=False)
        pipe.xgroup_create(reply_key, "_", id="$", mkstream=True)
        pipe.expire(reply_key, ttl)
        with out_of_memory(f"the reply stream of a request to {to!r}"):
            await pipe.execute()
        try:
            message = await self.apublish(to, content, from_=from_, reply_to=reply_name,
                                          conversation_id=conversation_id, headers=headers, deadline=deadline,
                                          kind=kind, in_reply_to=in_reply_to)
            end = time.monotonic() + timeout
            cursor = "0-0"
            while True:
                block = self._block_ms(end, timeout, message, to)
                result = await r.xread({reply_key: cursor}, count=16, block=block)
                cursor, reply = self._match_reply(reply_key, result, cursor, message, to)
                if reply is not None:
                    return reply
        finally:
            await r.delete(reply_key)

    def _reply_stream(self, from_: str, timeout: float) -> tuple[str, str, int]:
        """(name, key, TTL) of a new private reply stream for one request, named after the
        sender, so a Redis ACL can give each sender its own reply streams (robot-lab acl:
        ``~<prefix>:bus:_reply.<from>.*``); a name too long for that stays anonymous."""
        reply_name = f"{REPLY_PREFIX}{from_}.{new_id()}" if len(from_) <= 150 else f"{REPLY_PREFIX}{new_id()}"
        return reply_name, self.keys.inbox(reply_name), max(60, int(timeout) + 60)

    def _await_reply(self, reply_key: str, message: RobotMessage, to: str, timeout: float) -> RobotMessage:
        end = time.monotonic() + timeout
        cursor = "0-0"
        while True:
            block = self._block_ms(end, timeout, message, to)
            result = self.redis.xread({reply_key: cursor}, count=16, block=block)
            cursor, reply = self._match_reply(reply_key, result, cursor, message, to)
            if reply is not None:
                return reply

    @staticmethod
    def _block_ms(end: float, timeout: float, message: RobotMessage, to: str) -> int:
        """Milliseconds of the next XREAD BLOCK; AwaitTimeout once the request timed out."""
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise AwaitTimeout(f"no reply from robot {to!r} within {timeout:g} s (message {message.id})")
        # short blocks: redis-py 8 clients default to a 5 s socket timeout
        return max(1, int(min(remaining, 1.0) * 1000))

    def _match_reply(self, reply_key: str, result: Any, cursor: str, message: RobotMessage, to: str
                     ) -> tuple[str, RobotMessage | None]:
        """(new cursor, the authentic reply to ``message`` among the XREAD ``result`` or
        None); RemoteError when the reply is an error envelope."""
        for _stream, entries in result or []:
            for entry_id, fields in entries:
                cursor = _s(entry_id)
                raw = fields.get(b"envelope", b"")
                try:
                    reply = decode_message(raw)
                except SchemaError as exc:
                    log.warning("bus.bad_reply", stream=reply_key, error=str(exc))
                    continue
                if reply.in_reply_to == message.id and self._authentic_reply(raw, reply, to):
                    if reply.kind == "error":
                        raise RemoteError(
                            f"robot {to!r} could not handle message {message.id}: {reply.content}",
                            reason=reply.headers.get("error"),
                        )
                    return cursor, reply
        return cursor, None

    def _authentic_reply(self, raw: bytes, reply: RobotMessage, to: str) -> bool:
        """Under ``verify`` warn/require a reply must come from ``to`` and be signed with
        one of its keys; require skips (and logs) any other, warn only logs it."""
        if self.verify == "off":
            return True
        problem = (f"a reply from {reply.from_!r} to a request sent to {to!r}" if reply.from_ != to
                   else self.keyring.problem(raw, reply))
        if not problem:
            return True
        log.warning("bus.unauthenticated", robot=to, message_id=reply.id, sender=reply.from_, error=problem,
                    mode=self.verify, where="request")
        return self.verify != "require"

