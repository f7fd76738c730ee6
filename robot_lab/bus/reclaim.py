"""Keeping held entries and taking over those of dead consumers (part of BusPoller).

A consumer heart-beats every entry it holds (resets its idle time), so only entries of dead
or stuck consumers look idle past the visibility timeout. The reclaim sweep takes those over
(``XAUTOCLAIM``) and deletes consumers left with nothing pending. A graceful stop hands back
entries never started so other consumers reclaim them at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import redis as _redis

from robot_lab.logging import get_logger
from robot_lab.text.strings import as_str as _s
from robot_lab.bus.state import PollerState

log = get_logger("robot_lab.bus.poller")


class Reclaim(PollerState):
    """Heartbeat, reclaim sweep, consumer reaping, hand-back."""

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
        self._trim()
        return done

    def _trim(self) -> None:
        """Trim the inbox to about ``maxlen`` entries, never cutting an entry that is not
        yet delivered or still pending (TRIM script): publishers that XADD directly never
        trim, so consumers do it on each sweep."""
        maxlen = int(self.bus.settings.maxlen)
        if maxlen > 0:
            removed = self.bus._trim(keys=[self.inbox], args=[maxlen])
            if removed:
                log.info("bus.trimmed", robot=self.robot, removed=int(removed))

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


    # --- keeping what we hold ----------------------------------------------------------
    def _heartbeat(self) -> None:
        """Reset the idle time of every entry we hold so nobody reclaims live work."""
        self._last_beat = time.monotonic()
        with self._lock:
            ids = list(self._held)
        if not ids:
            return
        lost = self.bus._heartbeat(keys=[self.inbox], args=[self.robot, self.consumer, *ids])
        for entry in lost or []:
            self._lost.add(_s(entry))

    def _drop_lost(self) -> None:
        while self._lost:
            entry = self._lost.pop()
            with self._lock:
                d = self._held.get(entry)
                if d is None or entry in self._running:
                    continue
                self._held.pop(entry, None)
            log.warning("bus.entry_lost", robot=self.robot, entry=entry)

    def hand_back(self) -> int:
        """Give up entries we hold but have not started: they look idle past the visibility
        timeout (and this delivery is not counted) so another consumer reclaims them on its
        next claim round. Returns how many were handed back."""
        self.flush_acks()
        pairs: list[Any] = []
        with self._lock:
            for d in list(self._held.values()):
                if d.entry_id in self._running:
                    continue
                pairs += [d.entry_id, max(0, d.deliveries - (0 if d.needs_claim else 1))]
            self._held = OrderedDict((k, d) for k, d in self._held.items() if k in self._running)
        if not pairs:
            return 0
        n = int(self.bus._hand_back(keys=[self.inbox], args=[self.robot, self.consumer, self._vis_ms + 1000, *pairs]))
        log.info("bus.handed_back", robot=self.robot, consumer=self.consumer, count=n)
        return n
