"""The publishing side of the bus: robot inboxes as Redis Streams.

A robot's inbox is the stream ``<prefix>:bus:<robot>`` (``Keys.inbox``) with one consumer
group named after the robot. Each entry has ONE field, ``envelope``, holding the
RobotMessage JSON, so any language can publish with a plain ``XADD``.

The port of robot_lab's TypedBus + BusMessaging publishing half: ``publish`` (an unknown
channel raises, as robot_lab's "Unknown channel"), ``send_message`` with an outbox kept in
Redis so the reply is matched on whichever worker it lands, ``send_reply``, and
``request`` which blocks for the reply. ``apublish`` / ``arequest`` are the same on
redis-py's asyncio client (docs/async.md). Dead-letter and statistics helpers live here too
because the CLI and tests use them without a poller.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis as _redis

from robot_lab.errors import AwaitTimeout, BusError, RemoteError, SchemaError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.observability import hooks as observe
from robot_lab.schemas import RobotMessage, decode_message, encode_message, new_id, utcnow
from robot_lab.bus.replies import REPLY_STREAM_PREFIX
from robot_lab.settings import BusSettings, get_settings
from robot_lab.text.strings import as_str as _s
from robot_lab.bus import scripts
from robot_lab.bus.dlq import DeadLetters
from robot_lab.bus.records import InboxStats, OutboxEntry
from robot_lab.bus.signing import Keyring, default_keyring

log = get_logger("robot_lab.bus")

# A robot name becomes part of Redis keys: ':' would let "x:dlq" alias robot x's DLQ,
# braces would break cluster hash tags, whitespace breaks the CLI.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.@/+\-]{1,200}$")
REPLY_PREFIX = REPLY_STREAM_PREFIX  # reply streams: "_reply.<from>.<id>" (replies.reply_allowed lets them through)


def check_robot_name(name: Any, field: str = "robot") -> str:
    """Return ``name`` if it is usable as a robot / channel name, else raise BusError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise BusError(
            f"invalid {field} name {name!r}: use 1-200 characters from letters, digits and "
            "_ . @ / + - (no ':', braces or spaces)"
        )
    return name


def _deadline(value: _dt.datetime | _dt.timedelta | float | int | None) -> _dt.datetime | None:
    """Absolute deadline from a datetime, a timedelta or seconds from now."""
    if value is None or isinstance(value, _dt.datetime):
        if isinstance(value, _dt.datetime) and value.tzinfo is None:
            raise BusError("deadline must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return value
    if isinstance(value, _dt.timedelta):
        return utcnow() + value
    if isinstance(value, (int, float)):
        return utcnow() + _dt.timedelta(seconds=float(value))
    raise BusError(f"deadline must be a datetime, timedelta or seconds, not {type(value).__name__}")


def _with_traceparent(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Every envelope carries a W3C ``traceparent``: the caller's, else a child of the
    current trace, else a new one."""
    from robot_lab.tracing import outgoing_traceparent

    result = dict(headers or {})
    result.setdefault("traceparent", outgoing_traceparent())
    return result




def build_message(
    to: str,
    content: str | Mapping[str, Any],
    *,
    from_: str = "anonymous",
    kind: str = "message",
    reply_to: str | None = None,
    conversation_id: str | None = None,
    correlation_id: str | None = None,
    in_reply_to: str | None = None,
    headers: Mapping[str, str] | None = None,
    deadline: _dt.datetime | _dt.timedelta | float | None = None,
) -> RobotMessage:
    """The (unsigned) envelope :meth:`Bus.publish` / :meth:`Bus.apublish` append: checked,
    with a traceparent and an absolute deadline."""
    check_robot_name(to, "recipient")
    if not isinstance(content, (str, Mapping)):
        raise BusError(f"content must be a string or a JSON object, not {type(content).__name__}")
    return RobotMessage(
        to=to,
        content=content if isinstance(content, str) else dict(content),
        kind=kind,
        from_=from_,
        reply_to=reply_to,
        conversation_id=conversation_id,
        correlation_id=correlation_id,
        in_reply_to=in_reply_to,
        headers=_with_traceparent(headers),
        deadline=_deadline(deadline),
    )


def _trim_refused(exc: Exception, inbox: str) -> None:
    """A TRIM of another robot's inbox this process may not run: a Redis ACL user limited to
    appending (robot-lab acl) may not, and need not -- each robot's own poller trims its
    inbox in its reclaim sweep. Any other error is raised."""
    if not (isinstance(exc, _redis.exceptions.NoPermissionError) or "NOPERM" in str(exc)):
        raise exc
    log.debug("bus.trim_not_permitted", stream=inbox)


class Bus(DeadLetters):
    """Inbox streams of robots on one Redis: register, publish, reply, request, inspect."""

    def __init__(
        self,
        redis: _redis.Redis | None = None,
        *,
        keys: Keys | None = None,
        settings: BusSettings | None = None,
        keyring: Keyring | None = None,
        verify: str | None = None,
        aredis: Any = None,
    ) -> None:
        """``aredis`` is the asyncio client of :meth:`apublish` / :meth:`arequest`; by
        default one to the same server as ``redis`` per event loop
        (:func:`robot_lab.connection.async_client_for`)."""
        self._aredis = aredis
        if redis is None:
            from robot_lab.connection import get_redis

            redis = get_redis()
        self.redis = redis
        self.keys = keys or default_keys()
        self.settings = settings or get_settings().bus
        # signs what a sender with a key publishes or replies; pollers check entries with it
        self.keyring = keyring if keyring is not None else default_keyring()
        # how ``request`` checks the replies it waits for (off | warn | require)
        self.verify = verify or get_settings().signing.verify
        r = self.redis
        self._append_reply = r.register_script(scripts.APPEND_REPLY)
        self._trim = r.register_script(scripts.TRIM)
        self._since_trim: dict[str, int] = {}
        self._read = r.register_script(scripts.READ)
        self._acquire = r.register_script(scripts.ACQUIRE)
        self._complete = r.register_script(scripts.COMPLETE)
        self._dead = r.register_script(scripts.DEAD_LETTER)
        self._heartbeat = r.register_script(scripts.HEARTBEAT)
        self._hand_back = r.register_script(scripts.HAND_BACK)
        self._reap = r.register_script(scripts.REAP)
        self._outbox_reply = r.register_script(scripts.OUTBOX_REPLY)

    # --- registry ---------------------------------------------------------------------
    def register(self, robot: str) -> None:
        """Create the robot's inbox and consumer group (idempotent) and list it.

        The group starts at id 0 so entries published before registration (by a plain
        XADD, say) are delivered too.
        """
        check_robot_name(robot)
        inbox = self.keys.inbox(robot)
        try:
            self.redis.xgroup_create(inbox, robot, id="0", mkstream=True)
        except _redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        pipe = self.redis.pipeline(transaction=False)
        pipe.persist(inbox)  # a reply stream created with a TTL becomes a real inbox
        pipe.sadd(self.keys.registry(), robot)
        pipe.execute()

    def unregister(self, robot: str, *, drop: bool = False) -> None:
        """Remove from the registry; ``drop=True`` also deletes inbox, DLQ and group."""
        self.redis.srem(self.keys.registry(), robot)
        if drop:
            self.redis.delete(self.keys.inbox(robot), self.keys.dlq(robot))

    def robots(self) -> list[str]:
        """Registered robot names, sorted."""
        return sorted(_s(m) for m in self.redis.smembers(self.keys.registry()))

    def exists(self, robot: str) -> bool:
        """Whether the robot has an inbox (what ``publish`` checks, atomically)."""
        return bool(self.redis.exists(self.keys.inbox(robot)))

    # --- publishing -------------------------------------------------------------------
    @observe.bus_publish
    def publish(
        self,
        to: str,
        content: str | Mapping[str, Any],
        *,
        from_: str = "anonymous",
        kind: str = "message",
        reply_to: str | None = None,
        conversation_id: str | None = None,
        correlation_id: str | None = None,
        in_reply_to: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: _dt.datetime | _dt.timedelta | float | None = None,
        create: bool = False,
    ) -> RobotMessage:
        """Append a RobotMessage to ``to``'s inbox and return it (its ``id`` is the key).

        Raises BusError for a robot nobody registered (robot_lab: "Unknown channel"),
        unless ``create=True``, which registers it first.
        """
        message = self.keyring.sign(build_message(
            to, content, from_=from_, kind=kind, reply_to=reply_to, conversation_id=conversation_id,
            correlation_id=correlation_id, in_reply_to=in_reply_to, headers=headers, deadline=deadline))
        self.publish_message(message, create=create)
        return message

    def publish_message(self, message: RobotMessage, *, create: bool = False) -> str:
        """Append an already-built envelope; returns the stream entry id. An unsigned
        envelope is signed when a key for its ``from`` is configured; one that carries a
        signature is sent as it is."""
        data = self._envelope(message)
        entry = self._append(message.to, data, mode="strict")
        if entry is None and create:
            self.register(message.to)
            entry = self._append(message.to, data, mode="strict")
        if entry is None:
            raise self._unknown_channel(message.to)
        return entry

    @observe.bus_publish
    async def apublish(
        self,
        to: str,
        content: str | Mapping[str, Any],
        *,
        from_: str = "anonymous",
        kind: str = "message",
        reply_to: str | None = None,
        conversation_id: str | None = None,
        correlation_id: str | None = None,
        in_reply_to: str | None = None,
        headers: Mapping[str, str] | None = None,
        deadline: _dt.datetime | _dt.timedelta | float | None = None,
        create: bool = False,
    ) -> RobotMessage:
        """:meth:`publish` on the asyncio client: the same envelope, signature, checks and errors."""
        message = self.keyring.sign(build_message(
            to, content, from_=from_, kind=kind, reply_to=reply_to, conversation_id=conversation_id,
            correlation_id=correlation_id, in_reply_to=in_reply_to, headers=headers, deadline=deadline))
        await self.apublish_message(message, create=create)
        return message

    async def apublish_message(self, message: RobotMessage, *, create: bool = False) -> str:
        """:meth:`publish_message` on the asyncio client."""
        data = self._envelope(message)
        entry = await self._aappend(message.to, data)
        if entry is None and create:
            await asyncio.to_thread(self.register, message.to)  # once per new robot: no async twin needed
            entry = await self._aappend(message.to, data)
        if entry is None:
            raise self._unknown_channel(message.to)
        return entry

    @property
    def aredis(self) -> Any:
        """The asyncio client (must be read inside the event loop that uses it)."""
        if self._aredis is not None:
            return self._aredis
        from robot_lab.connection import async_client_for

        return async_client_for(self.redis)

    def _envelope(self, message: RobotMessage) -> bytes:
        """The envelope's JSON, signed when unsigned and a key for its sender is configured,
        and checked (recipient name, schema, ``bus.max_envelope_bytes``)."""
        check_robot_name(message.to, "recipient")
        if message.signature is None:
            message = self.keyring.sign(message)
        try:
            data = encode_message(message)
        except SchemaError as exc:
            raise BusError(f"cannot publish to {message.to!r}: {exc}") from exc
        limit = int(self.settings.max_envelope_bytes)
        if 0 < limit < len(data):
            raise BusError(f"cannot publish to {message.to!r}: the envelope is {len(data)} bytes; the limit is "
                           f"{limit} (setting bus.max_envelope_bytes)")
        return data

    def _unknown_channel(self, robot: str) -> BusError:
        return BusError(
            f"Unknown channel: {robot!r} (no robot registered an inbox "
            f"{self.keys.inbox(robot)!r}; register it or publish with create=True)"
        )

    def _append(self, robot: str, data: bytes, *, mode: str) -> str | None:
        """XADD the envelope; None when ``mode='strict'`` and the inbox does not exist.

        Trimming runs every ``maxlen // 10`` publishes of this process (TRIM script), not on
        each one, so a publish costs one plain ``XADD ... NOMKSTREAM``.
        """
        inbox = self.keys.inbox(robot)
        if mode == "strict":
            entry = self.redis.xadd(inbox, {"envelope": data}, nomkstream=True)
        else:
            entry = self._append_reply(keys=[inbox], args=[data, int(self.settings.reply_ttl)])
        if not entry:
            return None
        maxlen = self._trim_due(robot)
        if maxlen:
            try:
                self._trim(keys=[inbox], args=[maxlen])
            except _redis.ResponseError as exc:
                _trim_refused(exc, inbox)
        return _s(entry)

    async def _aappend(self, robot: str, data: bytes) -> str | None:
        """:meth:`_append` (strict mode) on the asyncio client."""
        inbox = self.keys.inbox(robot)
        r = self.aredis
        entry = await r.xadd(inbox, {"envelope": data}, nomkstream=True)
        if not entry:
            return None
        maxlen = self._trim_due(robot)
        if maxlen:
            try:
                await r.register_script(scripts.TRIM)(keys=[inbox], args=[maxlen])
            except _redis.ResponseError as exc:
                _trim_refused(exc, inbox)
        return _s(entry)

    def _trim_due(self, robot: str) -> int:
        """Count one publish to ``robot``; the stream's ``maxlen`` when a trim is due, else 0."""
        maxlen = int(self.settings.maxlen)
        if maxlen <= 0:
            return 0
        n = self._since_trim.get(robot, 0) + 1
        due = n >= max(1, maxlen // 10)
        self._since_trim[robot] = 0 if due else n
        return maxlen if due else 0

    def send_message(
        self, to: str, content: str | Mapping[str, Any], *, from_: str, **kwargs: Any
    ) -> RobotMessage:
        """robot_lab's ``send_message``: publish and record ``outbox[id] = sent`` for
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

    def send_reply(
        self,
        original: RobotMessage,
        content: str | Mapping[str, Any],
        *,
        from_: str | None = None,
        **kwargs: Any,
    ) -> RobotMessage:
        """Reply to ``original``: to its ``reply_to`` (else its sender), ``in_reply_to`` its id,
        same conversation. A missing reply stream is created with a TTL rather than refused,
        so a reply is never dropped because the requester stopped waiting."""
        reply = self.build_reply(original, content, from_=from_, **kwargs)
        if self.deliver_reply(reply) is None:
            raise BusError(f"cannot reply to message {original.id}: {reply.to!r} is not a valid inbox name")
        return reply

    def build_reply(
        self,
        original: RobotMessage,
        content: str | Mapping[str, Any],
        *,
        from_: str | None = None,
        headers: Mapping[str, str] | None = None,
        kind: str = "reply",
    ) -> RobotMessage:
        target = original.reply_to or original.from_
        merged = {k: v for k, v in original.headers.items() if k in ("traceparent", "tracestate")}
        merged.update(headers or {})
        return RobotMessage(
            to=target,
            content=content if isinstance(content, str) else dict(content),
            kind=kind,
            from_=from_ or original.to,
            in_reply_to=original.id,
            conversation_id=original.conversation_id,
            correlation_id=original.correlation_id or original.id,
            headers=merged,
        )

    def deliver_reply(self, reply: RobotMessage) -> str | None:
        """Append a reply envelope to its target's stream; None when the target name is not
        a valid channel (logged, not raised: a bad ``reply_to`` must not poison a message)."""
        try:
            check_robot_name(reply.to, "reply_to")
        except BusError as exc:
            log.warning("bus.reply_dropped", to=reply.to, in_reply_to=reply.in_reply_to, error=str(exc))
            return None
        if reply.signature is None:
            reply = self.keyring.sign(reply)
        return self._append(reply.to, encode_message(reply), mode="reply")

    # --- request / reply --------------------------------------------------------------
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

    # --- statistics -------------------------------------------------------------------
    def stats(self, robots: Iterable[str] | None = None) -> list[InboxStats]:
        """Per robot: length, groups, consumers, pending, lag and DLQ size (XINFO)."""
        names = list(robots) if robots is not None else self.robots()
        rows: list[InboxStats] = []
        for robot in names:
            inbox = self.keys.inbox(robot)
            try:
                info = self.redis.xinfo_stream(inbox)
                groups = self.redis.xinfo_groups(inbox)
            except _redis.ResponseError:  # no such key
                rows.append(InboxStats(robot, 0, 0, 0, 0, None, self.dlq_size(robot)))
                continue
            lags = [g.get("lag") for g in groups]
            lag = None if any(v is None for v in lags) else sum(int(v) for v in lags)
            rows.append(
                InboxStats(
                    robot=robot,
                    length=int(info.get("length", 0)),
                    groups=len(groups),
                    consumers=sum(int(g.get("consumers", 0)) for g in groups),
                    pending=sum(int(g.get("pending", 0)) for g in groups),
                    lag=lag,
                    dlq=self.dlq_size(robot),
                    last_entry=_s(info.get("last-generated-id")),
                )
            )
        return rows
