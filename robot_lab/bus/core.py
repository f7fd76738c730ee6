"""The publishing side of the bus: robot inboxes as Redis Streams.

A robot's inbox is the stream ``<prefix>:bus:<robot>`` (``Keys.inbox``) with one consumer
group named after the robot. Each entry has ONE field, ``envelope``, holding the
RobotMessage JSON, so any language can publish with a plain ``XADD``.

The port of the Ruby gem's TypedBus + BusMessaging publishing half: ``publish`` (an unknown
channel raises, as the Ruby gem's "Unknown channel"), ``send_message`` with an outbox kept in
Redis so the reply is matched on whichever worker it lands, ``send_reply``, and
``request`` which blocks for the reply. ``apublish`` / ``arequest`` are the same on
redis-py's asyncio client (docs/async.md). Each concern beyond publishing is a mixin of its
own module: :mod:`.requests` (request / reply), :mod:`.outbox` (``send_message`` and its
outbox), :mod:`.dlq` (dead letters); statistics stay here because the CLI and tests use them
without a poller.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import redis as _redis

from robot_lab import coalesce
from robot_lab.bus import stream_scripts as scripts
from robot_lab.bus.dlq import DeadLetters
from robot_lab.bus.names import check_robot_name
from robot_lab.bus.outbox import Outbox
from robot_lab.bus.inbox_stats import InboxStats, inbox_stats
from robot_lab.bus.requests import Requests
from robot_lab.bus.keyring import Keyring, default_keyring
from robot_lab.bus.reply_files import fetch_file
from robot_lab.connection import async_client_for, get_redis
from robot_lab.errors import BusError, SchemaError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.outage import is_oom, out_of_memory
from robot_lab.schemas import RobotMessage, encode_message, utcnow
from robot_lab.settings import get_settings
from robot_lab.text.strings import as_str as _s
from robot_lab.tracing import outgoing_traceparent

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient
    from robot_lab.settings import BusSettings  # a name only: no pydantic models at import (start-up time)

log = get_logger("robot_lab.bus")

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
    extensions: Mapping[str, Any] | None = None,
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
        extensions=dict(extensions or {}),  # top-level extension fields, such as ``attachments``
    )


def _trim_refused(exc: Exception, inbox: str) -> None:
    """A TRIM of another robot's inbox this process may not run: a Redis ACL user limited to
    appending (robot-lab acl) may not, and need not -- each robot's own poller trims its
    inbox in its reclaim sweep. Any other error is raised."""
    if is_oom(exc):  # the message is appended; trimming is housekeeping (the poller trims too)
        log.debug("bus.trim_out_of_memory", stream=inbox)
        return
    if not (isinstance(exc, _redis.exceptions.NoPermissionError) or "NOPERM" in str(exc)):
        raise exc
    log.debug("bus.trim_not_permitted", stream=inbox)


class Bus(Requests, Outbox, DeadLetters):
    """Inbox streams of robots on one Redis: register, publish, reply, request, inspect."""

    def __init__(
        self,
        redis: RedisClient | None = None,
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
        extensions: Mapping[str, Any] | None = None,
    ) -> RobotMessage:
        """Append a RobotMessage to ``to``'s inbox and return it (its ``id`` is the key).

        Raises BusError for a robot nobody registered (robot_lab: "Unknown channel"),
        unless ``create=True``, which registers it first.
        """
        message = self.keyring.sign(build_message(
            to, content, from_=from_, kind=kind, reply_to=reply_to, conversation_id=conversation_id,
            correlation_id=correlation_id, in_reply_to=in_reply_to, headers=headers, deadline=deadline,
            extensions=extensions))
        self.publish_message(message, create=create)
        return message

    def publish_message(self, message: RobotMessage, *, create: bool = False) -> str:
        """Append an already-built envelope; returns the stream entry id. An unsigned
        envelope is signed when a key for its ``from`` is configured; one that carries a
        signature is sent as it is."""
        data = self._envelope(message)
        with out_of_memory(f"the message to {message.to!r}"):
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
        with out_of_memory(f"the message to {message.to!r}"):
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
            # a served message's reply: with other handlers' round trips (robot_lab.coalesce)
            entry = coalesce.script(self._append_reply, [inbox], [data, int(self.settings.reply_ttl)])
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

    def fetch_file(self, attachment: Mapping[str, Any] | str) -> bytes:
        """The bytes of a reply's attachment (inline or stored by reference; a ``ref``
        string alone works too), checked against its sha256 (:mod:`robot_lab.bus.reply_files`)."""
        return fetch_file(self, attachment)

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

    # --- statistics -------------------------------------------------------------------
    def stats(self, robots: Iterable[str] | None = None) -> list[InboxStats]:
        """Per robot: length, groups, consumers, pending, lag and DLQ size (XINFO)."""
        return inbox_stats(self.redis, self.keys, list(robots) if robots is not None else self.robots())
