"""Running held deliveries and resolving them (the handling half of BusPoller).

Entries of one conversation run one at a time and in stream order across every consumer of
the group: an entry may run only while it is the head of its conversation (ACQUIRE);
later ones wait, still pending and heart-beaten. A handler's success acks the entry
(COMPLETE releases the conversation), a failure nacks it for a retry with backoff, and an
entry past ``max_deliveries``, past its deadline or rejected goes to the DLQ, with an
``error`` envelope to its ``reply_to``.

In flight (``in_flight > 1``): ready entries start on a thread pool of that many threads,
so entries of *different* conversations (and free entries) run at once. A conversation with
an entry running here is skipped locally -- ACQUIRE would grant its running head to us a
second time -- so one conversation still runs one entry at a time across every consumer.
Handler threads resolve their own entries (ack, nack, dead letter) under ``_lock``; a Redis
error in a handler thread is handed to the polling thread, which raises it from ``poll()``
so the loop rides out the outage as it does inline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import redis as _redis

from robot_lab import coalesce
from robot_lab.errors import SchemaError
from robot_lab.logging import get_logger, log_context
from robot_lab.outage import is_outage, outage_cause
from robot_lab.threads import PoolShare
from robot_lab.observability import metrics
from robot_lab.tracing import continue_trace
from robot_lab.schemas import RobotMessage, encode_message, utcnow
from robot_lab.bus.checks import text as check_text
from robot_lab.bus.delivery import ACKED, DEAD, NACKED, PENDING, Delivery
from robot_lab.bus.replies import refusal, reply_allowed
from robot_lab.bus.state import PollerState

log = get_logger("robot_lab.bus.poller")


class Handling(PollerState):
    """Run ready deliveries in conversation order; ack, nack, dead-letter."""

    # --- handling ---------------------------------------------------------------------
    def _process_ready(self, limit: int | None) -> int:
        # Held entries are in stream order (Intake keeps them so), so the first entry of a
        # conversation met here is the oldest one this consumer holds: if the consumer holds
        # the conversation's head, that is the one ACQUIRE is asked about. Once one entry of
        # a conversation is refused, the rest of that conversation waits for the next round.
        if limit == 0:
            return 0
        if self._pool_mode:
            self._start_ready()
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
            if conv is not None and not self.bus._acquire(
                keys=self.conv_keys, args=[self.robot, conv, d.entry_id, self.consumer]
            ):
                blocked.add(conv)
                continue
            if d.needs_claim and not self._redeliver(d):
                continue
            self._running[d.entry_id] = d
            try:
                self._handle(d)
            finally:
                self._running.pop(d.entry_id, None)
            done += 1
        return done

    # --- in flight (in_flight > 1) -----------------------------------------------------
    def _start_ready(self) -> None:
        """Start what may run now on free slots: the oldest held entry of each conversation
        with nothing running here (if ACQUIRE grants it) and free entries. The ACQUIREs of
        one round go in one pipeline (they concern different conversations, so their order
        does not matter). Entries that could start but for a free slot are counted in
        ``_waiting_ready`` (reads are capped by the free slots left)."""
        now = time.monotonic()
        free = self.in_flight - len(self._running)
        with self._lock:
            held = list(self._held.values())
        blocked: set[str] = set()
        candidates: list[Delivery] = []
        waiting = 0
        for d in held:
            if d.state != PENDING:
                continue
            conv = d.conversation
            if conv is not None:
                if conv in blocked:
                    continue
                blocked.add(conv)  # only its oldest entry held here may be its head
            if d.entry_id in self._running or d.retry_at > now:
                continue
            if len(candidates) >= free:
                waiting += 1
                continue
            candidates.append(d)
        self._waiting_ready = waiting
        asked = [d for d in candidates if d.conversation is not None]
        refused: set[str] = set()
        if asked and self._cluster:  # redis-py's cluster pipeline refuses scripts
            refused = {d.entry_id for d in asked if not self.bus._acquire(
                keys=self.conv_keys, args=[self.robot, d.conversation, d.entry_id, self.consumer])}
        elif asked:
            pipe = self.redis.pipeline(transaction=False)
            for d in asked:
                self.bus._acquire(keys=self.conv_keys, args=[self.robot, d.conversation, d.entry_id, self.consumer],
                                  client=pipe)
            refused = {d.entry_id for d, granted in zip(asked, pipe.execute()) if not granted}
        for d in candidates:
            if d.entry_id in refused or (d.needs_claim and not self._redeliver(d)):
                continue
            with self._lock:
                self._running[d.entry_id] = d
                self._run_since[d.entry_id] = time.monotonic()
            self._start(d)

    @property
    def _pool_mode(self) -> bool:
        return self.in_flight > 1

    def _start(self, d: Delivery) -> None:
        """Run ``d``'s handler on a pool thread (created on first use)."""
        if self._pool is None:  # normally made when the poller starts (run_forever)
            self._pool = PoolShare(self.in_flight, f"bus-{self.robot}")
        self._pool.submit(self._handle_in_thread, d)

    def _handle_in_thread(self, d: Delivery) -> None:
        try:
            self._handle(d)
        except _redis.RedisError as exc:  # the entry stays held and pending: it runs again
            with self._lock:
                self._handler_errors.append(exc)
        except BaseException as exc:  # noqa: BLE001 - a pool thread must never die silently
            log.error("bus.handler_thread_failed", robot=self.robot, entry=d.entry_id, error=repr(exc)[:500])
        finally:
            with self._lock:
                self._running.pop(d.entry_id, None)
                self._run_since.pop(d.entry_id, None)
                self._finished += 1
            self._wake.set()

    def _collect_finished(self) -> int:
        """Entries the pool finished since the last call; raises a handler thread's Redis
        error here, in the polling thread (the loop rides out outages)."""
        with self._lock:
            done, self._finished = self._finished, 0
            errors, self._handler_errors = self._handler_errors, []
        if errors:
            raise errors[0]
        return done

    def longest_running(self) -> float:
        """Seconds the oldest handler running on the pool has been running (0: none); the
        worker's health check names a handler stuck past its limit."""
        with self._lock:
            oldest = min(self._run_since.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    def free_slots(self) -> int:
        """How many more entries this consumer could start now (reads are capped by it)."""
        return max(0, self.in_flight - len(self._running) - self._waiting_ready)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no handler runs (a graceful stop: everything in hand finishes, nothing
        new starts). Returns False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._running:
            self._wake.clear()
            if not self._running:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._wake.wait(0.2 if left is None else min(0.2, left))
        with self._lock:
            self._finished = 0
            self._handler_errors = []
        return True

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
        """Run one ready delivery. Handler failures are nacks (retried, dead-lettered after
        ``max_deliveries``); anything else that fails on this entry -- its trace header, its
        deadline, correlating it -- dead-letters it at once: a consumer never dies of its
        input. Redis errors propagate (the entry stays pending; the loop rides them out)."""
        msg = d.message
        assert msg is not None
        try:
            with log_context(robot=self.robot, message_id=msg.id, conversation_id=msg.conversation_id), \
                    continue_trace(msg.headers.get("traceparent"), "bus.handle", robot=self.robot,
                                   message_id=msg.id), \
                    metrics.handling(self.robot, d):
                self._run(d, msg)
        except _redis.RedisError:
            raise
        except Exception as exc:  # noqa: BLE001
            if is_outage(exc):
                raise
            if not d.pending:
                log.warning("bus.failed_after_resolving", entry=d.entry_id, error=repr(exc)[:500])
                return
            self._dead_letter(d, "invalid", f"cannot handle the entry: {type(exc).__name__}: {exc}")

    def _run(self, d: Delivery, msg: RobotMessage) -> None:
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
        if not msg.is_reply and not reply_allowed(msg, self.bus.settings.reply_to_allowed):
            self._dead_letter(d, "reply_refused", refusal(msg))  # no handler, no model call
            return
        if msg.in_reply_to:
            self.bus.correlate_reply(self.robot, msg)
        try:
            self._handler(d)
        except Exception as exc:  # noqa: BLE001 - any handler failure is a nack, never a crash
            outage = outage_cause(exc)
            if outage is not None and d.pending:  # Redis away or out of memory (its reply, its
                raise outage  # history): not the message's fault -- it stays pending, runs again
            if d.pending:
                self._fail(d, exc)
            else:
                log.warning("bus.handler_raised_after_resolving", entry=d.entry_id, error=repr(exc)[:500])
            return
        if d.pending:
            if self._auto_ack:
                self._ack(d)
            else:
                log.warning("bus.handler_left_unresolved", entry=d.entry_id)
                self._nack(d, "handler returned without ack or nack", requeue=True, delay=None)

    def _fail(self, d: Delivery, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        # An error that says another attempt cannot help (a model call whose retries are
        # spent, a budget overrun) is dead-lettered now: a redelivery would repeat the calls.
        final = getattr(exc, "retryable", None) is False
        log.warning("bus.handler_failed", entry=d.entry_id, deliveries=d.deliveries, error=error, retried=not final)
        if final:
            self._dead_letter(d, "failed", error)
            return
        self._nack(d, error, requeue=True, delay=None)

    # --- resolutions (called through Delivery) -----------------------------------------
    def _ack(self, d: Delivery) -> None:
        # After the handler succeeded. A conversation entry is released at once (the next
        # entry of its conversation may be waiting on another consumer); other acks are
        # queued and sent with the next round trip (READ or the blocking wait), which saves
        # one round trip per message. A crash before that round trip redelivers the entry,
        # exactly like a crash between handler and XACK would. A handler thread (in flight)
        # acks at once: the polling thread may be blocked in a wait for new entries.
        if d.conversation:  # (in flight, with other handlers' round trips: robot_lab.coalesce)
            coalesce.script(self.bus._complete, self.conv_keys, [self.robot, d.entry_id, d.conversation])
        elif self._pool_mode:
            coalesce.call(self.redis, "xack", self.inbox, self.robot, d.entry_id)
        else:
            with self._lock:
                self._ack_queue.append(d.entry_id)
        with self._lock:
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
        retry = Delivery(self, d.entry_id, d.fields, d.deliveries, d.message, None, d.conversation)
        retry.last_error = text
        retry.needs_claim = True
        backoff = self.retry_delay * (2 ** max(0, d.deliveries - 1))
        retry.retry_at = time.monotonic() + (min(backoff, 30.0) if delay is None else delay)
        with self._lock:
            d.state = NACKED
            if d.entry_id in self._held:
                self._held[d.entry_id] = retry  # same position: order within a conversation is kept

    def _send_reply(self, d: Delivery, reply: RobotMessage) -> None:
        """Send a reply; one that cannot be routed dead-letters the message with it."""
        if self.bus.deliver_reply(reply) is None:
            self._dead_letter(d, "unroutable_reply",
                              f"the reply cannot be delivered: {reply.to!r} is not a valid inbox name",
                              extra={"reply": encode_message(reply)})

    def _dead_letter(
        self, d: Delivery, reason: str, error: BaseException | str, *,
        notify: RobotMessage | None = None, extra: Mapping[str, str | bytes] | None = None,
        report: bool = True,
    ) -> None:
        """Record the entry in the DLQ and ack it (one script: never acked-and-lost), then
        send an error envelope to its ``reply_to`` (``notify``: whom, when the entry could
        not be decoded; ``report=False``: to nobody). Never raises but Redis errors: a record
        that cannot be built or written whole is written with the entry's ids and the reason
        only."""
        text = _error_text(error)
        metrics.dead_lettered(self.robot, reason)
        notify = notify or d.message
        extra = {"message_id": notify.id if notify else "", **(extra or {})}
        try:
            fields = self._letter_fields(d, reason, text, extra)
        except Exception as exc:  # noqa: BLE001
            fields = self._letter_fields(d, reason, f"{text} (and the record failed: {type(exc).__name__})", extra,
                                         minimal=True)
        args = [self.robot, d.entry_id, d.conversation or "", int(self.bus.settings.dlq_maxlen)]
        try:
            self.bus._dead(keys=[*self.conv_keys, self.dlq], args=[*args, *fields])
        except _redis.ResponseError as exc:  # the record itself was refused (too big, OOM)
            minimal = self._letter_fields(d, reason, f"{text} (full record refused: {exc})", extra, minimal=True)
            self.bus._dead(keys=[*self.conv_keys, self.dlq], args=[*args, *minimal])
        with self._lock:
            d.state = DEAD
            self._held.pop(d.entry_id, None)
            self.counts["dead"] += 1
        log.warning("bus.dead_lettered", robot=self.robot, entry=d.entry_id, reason=reason, error=text,
                    deliveries=d.deliveries)
        if report:
            self._report_failure(d, reason, text, notify)

    def _letter_fields(self, d: Delivery, reason: str, text: str, extra: Mapping[str, str | bytes], *,
                       minimal: bool = False) -> list[Any]:
        fields: list[Any] = [
            "reason", reason, "error", text, "deliveries", d.deliveries, "entry_id", d.entry_id,
            "robot", self.robot, "consumer", self.consumer, "failed_at", utcnow().isoformat(),
            "message_id", check_text(extra.get("message_id", ""), 300),
        ]
        if minimal:
            return ["envelope", "", *fields]
        raw = d.fields.get(b"envelope")
        if raw is None:  # keep what the entry had, bounded, as JSON text
            raw = json.dumps({check_text(k, 200): check_text(v, 10_000) for k, v in d.fields.items()})
        limit = max(1024, int(self.bus.settings.max_envelope_bytes))
        if len(raw) > limit:  # a too_large envelope is not stored twice
            fields += ["envelope_bytes", len(raw), "envelope_truncated", 1]
            raw = raw[:limit]
        for key, value in extra.items():
            if key != "message_id":
                fields += [key, value]
        return ["envelope", raw, *fields]

    def _report_failure(self, d: Delivery, reason: str, text: str, msg: RobotMessage | None) -> None:
        """A message that asked for a reply (``reply_to``) and was dead-lettered gets an
        ``error`` envelope there, so a requester or delegator fails at once instead of
        waiting out its timeout."""
        if msg is None or msg.is_reply or not msg.reply_to:
            return
        if not reply_allowed(msg, self.bus.settings.reply_to_allowed):
            return  # a forged reply_to gets no error envelope either
        try:
            error = self.bus.build_reply(msg, f"Error: {reason}: {text}", from_=self.robot,
                                         headers={"error": reason})
            if self.bus.deliver_reply(msgspec.structs.replace(error, kind="error")) is None:
                log.warning("bus.error_reply_unroutable", robot=self.robot, entry=d.entry_id, to=msg.reply_to)
        except Exception as exc:  # noqa: BLE001 - the dead letter is recorded; the notice is best effort
            log.warning("bus.error_reply_failed", robot=self.robot, entry=d.entry_id, error=str(exc)[:500])


def _error_text(error: BaseException | str | None) -> str:
    if error is None:
        return ""
    if isinstance(error, BaseException):
        error = str(error) if isinstance(error, SchemaError) else f"{type(error).__name__}: {error}"
    return check_text(error, 2_000)
