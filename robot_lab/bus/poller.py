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

This module holds the settings, the handler styles and the loop. Usable embedded
(``poll()`` / ``run_once()`` for deterministic tests, ``start()``/``stop()`` for a
background thread) and as the long-running loop of ``robot-lab worker``
(``run_forever(stop_event)``; a graceful stop lets the handlers in hand finish and hands
back entries it never started).

``in_flight`` (default 1) is how many handlers run at once. With 1 the handler runs in the
polling thread, as in robot_lab. With N > 1 handlers run on N pool threads (see
:mod:`.handling`): the handler must then be safe to call from several threads at once --
``serve()`` makes sure of that for a robot (see there).
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import redis as _redis

from robot_lab import coalesce
from robot_lab.connection import is_cluster_client
from robot_lab.errors import BusError, InputRequired
from robot_lab.inputs import InvalidAnswer
from robot_lab.logging import get_logger
from robot_lab.observability import metrics
from robot_lab.outage import OutageTracker, is_outage
from robot_lab.threads import PoolShare
from robot_lab.schemas import RobotMessage, decode_message, encode_message
from robot_lab.bus.stalls import sweep_interval
from robot_lab.bus.core import Bus
from robot_lab.bus.names import check_robot_name
from robot_lab.bus.delivery import Delivery
from robot_lab.bus.reply_files import reply_attachments
from robot_lab.bus.parking import Parking, waiting_request
from robot_lab.bus.handling import Handling
from robot_lab.bus.intake import Intake
from robot_lab.bus.key_types import is_wrong_type, wrong_typed_keys
from robot_lab.bus.reclaim import Reclaim
from robot_lab.bus.replies import fingerprint, make_record, read_record, record_key_part
from robot_lab.bus.keyring import VERIFY_MODES, verify_mode

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.bus.poller")

Handler = Callable[[Delivery], Any]
_UNREAD: Any = object()  # a read not made (yet)


def flatten_content(content: str | Mapping[str, Any]) -> str:
    """The Ruby gem's ``serve`` input: a Hash content becomes ``"k: v"`` lines."""
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


class ServedRobot(Protocol):
    """What :meth:`BusPoller.serve` runs: ``run(text, **kwargs)`` returning a result with a
    ``.reply`` (or the reply itself). It also uses, when present, ``serve_policy(headers)``
    (the run arguments a message may narrow: a Robot's) and ``concurrent_runs`` (safe in
    several threads at once: a worker's RobotPool, which has both)."""

    def run(self, *args: Any, **kwargs: Any) -> Any: ...


class BusPoller(Intake, Handling, Reclaim):
    """Consume ``robot``'s inbox as consumer ``consumer`` of the group named ``robot``."""

    def __init__(
        self,
        robot: str,
        bus: Bus | None = None,
        *,
        redis: RedisClient | None = None,
        consumer: str | None = None,
        batch_size: int | None = None,
        block_ms: int | None = None,
        visibility_timeout: float | None = None,
        max_deliveries: int | None = None,
        retry_delay: float | None = None,
        claim_interval: float | None = None,
        register: bool = True,
        verify: str | None = None,
        in_flight: int | None = None,
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
        self.claim_interval = float(claim_interval or sweep_interval(self.visibility_timeout))
        self.heartbeat_interval = max(0.02, self.visibility_timeout / 3)
        self.in_flight = max(1, int(in_flight or 1))
        self.max_held = max(self.batch_size * 4, self.in_flight * 2)
        self._register = register
        self.verify = verify or verify_mode(robot)
        if self.verify not in VERIFY_MODES:
            raise BusError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {self.verify!r}")
        self.parking = Parking(self.bus, self.robot)
        self.inbox = self.bus.keys.inbox(robot)
        self.dlq = self.bus.keys.dlq(robot)
        # the keys the conversation scripts take after the inbox (READ/ACQUIRE/COMPLETE/DEAD_LETTER)
        self.conv_keys = [self.inbox, self.bus.keys.conversation_queue(robot), self.bus.keys.conversation_heads(robot)]
        self._vis_ms = max(1, int(self.visibility_timeout * 1000))
        self._cluster = is_cluster_client(self.redis)

        self._handler: Handler = lambda d: None  # robot_lab: an incoming message never runs the LLM by default
        self._auto_ack = True
        self._held: OrderedDict[str, Delivery] = OrderedDict()
        self._lost: set[str] = set()
        self._running: dict[str, Delivery] = {}
        self._run_since: dict[str, float] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._pool = None
        self._handler_errors: list[BaseException] = []
        self._finished = 0
        self._waiting_ready = 0
        self._cursor = "0-0"
        self._drained = False
        self._ack_queue: list[str] = []
        self._started = False
        self._last_claim = 0.0
        self._last_beat = 0.0
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self.counts = {"acked": 0, "dead": 0, "retried": 0, "reclaimed": 0}
        self.key_problems: list[str] = []  # this robot's keys of the wrong type (bus/key_types.py)
        self._orphans_due = False  # a round failed on such a key: read this consumer's pending back

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

    def serve(self, robot: ServedRobot, *, auto_reply: bool = True, **run_kwargs: Any) -> BusPoller:
        """Run ``robot.run(text, **run_kwargs)`` on each task and reply with ``.reply``
        (a dict content is flattened to ``"k: v"`` lines, as robot_lab does). A robot with
        a ``serve_policy(headers)`` (a Robot) offers what it was built with, narrowed by the
        message's headers; ``run_kwargs`` given here win."""

        takes_conversation = "conversation_id" in inspect.signature(robot.run).parameters
        policy = getattr(robot, "serve_policy", None)
        takes_attachments = "attachments" in inspect.signature(robot.run).parameters
        params = inspect.signature(robot.run).parameters
        # a Robot (or RobotPool) keeps a step journal per message: a redelivery replays it,
        # and a run that asks a person parks until the answer comes (bus/parking.py)
        takes_durable = "durable_id" in params or (policy is not None and any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()))
        # A Robot keeps the conversation of the run in hand on itself, so one object runs one
        # message at a time. In flight, serve an object that says it takes concurrent runs
        # (``concurrent_runs = True``: robot_lab.workers.inflight.RobotPool, a robot per
        # slot); any other robot object is run under a lock, one message at a time.
        guard = threading.Lock() if self.in_flight > 1 and not getattr(robot, "concurrent_runs", False) else None
        if guard is not None:
            log.warning("bus.serve_serialized", robot=self.robot, in_flight=self.in_flight,
                        hint="serve a RobotPool to run messages concurrently")

        def run(message: RobotMessage) -> Any:
            kwargs = {**(policy(message.headers) if callable(policy) else {}), **run_kwargs}
            if takes_conversation and message.conversation_id and "conversation_id" not in kwargs:
                kwargs["conversation_id"] = message.conversation_id  # any worker continues the chat
            if takes_durable and "durable_id" not in kwargs:
                kwargs["durable_id"] = f"bus:{self.robot}:{message.key}"
            if takes_attachments and message.extensions.get("attachments") and "attachments" not in kwargs:
                kwargs["attachments"] = message.extensions["attachments"]  # files for the skills' workspace
            if guard is None:
                result = robot.run(flatten_content(message.content), **kwargs)
            else:
                with guard:
                    result = robot.run(flatten_content(message.content), **kwargs)
            return result if getattr(result, "files", None) else getattr(result, "reply", result)

        return self.respond_to_tasks(run, auto_reply=auto_reply)

    def _respond(self, d: Delivery, fn: Callable[[RobotMessage], Any], auto_reply: bool) -> None:
        """Answer ``d`` once per (sender, id): see :mod:`robot_lab.bus.replies`; a message
        that answers a parked one runs that one again (:mod:`robot_lab.bus.parking`)."""
        msg = d.message
        assert msg is not None
        r = self.redis
        record_key = self.bus.keys.replied_for(self.robot, record_key_part(msg))
        parked, waits_on, recorded = self._first_reads(msg, record_key)
        wake = parked is not None and self.verify == "require" and bool(
            self.bus.keyring.problem(d.fields.get(b"envelope", b""), msg))  # let in by intake as a wake
        if wake:
            assert parked is not None
            # answered through Redis already: run M again and reply where M asked to be answered
            msg = msgspec.structs.replace(msg, reply_to=parked.original.reply_to or parked.original.from_)
        if parked is not None and not wake:
            if self.verify == "require" and not self.parking.may_answer(msg, parked):
                self._dead_letter(d, "answer_refused", f"{msg.from_!r} may not answer input requests of "
                                  f"{self.robot!r} (durable.answerers)")
                return
        if parked is not None:
            original = parked.original
            fn = lambda _answer, fn=fn: fn(original)  # noqa: E731 - the answer re-runs the parked message
        elif msg.kind == "answer":  # to nothing waiting: already answered, expired or unknown
            self._dead_letter(d, "answer_refused", f"no message of {self.robot!r} waits for request "
                              f"{msg.in_reply_to!r} (already answered, expired, or unknown)")
            return
        elif msg.is_reply:
            return
        elif waits_on is not None:  # the conversation waits for an answer: ask again, run nothing
            reply = self.parking.pending_question(waits_on, msg)
            if reply is not None:
                self._send_reply(d, reply)
                return
        fp = fingerprint(msg)
        if recorded is _UNREAD:
            recorded = coalesce.call(r, "get", record_key)  # with other handlers' round trips (in flight)
        if recorded is not None:
            theirs, body = read_record(recorded)
            if theirs not in (None, fp):
                self._conflict(d, msg)
            else:
                if body:
                    self._send_reply(d, decode_message(body))
                log.info("bus.reply_resent", entry=d.entry_id, deliveries=d.deliveries)
            return
        if parked is not None and not wake:
            try:
                self.parking.record_answer(msg, parked)
            except InvalidAnswer as exc:  # not recorded: the message still waits, ask again saying why
                again = self.parking.pending_question(parked.request_id, msg, error=str(exc))
                if again is not None:
                    self._send_reply(d, again)
                log.info("bus.answer_invalid", robot=self.robot, request=parked.request_id, error=str(exc))
                return
        try:
            content = fn(msg)
        except InputRequired as exc:
            if not (exc.request or {}).get("id"):
                raise  # nothing recorded the request (no durable id): a failure like any other
            question = self.parking.park(msg, parked.original if parked else msg, exc)
            coalesce.call(r, "set", record_key, make_record(fp, encode_message(question)), nx=True,
                          ex=int(self.bus.settings.record_ttl))
            self._send_reply(d, question)
            return
        if parked is not None:
            self.parking.resumed(parked)
        files = reply_attachments(self.bus, content) if getattr(content, "files", None) else []
        if content is not None and not isinstance(content, (str, Mapping)):
            content = getattr(content, "reply", None) if hasattr(content, "reply") else str(content)
        ttl = int(self.bus.settings.record_ttl)
        if content is None or not auto_reply:
            coalesce.call(r, "set", record_key, make_record(fp, b""), nx=True, ex=ttl)
            return
        reply: RobotMessage | None = self.bus.build_reply(msg, content, from_=self.robot)
        if files and reply is not None:
            reply.extensions["attachments"] = files  # what the run wrote (robot_lab.bus.reply_files)
        if not coalesce.call(r, "set", record_key, make_record(fp, encode_message(reply)), nx=True,  # type: ignore[arg-type]
                             ex=ttl):
            # another consumer handled it meanwhile: send the reply it recorded, not ours
            theirs, body = read_record(r.get(record_key) or b"")
            if theirs not in (None, fp):
                self._conflict(d, msg)
                return
            reply = decode_message(body) if body else None
        if reply is not None:
            self._send_reply(d, reply)

    def _first_reads(self, msg: RobotMessage, record_key: str) -> tuple[Any, str | None, Any]:
        """``parking.find(msg)`` and, in the same round trip where find has nothing to read
        first (no ``in_reply_to``: the common case), the reply record: ``(parked, waits_on,
        record)``, the record ``_UNREAD`` when it was not read. One round trip less per
        message; a record read that fails is read again where it was read before (its error
        raises there, as it did)."""
        if msg.in_reply_to:  # find reads the parked message first; the record waits for it
            return (*self.parking.find(msg), _UNREAD)
        key = self.parking.waiting_key(msg)
        pipe = coalesce.pipeline(self.redis)
        if key is not None:
            pipe.get(key)
        pipe.get(record_key)
        replies = coalesce.execute(pipe, raise_on_error=False)
        if key is not None and isinstance(replies[0], Exception):
            raise replies[0]  # find's own read failed: as before
        recorded = replies[-1]
        return (None, waiting_request(replies[0]) if key is not None else None,
                _UNREAD if isinstance(recorded, Exception) else recorded)

    def _send_reply(self, d: Delivery, reply: RobotMessage) -> None:
        """Send a reply; one that cannot be routed dead-letters the message with it."""
        if self.bus.deliver_reply(reply) is None:
            self._dead_letter(d, "unroutable_reply",
                              f"the reply cannot be delivered: {reply.to!r} is not a valid inbox name",
                              extra={"reply": encode_message(reply)})

    def _conflict(self, d: Delivery, msg: RobotMessage) -> None:
        self._dead_letter(d, "duplicate_id",
                          f"message id {msg.id!r} from {msg.from_!r} was already used for a different message "
                          "(other content); give each message its own id")

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
