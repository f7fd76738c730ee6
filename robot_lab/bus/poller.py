"""BusPoller: one consumer of one robot's inbox (robot_lab's BusPoller, made distributed).

Each worker process runs one BusPoller per robot it serves; all of them are consumers of
the robot's consumer group, so Redis spreads the entries between them. The poller:

* reads in batches (``XREADGROUP`` inside the READ script, which also queues entries of
  a conversation in stream order) and calls the handler once per envelope;
* acknowledges only after the handler, and any reply, succeeded;
* runs the entries of one conversation one at a time and in stream order across every
  consumer of the group: an entry may run only while it is the head of its conversation
  list (ACQUIRE); later ones wait, still pending and heart-beaten, in this consumer;
* on start replays its own pending entries, then periodically reclaims entries idle longer
  than the visibility timeout in dead consumers (``XAUTOCLAIM``) and deletes consumers
  left with nothing pending;
* dead-letters entries that fail validation (at once), whose deadline passed, or that were
  delivered ``max_deliveries`` times; the worker carries on with the next entry.

Usable embedded (``poll()`` / ``run_once()`` for deterministic tests, ``start()``/``stop()``
for a background thread) and as the long-running loop of ``robot-lab worker``
(``run_forever(stop_event)``; a graceful stop hands back entries it never started).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import redis as _redis

from robot_lab.errors import BusError, SchemaError
from robot_lab.logging import get_logger, log_context
from robot_lab.tracing import continue_trace
from robot_lab.schemas import RobotMessage, decode_message, encode_message, utcnow
from robot_lab.bus.core import Bus, check_robot_name
from robot_lab.bus.delivery import ACKED, DEAD, NACKED, PENDING, Delivery

log = get_logger("robot_lab.bus.poller")

Handler = Callable[[Delivery], Any]


from robot_lab.text.strings import as_str as _s  # noqa: E402 - kept here for a trivial merge


def flatten_content(content: str | Mapping[str, Any]) -> str:
    """robot_lab's ``serve`` input: a Hash content becomes ``"k: v"`` lines."""
    if isinstance(content, str):
        return content
    return "\n".join(f"{k}: {v}" for k, v in content.items())


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


class BusPoller:
    """Consume ``robot``'s inbox as consumer ``consumer`` of the group named ``robot``."""

    def __init__(
        self,
        robot: str,
        bus: Bus | None = None,
        *,
        redis: _redis.Redis | None = None,
        consumer: str | None = None,
        batch_size: int | None = None,
        block_ms: int | None = None,
        visibility_timeout: float | None = None,
        max_deliveries: int | None = None,
        retry_delay: float | None = None,
        claim_interval: float | None = None,
        register: bool = True,
    ) -> None:
        self.robot = check_robot_name(robot)
        self.bus = bus or Bus(redis)
        self.redis = self.bus.redis
        cfg = self.bus.settings
        self.consumer = consumer or default_consumer_name()
        self.batch_size = int(batch_size or cfg.batch_size)
        self.block_ms = int(cfg.block_ms if block_ms is None else block_ms)
        self.visibility_timeout = float(visibility_timeout or cfg.visibility_timeout)
        self.max_deliveries = int(max_deliveries or cfg.max_deliveries)
        self.retry_delay = float(cfg.retry_delay if retry_delay is None else retry_delay)
        self.claim_interval = float(claim_interval or max(0.05, self.visibility_timeout / 2))
        self.heartbeat_interval = max(0.02, self.visibility_timeout / 3)
        self.max_held = self.batch_size * 4
        self._register = register
        self.inbox = self.bus.keys.inbox(robot)
        self.dlq = self.bus.keys.dlq(robot)
        self._vis_ms = max(1, int(self.visibility_timeout * 1000))

        self._handler: Handler = lambda d: None  # robot_lab: an incoming message never runs the LLM by default
        self._auto_ack = True
        self._held: OrderedDict[str, Delivery] = OrderedDict()
        self._lost: set[str] = set()
        self._current: Delivery | None = None
        self._cursor = "0-0"
        self._drained = False
        self._ack_queue: list[str] = []
        self._started = False
        self._last_claim = 0.0
        self._last_beat = 0.0
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self.counts = {"acked": 0, "dead": 0, "retried": 0, "reclaimed": 0}

    # --- handler styles ---------------------------------------------------------------
    def on_message(self, fn: Callable[..., Any], *, manual: bool | None = None) -> BusPoller:
        """``fn(message)``: acked after it returns. ``fn(delivery, message)`` (or
        ``manual=True``): the handler calls ``delivery.ack()`` / ``nack()`` itself; one that
        returns without resolving is nacked (redelivered later) with a warning."""
        manual = _positional_arity(fn) >= 2 if manual is None else manual
        if manual:
            self._handler = lambda d: fn(d, d.message)
            self._auto_ack = False
        else:
            self._handler = lambda d: fn(d.message)
            self._auto_ack = True
        return self

    def respond_to_tasks(
        self, fn: Callable[[RobotMessage], Any], *, auto_reply: bool = True
    ) -> BusPoller:
        """``fn(message) -> reply content | None``; the reply goes to ``reply_to`` (else the
        sender). Replies are acked without calling ``fn`` (no ping-pong). The reply of each
        handled message id is recorded, so a redelivery re-sends it instead of calling
        ``fn`` (an LLM) again."""
        self._handler = lambda d: self._respond(d, fn, auto_reply)
        self._auto_ack = True
        return self

    def serve(self, robot: Any, *, auto_reply: bool = True, **run_kwargs: Any) -> BusPoller:
        """Run ``robot.run(text, **run_kwargs)`` on each task and reply with ``.reply``
        (a dict content is flattened to ``"k: v"`` lines, as robot_lab does)."""

        takes_conversation = "conversation_id" in inspect.signature(robot.run).parameters
        takes_attachments = "attachments" in inspect.signature(robot.run).parameters

        def run(message: RobotMessage) -> Any:
            kwargs = dict(run_kwargs)
            if takes_conversation and message.conversation_id and "conversation_id" not in kwargs:
                kwargs["conversation_id"] = message.conversation_id  # any worker continues the chat
            if takes_attachments and message.extensions.get("attachments") and "attachments" not in kwargs:
                kwargs["attachments"] = message.extensions["attachments"]  # files for the skills' workspace
            result = robot.run(flatten_content(message.content), **kwargs)
            return getattr(result, "reply", result)

        return self.respond_to_tasks(run, auto_reply=auto_reply)

    def _respond(self, d: Delivery, fn: Callable[[RobotMessage], Any], auto_reply: bool) -> None:
        msg = d.message
        assert msg is not None
        if msg.is_reply:
            return
        r, keys = self.redis, self.bus.keys
        record_key = keys.replied_for(self.robot, msg.id)
        recorded = r.get(record_key)
        if recorded is not None:
            if recorded:
                self.bus.deliver_reply(decode_message(recorded))
            log.info("bus.reply_resent", entry=d.entry_id, deliveries=d.deliveries)
            return
        content = fn(msg)
        if content is not None and not isinstance(content, (str, Mapping)):
            content = getattr(content, "reply", None) if hasattr(content, "reply") else str(content)
        ttl = int(self.bus.settings.reply_ttl)
        if content is None or not auto_reply:
            r.set(record_key, b"", nx=True, ex=ttl)
            return
        reply = self.bus.build_reply(msg, content, from_=self.robot)
        if not r.set(record_key, encode_message(reply), nx=True, ex=ttl):
            # another consumer handled it meanwhile: send the reply it recorded, not ours
            existing = r.get(record_key)
            reply = decode_message(existing) if existing else None  # type: ignore[assignment]
        if reply is not None:
            self.bus.deliver_reply(reply)

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> BusPoller:
        """Run ``run_forever`` in a daemon thread (embedded mode)."""
        if self._thread and self._thread.is_alive():
            return self
        if self._register:  # registered before start() returns: publishing right after works
            self.bus.register(self.robot)
        self._stop_event = threading.Event()
        self._thread = threading.Thread(
            target=self.run_forever, args=(self._stop_event,), name=f"bus-poller-{self.robot}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the thread after the entry in hand; unstarted entries are handed back."""
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def __enter__(self) -> BusPoller:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def run_forever(self, stop_event: threading.Event | None = None) -> None:
        """Poll until ``stop_event`` is set; survive Redis outages with a backoff. On exit,
        hand back entries held but not started so other consumers take them at once."""
        stop = stop_event or self._stop_event
        beat_stop = threading.Event()
        beater = threading.Thread(target=self._heartbeat_loop, args=(beat_stop,), daemon=True,
                                  name=f"bus-heartbeat-{self.robot}")
        backoff = 0.1
        log.info("bus.poller_started", robot=self.robot, consumer=self.consumer)
        try:
            beater.start()
            while not stop.is_set():
                try:
                    self.poll(block_ms=self.block_ms)
                    backoff = 0.1
                except (_redis.ConnectionError, _redis.TimeoutError) as exc:
                    log.warning("bus.redis_unavailable", robot=self.robot, error=str(exc), retry_in=backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            beat_stop.set()
            beater.join(5)
            try:
                self.hand_back()
            except _redis.RedisError as exc:  # the entries stay pending; XAUTOCLAIM recovers them
                log.warning("bus.hand_back_failed", robot=self.robot, error=str(exc))
            log.info("bus.poller_stopped", robot=self.robot, consumer=self.consumer, **self.counts)

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_interval):
            try:
                self._heartbeat()
            except _redis.RedisError as exc:
                log.warning("bus.heartbeat_failed", robot=self.robot, error=str(exc))

    # --- one round --------------------------------------------------------------------
    def run_once(self, block_ms: int = 0) -> int:
        """One round, without blocking by default; returns how many entries were resolved."""
        return self.poll(block_ms=block_ms)

    def poll(self, max_messages: int | None = None, block_ms: int | None = None) -> int:
        """Handle up to ``max_messages`` entries: replay/reclaim when due, run what is ready,
        read a batch (waiting up to ``block_ms`` when there is nothing to do). Returns the
        number of entries resolved (acked or dead-lettered)."""
        block = self.block_ms if block_ms is None else block_ms
        done = self._start_if_needed()
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_interval:
            self._heartbeat()
        if now - self._last_claim >= self.claim_interval:
            done += self._claim_stale()
        self._drop_lost()
        done += self._process_ready(self._left(max_messages, done))
        if self._left(max_messages, done) == 0:
            return done
        if len(self._held) < self.max_held:
            if self._drained and block > 0 and not self._has_ready():
                # the last read emptied the inbox: wait for news first (one round trip
                # less per message when idle), then read
                if not self._wait_for_entries(self._recheck_ms(block)):
                    return done + self._process_ready(self._left(max_messages, done))
            done += self._read()
            done += self._process_ready(self._left(max_messages, done))
        elif block > 0 and not self._has_ready():
            time.sleep(self._recheck_ms(block) / 1000)
        if block == 0:  # a non-blocking round leaves nothing unsent (deterministic tests)
            self.flush_acks()
        return done

    @staticmethod
    def _left(limit: int | None, done: int) -> int | None:
        return None if limit is None else max(0, limit - done)

    def _start_if_needed(self) -> int:
        if self._started:
            return 0
        if self._register:
            self.bus.register(self.robot)
        self._started = True
        return self._replay_own()

    def _has_ready(self) -> bool:
        now = time.monotonic()
        return any(d.retry_at <= now and d.conversation is None for d in self._held.values())

    def _recheck_ms(self, block: int) -> int:
        """How long to wait for new entries: ``block``, or less when held entries wait for a
        retry time or for a conversation another consumer is still working on."""
        if not self._held:
            return block
        now = time.monotonic()
        retry = min((d.retry_at for d in self._held.values()), default=now)
        if retry > now:
            return max(1, min(block, int((retry - now) * 1000)))
        return min(block, 20)

    # --- reading ----------------------------------------------------------------------
    def _read(self) -> int:
        """READ a batch (non-blocking); returns how many were dead-lettered at intake.
        Sets ``_drained`` when the inbox had fewer new entries than asked for."""
        count = min(self.batch_size, self.max_held - len(self._held))
        if count <= 0:
            return 0
        self._drained = False
        try:
            if self._ack_queue:  # acks of the last batch ride along: one round trip
                pipe = self.redis.pipeline(transaction=False)
                self._queue_acks_on(pipe)
                self.bus._read(keys=[self.inbox], args=[self.robot, self.consumer, count], client=pipe)
                entries, last = pipe.execute()[-1]
            else:
                entries, last = self.bus._read(keys=[self.inbox], args=[self.robot, self.consumer, count])
        except _redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            if not self._register:
                raise BusError(f"robot {self.robot!r} has no consumer group on {self.inbox!r}") from exc
            log.warning("bus.group_recreated", robot=self.robot)
            self.bus.register(self.robot)
            return 0
        if last:
            self._cursor = _s(last)
        self._drained = len(entries) < count
        dead = 0
        for entry_id, flat, cid in entries:
            entry = _s(entry_id)
            self._cursor = entry
            fields = {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}
            dead += self._intake(entry, fields, 1, _s(cid) if cid else None, from_script=True)
        return dead

    def _wait_for_entries(self, block_ms: int) -> bool:
        """Block (plain XREAD, consumes nothing) until an entry newer than the group's last
        delivered one exists; avoids both busy polling and lost wake-ups."""
        if self._ack_queue:  # send pending acks with the wait: Redis runs them at once
            pipe = self.redis.pipeline(transaction=False)
            self._queue_acks_on(pipe)
            pipe.xread({self.inbox: self._cursor}, count=1, block=block_ms)
            result = pipe.execute()[-1]
        else:
            result = self.redis.xread({self.inbox: self._cursor}, count=1, block=block_ms)
        return bool(result and result[0][1])

    def _queue_acks_on(self, pipe: Any) -> None:
        ids, self._ack_queue = self._ack_queue, []
        pipe.xack(self.inbox, self.robot, *ids)

    def flush_acks(self) -> None:
        """Send acknowledgements still queued (they normally ride on the next round trip)."""
        if self._ack_queue:
            ids, self._ack_queue = self._ack_queue, []
            self.redis.xack(self.inbox, self.robot, *ids)

    def _replay_own(self) -> int:
        """On start: entries this consumer name still has pending from an earlier life."""
        done, cursor = 0, "0-0"
        for _ in range(10_000):
            res = self.redis.xreadgroup(self.robot, self.consumer, {self.inbox: cursor}, count=self.batch_size)
            entries = res[0][1] if res else []
            if not entries:
                break
            counts = self._delivery_counts([_s(i) for i, _ in entries])
            for entry_id, fields in entries:
                entry = _s(entry_id)
                if entry not in self._held:
                    done += self._intake(entry, fields, counts.get(entry, 2), None)
            cursor = _s(entries[-1][0])
            if len(entries) < self.batch_size:
                break
        if self._held:
            log.info("bus.replayed_own_pending", robot=self.robot, consumer=self.consumer, count=len(self._held))
        return done

    def _claim_stale(self) -> int:
        """XAUTOCLAIM entries idle past the visibility timeout (their consumer is gone or
        stuck), then delete consumers left with nothing pending."""
        self._last_claim = time.monotonic()
        done, cursor = 0, "0-0"
        for _ in range(10):
            res = self.redis.xautoclaim(
                self.inbox, self.robot, self.consumer, min_idle_time=self._vis_ms, start_id=cursor,
                count=self.batch_size,
            )
            next_id, entries = res[0], res[1]
            deleted = res[2] if len(res) > 2 else []
            if deleted:
                log.warning("bus.reclaimed_deleted_entries", robot=self.robot, ids=[_s(i) for i in deleted])
            if entries:
                counts = self._delivery_counts([_s(i) for i, _ in entries])
                for entry_id, fields in entries:
                    entry = _s(entry_id)
                    held = self._held.get(entry)
                    if held is not None:  # our own, idle too long: just note the new count
                        held.deliveries = counts.get(entry, held.deliveries + 1)
                        continue
                    self.counts["reclaimed"] += 1
                    done += self._intake(entry, fields or {}, counts.get(entry, 2), None)
                log.info("bus.reclaimed", robot=self.robot, consumer=self.consumer, count=len(entries))
            if _s(next_id) == "0-0":
                break
            cursor = _s(next_id)
        self._reap_consumers()
        return done

    def _reap_consumers(self) -> None:
        try:
            consumers = self.redis.xinfo_consumers(self.inbox, self.robot)
        except _redis.ResponseError:
            return
        for c in consumers:
            name = _s(c.get("name"))
            if name == self.consumer or int(c.get("pending", 0)) or int(c.get("idle", 0)) < self._vis_ms:
                continue
            if self.bus._reap(keys=[self.inbox], args=[self.robot, name]) == 1:
                log.info("bus.consumer_deleted", robot=self.robot, consumer=name)

    def _delivery_counts(self, ids: list[str]) -> dict[str, int]:
        if not ids:
            return {}
        rows = self.redis.xpending_range(
            self.inbox, self.robot, min=ids[0], max=ids[-1], count=len(ids) + len(self._held) + 16,
            consumername=self.consumer,
        )
        return {_s(r["message_id"]): int(r["times_delivered"]) for r in rows}

    def _intake(
        self, entry: str, fields: Mapping[bytes, bytes], deliveries: int, cid: str | None, *, from_script: bool = False
    ) -> int:
        """Turn an entry into a held Delivery; dead-letter it now if it is not a valid
        envelope. Returns 1 when it was resolved here."""
        if not fields:  # trimmed/deleted while pending: nothing left to handle
            self.redis.xack(self.inbox, self.robot, entry)
            log.warning("bus.entry_vanished", robot=self.robot, entry=entry)
            return 1
        raw = fields.get(b"envelope")
        message: RobotMessage | None = None
        error: SchemaError | str | None = None
        if raw is None:
            names = sorted(_s(k) for k in fields)
            error = f"entry has no 'envelope' field (fields: {', '.join(names)})"
        else:
            try:
                message = decode_message(raw)
            except SchemaError as exc:
                error = exc
            else:
                if not _has_id(raw):
                    # a hand-written envelope without "id": derive a stable one from the
                    # entry, so redeliveries stay idempotent and replies can name it
                    message = msgspec.structs.replace(message, id=f"{self.robot}/{entry}")
        if not from_script:
            cid = message.conversation_id if message else _lenient_conversation(raw)
        d = Delivery(self, entry, fields, deliveries, message, error, cid or None)
        self._held[entry] = d
        if message is None:
            self._dead_letter(d, "invalid", error or "invalid envelope")
            return 1
        if message.to != self.robot:
            log.warning("bus.misaddressed", robot=self.robot, to=message.to, message_id=message.id)
        return 0

    # --- handling ---------------------------------------------------------------------
    def _process_ready(self, limit: int | None) -> int:
        if limit == 0:
            return 0
        done = 0
        now = time.monotonic()
        blocked: set[str] = set()
        for d in list(self._held.values()):
            if limit is not None and done >= limit:
                break
            if d.state != PENDING or d.entry_id not in self._held:
                continue
            conv = d.conversation
            if conv is not None and conv in blocked:
                continue
            if d.retry_at > now:
                if conv is not None:
                    blocked.add(conv)
                continue
            if conv is not None and not self.bus._acquire(keys=[self.inbox], args=[self.robot, conv, d.entry_id]):
                blocked.add(conv)
                continue
            if d.needs_claim and not self._redeliver(d):
                continue
            self._handle(d)
            done += 1
        return done

    def _redeliver(self, d: Delivery) -> bool:
        """Claim a nacked entry back to ourselves (a counted delivery) before retrying."""
        claimed = self.redis.xclaim(self.inbox, self.robot, self.consumer, 0, [d.entry_id])
        if not claimed:
            self._held.pop(d.entry_id, None)
            log.info("bus.retry_gone", robot=self.robot, entry=d.entry_id)
            return False
        d.deliveries += 1
        d.needs_claim = False
        self.counts["retried"] += 1
        return True

    def _handle(self, d: Delivery) -> None:
        msg = d.message
        assert msg is not None
        with log_context(robot=self.robot, message_id=msg.id, conversation_id=msg.conversation_id), \
                continue_trace(msg.headers.get("traceparent")):
            if d.deliveries > self.max_deliveries:
                last = f"; last error: {d.last_error}" if d.last_error else ""
                self._dead_letter(
                    d, "max_deliveries",
                    f"delivered {d.deliveries} times (max_deliveries={self.max_deliveries}) without an ack{last}",
                )
                return
            if msg.expired():
                assert msg.deadline is not None
                self._dead_letter(d, "expired", f"deadline {msg.deadline.isoformat()} passed before handling")
                return
            if msg.in_reply_to:
                self.bus.correlate_reply(self.robot, msg)
            self._current = d
            try:
                self._handler(d)
            except Exception as exc:  # noqa: BLE001 - any handler failure is a nack, never a crash
                if d.pending:
                    self._fail(d, exc)
                else:
                    log.warning("bus.handler_raised_after_resolving", entry=d.entry_id, error=repr(exc))
                return
            finally:
                self._current = None
            if d.pending:
                if self._auto_ack:
                    self._ack(d)
                else:
                    log.warning("bus.handler_left_unresolved", entry=d.entry_id)
                    self._nack(d, "handler returned without ack or nack", requeue=True, delay=None)

    def _fail(self, d: Delivery, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        log.warning("bus.handler_failed", entry=d.entry_id, deliveries=d.deliveries, error=error)
        self._nack(d, error, requeue=True, delay=None)

    # --- resolutions (called through Delivery) -----------------------------------------
    def _ack(self, d: Delivery) -> None:
        # After the handler succeeded. A conversation entry is released at once (the next
        # entry of its conversation may be waiting on another consumer); other acks are
        # queued and sent with the next round trip (READ or the blocking wait), which saves
        # one round trip per message. A crash before that round trip redelivers the entry,
        # exactly like a crash between handler and XACK would.
        if d.conversation:
            self.bus._complete(keys=[self.inbox], args=[self.robot, d.entry_id, d.conversation])
        else:
            self._ack_queue.append(d.entry_id)
        d.state = ACKED
        self._held.pop(d.entry_id, None)
        self.counts["acked"] += 1

    def _nack(self, d: Delivery, error: BaseException | str | None, *, requeue: bool, delay: float | None) -> None:
        text = _error_text(error) or "nacked"
        if not requeue:
            self._dead_letter(d, "rejected", text)
            return
        if d.deliveries >= self.max_deliveries:
            self._dead_letter(d, "failed", text)
            return
        d.state = NACKED
        retry = Delivery(self, d.entry_id, d.fields, d.deliveries, d.message, None, d.conversation)
        retry.last_error = text
        retry.needs_claim = True
        backoff = self.retry_delay * (2 ** max(0, d.deliveries - 1))
        retry.retry_at = time.monotonic() + (min(backoff, 30.0) if delay is None else delay)
        self._held[d.entry_id] = retry  # same position: order within a conversation is kept

    def _dead_letter(self, d: Delivery, reason: str, error: BaseException | str) -> None:
        raw = d.fields.get(b"envelope")
        if raw is None:
            raw = json.dumps({_s(k): _s(v) for k, v in d.fields.items()})
        text = _error_text(error)
        fields: list[Any] = [
            "envelope", raw, "reason", reason, "error", text, "deliveries", d.deliveries,
            "entry_id", d.entry_id, "robot", self.robot, "consumer", self.consumer,
            "message_id", d.message.id if d.message else "", "failed_at", utcnow().isoformat(),
        ]
        self.bus._dead(
            keys=[self.inbox, self.dlq],
            args=[self.robot, d.entry_id, d.conversation or "", int(self.bus.settings.dlq_maxlen), *fields],
        )
        d.state = DEAD
        self._held.pop(d.entry_id, None)
        self.counts["dead"] += 1
        log.warning("bus.dead_lettered", robot=self.robot, entry=d.entry_id, reason=reason, error=text,
                    deliveries=d.deliveries)
        self._report_failure(d, reason, text)

    def _report_failure(self, d: Delivery, reason: str, text: str) -> None:
        """A message that asked for a reply (``reply_to``) and was dead-lettered gets an
        ``error`` envelope there, so a requester or delegator fails at once instead of
        waiting out its timeout."""
        msg = d.message
        if msg is None or msg.is_reply or not msg.reply_to:
            return
        try:
            error = self.bus.build_reply(msg, f"Error: {reason}: {text}", from_=self.robot,
                                         headers={"error": reason})
            self.bus.deliver_reply(msgspec.structs.replace(error, kind="error"))
        except Exception as exc:  # the dead letter is recorded; the notice is best effort
            log.warning("bus.error_reply_failed", robot=self.robot, entry=d.entry_id, error=str(exc))

    # --- keeping what we hold ----------------------------------------------------------
    def _heartbeat(self) -> None:
        """Reset the idle time of every entry we hold so nobody reclaims live work."""
        self._last_beat = time.monotonic()
        ids = list(self._held)
        if not ids:
            return
        lost = self.bus._heartbeat(keys=[self.inbox], args=[self.robot, self.consumer, *ids])
        for entry in lost or []:
            self._lost.add(_s(entry))

    def _drop_lost(self) -> None:
        while self._lost:
            entry = self._lost.pop()
            d = self._held.get(entry)
            if d is not None and d is not self._current:
                self._held.pop(entry, None)
                log.warning("bus.entry_lost", robot=self.robot, entry=entry)

    def hand_back(self) -> int:
        """Give up entries we hold but have not started: they look idle past the visibility
        timeout (and this delivery is not counted) so another consumer reclaims them on its
        next claim round. Returns how many were handed back."""
        self.flush_acks()
        pairs: list[Any] = []
        for d in list(self._held.values()):
            if d is self._current:
                continue
            pairs += [d.entry_id, max(0, d.deliveries - (0 if d.needs_claim else 1))]
        self._held.clear()
        if not pairs:
            return 0
        n = int(self.bus._hand_back(keys=[self.inbox], args=[self.robot, self.consumer, self._vis_ms + 1000, *pairs]))
        log.info("bus.handed_back", robot=self.robot, consumer=self.consumer, count=n)
        return n

    @property
    def held(self) -> int:
        """Entries this consumer holds and has not resolved (waiting, retrying or running)."""
        return len(self._held)

    def __repr__(self) -> str:
        return f"<BusPoller robot={self.robot!r} consumer={self.consumer!r} held={len(self._held)}>"


def _error_text(error: BaseException | str | None) -> str:
    if error is None:
        return ""
    if isinstance(error, BaseException):
        return str(error) if isinstance(error, SchemaError) else f"{type(error).__name__}: {error}"
    return str(error)


class _IdProbe(msgspec.Struct):
    id: Any = None


def _has_id(raw: bytes) -> bool:
    if b'"id"' not in raw:
        return False
    try:
        return msgspec.json.decode(raw, type=_IdProbe).id is not None
    except (msgspec.ValidationError, msgspec.DecodeError):
        return True


def _lenient_conversation(raw: bytes | None) -> str | None:
    """Best-effort conversation id of an entry that failed validation (to release it)."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    cid = doc.get("conversation_id") if isinstance(doc, dict) else None
    return cid if isinstance(cid, str) and cid else None
