"""BusPoller: one consumer of one robot's inbox (the Ruby gem's BusPoller, made distributed).

Each worker process runs one BusPoller per robot it serves; all of them are consumers of
the robot's consumer group, so Redis spreads the entries between them. The poller:

* reads in batches and calls the handler once per envelope (:mod:`.intake`);
* acknowledges only after the handler, and any reply, succeeded, and runs the entries of
  one conversation one at a time and in stream order across every consumer of the group
  (:mod:`.handling`);
* on start replays its own pending entries, then periodically reclaims entries idle longer
  than the visibility timeout in dead consumers and deletes consumers left with nothing
  pending (:mod:`.reclaim`);
* dead-letters entries that fail validation (at once), whose deadline passed, or that were
  delivered ``max_deliveries`` times; the worker carries on with the next entry.

This module holds the handler styles and the loop (the settings and the rest of the
state are :class:`~.state.PollerState`'s). Usable embedded
(``poll()`` / ``run_once()`` for deterministic tests, ``start()``/``stop()`` for a
background thread) and as the long-running loop of ``robot-lab worker``
(``run_forever(stop_event)``; a graceful stop lets the handlers in hand finish and hands
back entries it never started).

``in_flight`` (default 1) is how many handlers run at once. With 1 the handler runs in the
polling thread, as in robot_lab. With N > 1 handlers run on N pool threads (see
:mod:`.handling`): the handler must then be safe to call from several threads at once --
``serve()`` makes sure of that for a robot (see there). The handler of ``serve()`` and
``respond_to_tasks()`` -- answer each message once, park a run that asks a person -- is
:mod:`.responder`'s.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import redis as _redis

from robot_lab.logging import get_logger
from robot_lab.observability import metrics
from robot_lab.outage import OutageTracker, is_outage
from robot_lab.threads import PoolShare
from robot_lab.schemas import RobotMessage
from robot_lab.bus.delivery import Delivery
from robot_lab.bus.handling import Handling
from robot_lab.bus.intake import Intake
from robot_lab.bus.key_types import is_wrong_type, wrong_typed_keys
from robot_lab.bus.reclaim import Reclaim
from robot_lab.bus.responder import Responder, ServedRobot, robot_runner

log = get_logger("robot_lab.bus.poller")


def _positional_arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


class BusPoller(Intake, Handling, Reclaim):
    """Consume ``robot``'s inbox as consumer ``consumer`` of the group named ``robot``.
    Its constructor and the attributes it sets are :class:`~.state.PollerState`'s."""

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
        self._handler = Responder(self, fn, auto_reply)  # bus/responder.py
        self._auto_ack = True
        return self

    def serve(self, robot: ServedRobot, *, auto_reply: bool = True, **run_kwargs: Any) -> BusPoller:
        """Run ``robot.run(text, **run_kwargs)`` on each task and reply with ``.reply``
        (a dict content is flattened to ``"k: v"`` lines, as robot_lab does). A robot with
        a ``serve_policy(headers)`` (a Robot) offers what it was built with, narrowed by the
        message's headers; ``run_kwargs`` given here win. See :mod:`robot_lab.bus.responder`."""
        return self.respond_to_tasks(robot_runner(self, robot, run_kwargs), auto_reply=auto_reply)

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
    def registered(self) -> bool:
        """Whether this poller's first round got as far as its consumer group (the robot is
        served from here on); a worker's health probe says "starting" until then."""
        return self._started

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
        if self._pool_mode and self._pool is None:  # a few threads warm now, the rest on demand
            self._pool = PoolShare(self.in_flight, f"bus-{self.robot}")
        log.info("bus.poller_started", robot=self.robot, consumer=self.consumer, verify=self.verify)
        if self.verify == "require" and not self.bus.keyring:
            log.warning("bus.verify_without_keys", robot=self.robot,
                        hint="signing.verify is require but no signing key is configured: every entry will be "
                             "dead-lettered as unauthenticated (set signing.keys or signing.keys_dir)")
        try:
            beater.start()
            while not stop.is_set():
                try:
                    self.poll(block_ms=self.block_ms)
                    backoff = 0.1
                    if self.key_problems:  # a round that did not touch the key proves nothing
                        self._recheck_key_types()
                except (_redis.ConnectionError, _redis.TimeoutError) as exc:
                    log.warning("bus.redis_unavailable", robot=self.robot, error=str(exc), retry_in=backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                except _redis.ResponseError as exc:
                    if not is_wrong_type(exc):
                        raise
                    self._wrong_type(exc)
                    self._orphans_due = True  # a failed READ may have delivered entries unseen
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            self.drain()  # handlers in hand finish (heart-beaten meanwhile); nothing new starts
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
            beat_stop.set()
            beater.join(5)
            try:
                self.hand_back()
            except _redis.RedisError as exc:  # the entries stay pending; XAUTOCLAIM recovers them
                log.warning("bus.hand_back_failed", robot=self.robot, error=str(exc))
            log.info("bus.poller_stopped", robot=self.robot, consumer=self.consumer, **self.counts)

    def _wrong_type(self, exc: BaseException) -> None:
        """A key of this robot holds the wrong type: name it (health, status, metric, one log
        line per change) and keep polling, so serving resumes once it is fixed."""
        try:
            problems = wrong_typed_keys(self.bus.redis, self.bus.keys, self.robot) or [str(exc)]
        except _redis.RedisError:
            problems = [str(exc)]
        if problems != self.key_problems:
            log.error("bus.wrong_type_key", robot=self.robot, problems=problems)
            metrics.wrong_type_key(self.robot)
        self.key_problems = problems

    def _recheck_key_types(self) -> None:
        try:
            self.key_problems = wrong_typed_keys(self.bus.redis, self.bus.keys, self.robot)
        except _redis.RedisError:
            return
        if not self.key_problems:
            log.info("bus.wrong_type_key_fixed", robot=self.robot)
            if self._register:  # the fix of an inbox of the wrong type is to delete it: it comes back, with its group
                try:
                    self.bus.register(self.robot)
                except _redis.RedisError as exc:
                    log.warning("bus.register_failed", robot=self.robot, error=f"{type(exc).__name__}: {exc}")

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        # Never dies: a heartbeat thread that stopped would let every held entry be reclaimed
        # from a live consumer. (Reading the held ids races with the poll thread; a beat that
        # loses the race is simply retried at the next interval.) A Redis outage is one
        # redis.lost / redis.back pair, not a line per beat.
        outage = OutageTracker(f"bus-heartbeat-{self.robot}")
        while not stop.wait(self.heartbeat_interval):
            try:
                self._heartbeat()
                outage.back()
            except Exception as exc:  # noqa: BLE001
                if is_outage(exc):
                    outage.lost(exc)
                else:
                    log.warning("bus.heartbeat_failed", robot=self.robot, error=f"{type(exc).__name__}: {exc}")

    # --- one round --------------------------------------------------------------------
    def run_once(self, block_ms: int = 0) -> int:
        """One round, without blocking by default; returns how many entries were resolved."""
        return self.poll(block_ms=block_ms)

    def poll(self, max_messages: int | None = None, block_ms: int | None = None) -> int:
        """Handle up to ``max_messages`` entries: replay/reclaim when due, run what is ready,
        read a batch (waiting up to ``block_ms`` when there is nothing to do). Returns the
        number of entries resolved (acked or dead-lettered). In flight, handlers started
        here finish on pool threads and are counted by a later round."""
        block = self.block_ms if block_ms is None else block_ms
        self._wake.clear()
        done = self._start_if_needed() + self._collect_finished()
        if self._orphans_due:
            self._orphans_due = False
            done += self._replay_orphans()
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_interval:
            self._heartbeat()
        if now - self._last_claim >= self.claim_interval:
            done += self._claim_stale()
        self._drop_lost()
        done += self._process_ready(self._left(max_messages, done))
        if self._left(max_messages, done) == 0:
            return done
        slots = self.in_flight == 1 or self.free_slots() > 0
        if len(self._held) < self.max_held and slots:
            if self._drained and block > 0 and not self._has_ready():
                # the last read emptied the inbox: wait for news first (one round trip
                # less per message when idle), then read
                if not self._wait_for_entries(self._recheck_ms(block)):
                    return done + self._process_ready(self._left(max_messages, done))
            done += self._read()
            done += self._process_ready(self._left(max_messages, done))
        elif block > 0 and not slots:
            self._wake.wait(self._recheck_ms(block) / 1000)  # every slot taken: until one frees
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

    def _waiting(self) -> list[Delivery]:
        """Held entries not running now."""
        with self._lock:
            return [d for k, d in self._held.items() if k not in self._running]

    def _has_ready(self) -> bool:
        now = time.monotonic()
        return any(d.retry_at <= now and d.conversation is None for d in self._waiting())

    def _recheck_ms(self, block: int) -> int:
        """How long to wait for new entries: ``block``, or less when held entries wait for a
        retry time or for a conversation (another consumer's, or a handler running here)."""
        waiting = self._waiting()
        if not waiting:
            return block
        now = time.monotonic()
        retry = min((d.retry_at for d in waiting), default=now)
        if retry > now:
            return max(1, min(block, int((retry - now) * 1000)))
        return min(block, 20)

    @property
    def held(self) -> int:
        """Entries this consumer holds and has not resolved (waiting, retrying or running)."""
        return len(self._held)

    def __repr__(self) -> str:
        return f"<BusPoller robot={self.robot!r} consumer={self.consumer!r} held={len(self._held)}>"
