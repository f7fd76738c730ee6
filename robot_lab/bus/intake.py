"""Reading a robot's inbox into held deliveries (the intake half of BusPoller).

New entries come through the READ script: ``XREADGROUP`` plus, in the same atomic step,
appending each entry that names a ``conversation_id`` to that conversation's ordering list,
so every list is in stream order however many consumers read. On start a consumer replays
what its name still has pending. Each entry becomes a :class:`~robot_lab.bus.delivery.Delivery`
held by the consumer; one that is not a valid envelope is dead-lettered at once. Acks of
free entries are batched here and ride on the next round trip.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Set
from typing import Any

import redis as _redis

from robot_lab.errors import BusError
from robot_lab.logging import get_logger
from robot_lab.schemas import RobotMessage
from robot_lab.bus.checks import Verdict, check_entry
from robot_lab.text.strings import as_str as _s
from robot_lab.bus.delivery import Delivery
from robot_lab.bus.state import PollerState

log = get_logger("robot_lab.bus.poller")


class Intake(PollerState):
    """Read, replay and validate entries; batch acknowledgements."""

    # --- reading ----------------------------------------------------------------------
    def _read(self) -> int:
        """READ a batch (non-blocking); returns how many were dead-lettered at intake.
        Sets ``_drained`` when the inbox had fewer new entries than asked for. In flight,
        a consumer reads no more than it has free slots for (others may take the rest)."""
        count = min(self.batch_size, self.max_held - len(self._held))
        if self.in_flight > 1:
            count = min(self.max_held - len(self._held), self.free_slots())
        if count <= 0:
            return 0
        self._drained = False
        try:
            if self._ack_queue and self._cluster:  # redis-py's cluster pipeline refuses scripts
                self.flush_acks()
            if self._ack_queue:  # acks of the last batch ride along: one round trip
                pipe = self.redis.pipeline(transaction=False)
                self._queue_acks_on(pipe)
                self.bus._read(keys=self.conv_keys, args=[self.robot, self.consumer, count], client=pipe)
                entries, last = pipe.execute()[-1]
            else:
                entries, last = self.bus._read(keys=self.conv_keys, args=[self.robot, self.consumer, count])
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
            dead += self._intake(entry, fields, 1, _conversation(cid), from_script=True)
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
        with self._lock:
            ids, self._ack_queue = self._ack_queue, []
        if ids:
            pipe.xack(self.inbox, self.robot, *ids)

    def flush_acks(self) -> None:
        """Send acknowledgements still queued (they normally ride on the next round trip)."""
        if self._ack_queue:
            with self._lock:
                ids, self._ack_queue = self._ack_queue, []
            if ids:
                self.redis.xack(self.inbox, self.robot, *ids)

    def _replay_own(self) -> int:
        """On start: entries this consumer name still has pending from an earlier life."""
        done, _ = self._read_own_pending(frozenset())  # (what it holds is skipped anyway)
        if self._held:
            log.info("bus.replayed_own_pending", robot=self.robot, consumer=self.consumer, count=len(self._held))
        return done

    def _replay_orphans(self) -> int:
        """After a round that failed on a key of the wrong type: the READ script delivers
        entries (XREADGROUP) before it queues their conversations, so a failure there leaves
        entries pending on this consumer that this poller never saw -- they would wait for the
        stale-entry claim (``claim_interval``, tens of seconds) after the key is fixed. Read
        them back now. Nothing is taken twice: acks queued here go out first, and an entry
        leaves ``_held`` only after its ack (or dead letter) is on the server, so an entry
        pending at the read and not held at the snapshot before it was never seen here."""
        self.flush_acks()
        with self._lock:
            held = set(self._held)
        try:
            done, taken = self._read_own_pending(held)
        except _redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return 0  # the inbox was deleted (the fix of an inbox of the wrong type): _read recreates the group
        if taken:
            log.info("bus.orphans_replayed", robot=self.robot, consumer=self.consumer, count=taken)
        return done

    def _read_own_pending(self, held: Set[str]) -> tuple[int, int]:
        """This consumer's pending entries not in ``held``, taken into hand; returns (resolved
        at intake, taken)."""
        done, taken, cursor = 0, 0, "0-0"
        for _ in range(10_000):
            res = self.redis.xreadgroup(self.robot, self.consumer, {self.inbox: cursor}, count=self.batch_size)
            entries = res[0][1] if res else []
            if not entries:
                break
            counts = self._delivery_counts([_s(i) for i, _ in entries])
            for entry_id, fields in entries:
                entry = _s(entry_id)
                if entry not in held and entry not in self._held:
                    done += self._intake(entry, fields, counts.get(entry, 2), None)
                    taken += 1
            cursor = _s(entries[-1][0])
            if len(entries) < self.batch_size:
                break
        return done, taken


    def _delivery_counts(self, ids: list[str]) -> dict[str, int]:
        if not ids:
            return {}
        rows = self.redis.xpending_range(
            self.inbox, self.robot, min=ids[0], max=ids[-1], count=len(ids) + len(self._held) + 16,
            consumername=self.consumer,
        )
        return {_s(r["message_id"]): int(r["times_delivered"]) for r in rows}

    def _hold(self, d: Delivery) -> None:
        """Hold ``d``, keeping held entries in stream order. Reads come in order, but an
        entry reclaimed from a dead consumer is older than entries read before it; were it
        queued behind them, the conversation it heads would wait forever on itself (issue
        20: the handling loop stops at the first entry of a conversation that may not run)."""
        with self._lock:
            newest = next(reversed(self._held), None)
            self._held[d.entry_id] = d
            if newest is not None and stream_id_key(newest) > stream_id_key(d.entry_id):
                self._held = OrderedDict(sorted(self._held.items(), key=lambda kv: stream_id_key(kv[0])))

    def _intake(
        self, entry: str, fields: Mapping[bytes, bytes], deliveries: int, cid: str | bytes | None, *,
        from_script: bool = False
    ) -> int:
        """Turn an entry into a held Delivery; dead-letter it now if it cannot be handled
        (:func:`~robot_lab.bus.checks.check_entry`: invalid, too large, unsupported). Returns
        1 when it was resolved here."""
        if not fields:  # trimmed/deleted while pending: nothing left to handle
            self.redis.xack(self.inbox, self.robot, entry)
            log.warning("bus.entry_vanished", robot=self.robot, entry=entry)
            return 1
        verdict = check_entry(self.robot, entry, fields, max_bytes=int(self.bus.settings.max_envelope_bytes))
        message = verdict.message
        if not from_script:
            cid = message.conversation_id if message else verdict.lenient.get("conversation_id")
        d = Delivery(self, entry, fields, deliveries, message if not verdict.reason else None,
                     verdict.error or None, cid or None)
        self._hold(d)
        if verdict.reason:
            # under require only an authentic sender is told (an error envelope is a write
            # into the inbox the entry names: a forger must not aim it)
            report = self.verify != "require" or (
                message is not None and not self.bus.keyring.problem(fields.get(b"envelope", b""), message))
            self._dead_letter(d, verdict.reason, verdict.error, notify=message or self._stand_in(entry, verdict),
                              report=report)
            return 1
        assert message is not None
        if self.verify != "off" and self._unauthenticated(d, message):
            return 1
        if message.to != self.robot:
            return self._misaddressed(d, message)
        return 0

    def _misaddressed(self, d: Delivery, message: RobotMessage) -> int:
        """An envelope for another robot (a signed one copied into this inbox, or a wrong
        XADD): dead-lettered ``misaddressed`` before any handler runs, with no error envelope
        (it was meant for someone else); ``bus.misaddressed = warn`` handles it, except under
        ``require``, where ``to`` is part of what the sender signed."""
        log.warning("bus.misaddressed", robot=self.robot, to=message.to, message_id=message.id, sender=message.from_)
        if self.verify != "require" and self.bus.settings.misaddressed == "warn":
            return 0
        self._dead_letter(d, "misaddressed", f"the envelope is addressed to {message.to!r}, not to {self.robot!r}",
                          report=False)
        return 1

    def _unauthenticated(self, d: Delivery, message: RobotMessage) -> bool:
        """Check the entry's signature (signing.verify / signing.robots); under ``require`` a
        failure is dead-lettered as ``unauthenticated`` -- no handler, no model call, no
        error envelope to a sender who may be forged. Returns True when it was."""
        problem = self.bus.keyring.problem(d.fields.get(b"envelope", b""), message)
        if not problem:
            return False
        if self.verify == "require" and self.parking.is_wake(message):
            log.info("bus.answer_wake", robot=self.robot, entry=d.entry_id, request=message.in_reply_to)
            return False  # the answer is recorded already: this only runs the parked message again
        log.warning("bus.unauthenticated", robot=self.robot, entry=d.entry_id, message_id=message.id,
                    sender=message.from_, error=problem, mode=self.verify)
        if self.verify != "require":
            return False
        self._dead_letter(d, "unauthenticated", problem, report=False)
        return True

    def _stand_in(self, entry: str, verdict: Verdict) -> RobotMessage | None:
        """A refused entry's sender, as far as it can be read: who gets the error envelope."""
        found = verdict.lenient
        if "reply_to" not in found:
            return None
        return RobotMessage(
            to=self.robot, content="", id=found.get("id") or f"{self.robot}/{entry}",
            from_=found.get("from", "anonymous"), reply_to=found["reply_to"],
            conversation_id=found.get("conversation_id"),
        )


def _conversation(cid: bytes | str | None) -> str | bytes | None:
    """The conversation id the READ script queued an entry under. Kept as bytes when it is
    not UTF-8 (the envelope is invalid then): releasing the entry needs those exact bytes."""
    if not cid:
        return None
    if isinstance(cid, bytes):
        try:
            return cid.decode()
        except UnicodeDecodeError:
            return cid
    return cid


def stream_id_key(entry: str) -> tuple[int, int]:
    """Sort key of a stream entry id ``"ms-seq"`` (numeric, not lexical)."""
    ms, _, seq = entry.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (0, 0)
