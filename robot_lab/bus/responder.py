"""Serving a robot on the bus: the handler that :meth:`~robot_lab.bus.poller.BusPoller.serve`
and :meth:`~robot_lab.bus.poller.BusPoller.respond_to_tasks` install (:class:`Responder`).

The poller runs handlers; this one answers each task message once per (sender, id): the
reply is recorded with a hash of the message (:mod:`.replies`), so a redelivery re-sends the
recorded reply instead of calling the function (an LLM) again, and an id reused for other
content is dead-lettered ``duplicate_id``. A run that asks a person parks the message
(:mod:`.parking`, through the poller's :class:`~robot_lab.bus.parking.Parking`) and replies
``input_required``; the answer runs it again. :func:`robot_runner` turns a robot
(``run(text, **kwargs)``) into the function it calls.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from robot_lab import coalesce
from robot_lab.errors import InputRequired
from robot_lab.inputs import InvalidAnswer
from robot_lab.logging import get_logger
from robot_lab.schemas import RobotMessage, decode_message, encode_message
from robot_lab.bus.parking import Parked, waiting_request
from robot_lab.bus.replies import fingerprint, make_record, read_record, record_key_part
from robot_lab.bus.reply_files import reply_attachments

if TYPE_CHECKING:
    from robot_lab.bus.delivery import Delivery
    from robot_lab.bus.state import PollerState

log = get_logger("robot_lab.bus.poller")

_UNREAD: Any = object()  # a read not made (yet)


def flatten_content(content: str | Mapping[str, Any]) -> str:
    """The Ruby gem's ``serve`` input: a Hash content becomes ``"k: v"`` lines."""
    if isinstance(content, str):
        return content
    return "\n".join(f"{k}: {v}" for k, v in content.items())


class ServedRobot(Protocol):
    """What :meth:`~robot_lab.bus.poller.BusPoller.serve` runs: ``run(text, **kwargs)`` returning a result with a
    ``.reply`` (or the reply itself). It also uses, when present, ``serve_policy(headers)``
    (the run arguments a message may narrow: a Robot's) and ``concurrent_runs`` (safe in
    several threads at once: a worker's RobotPool, which has both)."""

    def run(self, *args: Any, **kwargs: Any) -> Any: ...


def robot_runner(poller: PollerState, robot: ServedRobot, run_kwargs: Mapping[str, Any]
                 ) -> Callable[[RobotMessage], Any]:
    """What :meth:`~robot_lab.bus.poller.BusPoller.serve` answers with: ``robot.run(text, **kwargs)`` and its
    ``.reply`` (its result, when it wrote files). The run gets the message's conversation,
    a durable id per message and its attachments where ``robot.run`` takes them."""
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
    guard = threading.Lock() if poller.in_flight > 1 and not getattr(robot, "concurrent_runs", False) else None
    if guard is not None:
        log.warning("bus.serve_serialized", robot=poller.robot, in_flight=poller.in_flight,
                    hint="serve a RobotPool to run messages concurrently")

    def run(message: RobotMessage) -> Any:
        kwargs = {**(policy(message.headers) if callable(policy) else {}), **run_kwargs}
        if takes_conversation and message.conversation_id and "conversation_id" not in kwargs:
            kwargs["conversation_id"] = message.conversation_id  # any worker continues the chat
        if takes_durable and "durable_id" not in kwargs:
            kwargs["durable_id"] = f"bus:{poller.robot}:{message.key}"
        if takes_attachments and message.extensions.get("attachments") and "attachments" not in kwargs:
            kwargs["attachments"] = message.extensions["attachments"]  # files for the skills' workspace
        if guard is None:
            result = robot.run(flatten_content(message.content), **kwargs)
        else:
            with guard:
                result = robot.run(flatten_content(message.content), **kwargs)
        return result if getattr(result, "files", None) else getattr(result, "reply", result)

    return run


class Responder:
    """``fn(message) -> reply content | None`` as a poller's handler: each message answered
    once per (sender, id), the reply to ``reply_to`` (else the sender) unless not
    ``auto_reply``; replies to it are acked without calling ``fn`` (no ping-pong)."""

    def __init__(self, poller: PollerState, fn: Callable[[RobotMessage], Any], auto_reply: bool) -> None:
        self.poller = poller
        self.fn = fn
        self.auto_reply = auto_reply

    def __call__(self, d: Delivery) -> None:
        """Answer ``d`` once per (sender, id): see :mod:`robot_lab.bus.replies`; a message
        that answers a parked one runs that one again (:mod:`robot_lab.bus.parking`)."""
        poller, fn, auto_reply = self.poller, self.fn, self.auto_reply
        msg = d.message
        assert msg is not None
        r = poller.redis
        record_key = poller.bus.keys.replied_for(poller.robot, record_key_part(msg))
        parked, waits_on, recorded = self._first_reads(msg, record_key)
        wake = parked is not None and poller.verify == "require" and bool(
            poller.bus.keyring.problem(d.fields.get(b"envelope", b""), msg))  # let in by intake as a wake
        if wake:
            assert parked is not None
            # answered through Redis already: run M again and reply where M asked to be answered
            msg = msgspec.structs.replace(msg, reply_to=parked.original.reply_to or parked.original.from_)
        if parked is not None and not wake:
            if poller.verify == "require" and not poller.parking.may_answer(msg, parked):
                poller._dead_letter(d, "answer_refused", f"{msg.from_!r} may not answer input requests of "
                                    f"{poller.robot!r} (durable.answerers)")
                return
        if parked is not None:
            original = parked.original
            fn = lambda _answer, fn=fn: fn(original)  # noqa: E731 - the answer re-runs the parked message
        elif msg.kind == "answer":  # to nothing waiting: already answered, expired or unknown
            poller._dead_letter(d, "answer_refused", f"no message of {poller.robot!r} waits for request "
                                f"{msg.in_reply_to!r} (already answered, expired, or unknown)")
            return
        elif msg.is_reply:
            return
        elif waits_on is not None:  # the conversation waits for an answer: ask again, run nothing
            reply = poller.parking.pending_question(waits_on, msg)
            if reply is not None:
                poller._send_reply(d, reply)
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
                    poller._send_reply(d, decode_message(body))
                log.info("bus.reply_resent", entry=d.entry_id, deliveries=d.deliveries)
            return
        if parked is not None and not wake:
            try:
                poller.parking.record_answer(msg, parked)
            except InvalidAnswer as exc:  # not recorded: the message still waits, ask again saying why
                again = poller.parking.pending_question(parked.request_id, msg, error=str(exc))
                if again is not None:
                    poller._send_reply(d, again)
                log.info("bus.answer_invalid", robot=poller.robot, request=parked.request_id, error=str(exc))
                return
        try:
            content = fn(msg)
        except InputRequired as exc:
            if not (exc.request or {}).get("id"):
                raise  # nothing recorded the request (no durable id): a failure like any other
            question = poller.parking.park(msg, parked.original if parked else msg, exc)
            coalesce.call(r, "set", record_key, make_record(fp, encode_message(question)), nx=True,
                          ex=int(poller.bus.settings.record_ttl))
            poller._send_reply(d, question)
            return
        if parked is not None:
            poller.parking.resumed(parked)
        files = reply_attachments(poller.bus, content) if getattr(content, "files", None) else []
        if content is not None and not isinstance(content, (str, Mapping)):
            content = getattr(content, "reply", None) if hasattr(content, "reply") else str(content)
        ttl = int(poller.bus.settings.record_ttl)
        if content is None or not auto_reply:
            coalesce.call(r, "set", record_key, make_record(fp, b""), nx=True, ex=ttl)
            return
        reply: RobotMessage | None = poller.bus.build_reply(msg, content, from_=poller.robot)
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
            poller._send_reply(d, reply)

    def _first_reads(self, msg: RobotMessage, record_key: str) -> tuple[Parked | None, str | None, Any]:
        """``parking.find(msg)`` and, in the same round trip where find has nothing to read
        first (no ``in_reply_to``: the common case), the reply record: ``(parked, waits_on,
        record)``, the record ``_UNREAD`` when it was not read. One round trip less per
        message; a record read that fails is read again where it was read before (its error
        raises there, as it did)."""
        if msg.in_reply_to:  # find reads the parked message first; the record waits for it
            return (*self.poller.parking.find(msg), _UNREAD)
        key = self.poller.parking.waiting_key(msg)
        pipe = coalesce.pipeline(self.poller.redis)
        if key is not None:
            pipe.get(key)
        pipe.get(record_key)
        replies = coalesce.execute(pipe, raise_on_error=False)
        if key is not None and isinstance(replies[0], Exception):
            raise replies[0]  # find's own read failed: as before
        recorded = replies[-1]
        return (None, waiting_request(replies[0]) if key is not None else None,
                _UNREAD if isinstance(recorded, Exception) else recorded)

    def _conflict(self, d: Delivery, msg: RobotMessage) -> None:
        """A message id reused for other content: dead-lettered, neither run nor answered."""
        self.poller._dead_letter(d, "duplicate_id",
                                 f"message id {msg.id!r} from {msg.from_!r} was already used for a different message "
                                 "(other content); give each message its own id")
