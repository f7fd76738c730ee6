"""Served messages that wait for a person: ``input_required`` and ``answer`` envelopes.

When a served robot needs input while handling message M (``ask_user``, an approval), its
run parks (the step journal of M's durable id records how far it got) and the poller
replies to M's sender with an envelope of kind ``input_required`` whose content names the
request (``request_id``, ``question``, ``choices``, ``default``, ``kind``, ``tool``,
``arguments``). M is acked; ``<prefix>:robot:<robot>:parked:<request id>`` keeps M's envelope
and ``<prefix>:robot:<robot>:parked-conv:<conversation>`` the request its conversation waits
on -- the robot's own keys, which no other ACL user may write (under ``<prefix>:bus:`` anyone
may append: a worker could not write them and a publisher could squat them as streams). The
request's record says where M waits (``InputStore.park``), so an answer given elsewhere wakes
M without reading these keys. A message parked under the inbox by an older release
(``Keys.legacy_parked_message``) is still found by its answer.

The answer is the sender's next message with ``in_reply_to`` = the request id (kind
``answer`` by convention; content: the text, or ``{"text": ..., "approved": true|false}``).
Handling it records the answer once, runs M again (its journal replays, the parked step
gets the answer) and replies to the *answer* message -- with the final reply, or another
``input_required``. Until then a message of the same conversation without that
``in_reply_to`` is not run: it gets the pending ``input_required`` again, so the
conversation waits in order behind the question.

Under ``signing.verify=require`` only a sender allowed to answer for the robot
(``durable.answerers``; default: M's own sender) may answer; any other answer is
dead-lettered ``answer_refused``.

An answer given elsewhere (``robot-lab answer``, the dashboard, ``RunHandle.answer``, the A2A
tier) is recorded first and then *wakes* the parked message with such an envelope
(:func:`wake`). When the conversation's replies go to a private reply stream (``_reply.*``),
a copy of the answer envelope is appended there first, so whoever follows that stream (an
A2A task) learns the id the final reply will answer -- the reply to the answer, not to M.
Under require an unsigned wake is accepted only while its request holds a recorded answer and
M is parked (:meth:`Parking.is_wake`); its content is ignored and the reply goes to M's own
``reply_to``, so a forged wake can neither answer nor redirect anything.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from robot_lab import coalesce
from robot_lab.errors import InputRequired
from robot_lab.inputs import AlreadyAnswered, Answer, InputStore, approves
from robot_lab.logging import get_logger
from robot_lab.schemas import RobotMessage, decode_message, encode_message
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from robot_lab.bus.core import Bus

REPLY_STREAM_PREFIX = "_reply."  # private reply streams (bus.requests.REPLY_PREFIX)

log = get_logger("robot_lab.bus")

class Parked:
    """An answer's parked message: the request it answers, M (the message to run again) and
    the key M was found under."""

    def __init__(self, request_id: str, original: RobotMessage, key: str) -> None:
        self.request_id = request_id
        self.original = original
        self.key = key


def _parked(bus: Bus, robot: str, request_id: str, *, legacy: bool = True) -> Parked | None:
    """``robot``'s message parked on ``request_id``, at its key or (``legacy``) where an older
    release kept it (a key there that is no string -- a squatted stream -- or that this user
    may not read is nothing parked)."""
    key = bus.keys.parked_message(robot, request_id)
    raw = coalesce.call(bus.redis, "get", key)
    if raw is None and legacy:
        key = bus.keys.legacy_parked_message(robot, request_id)
        try:
            raw = bus.redis.get(key)
        except ResponseError:  # WRONGTYPE, or NOPERM under robot-lab acl (nothing was parked there)
            raw = None
    return None if raw is None else Parked(request_id, decode_message(raw), str(key))


class Parking:
    """``robot``'s served messages that wait for a person, as its :class:`~robot_lab.bus.poller.BusPoller` handles
    them (the poller owns one): find the message an answer wakes, park one that asks, record
    an answer, ask again, forget it once it ran to its end. The functions below the class
    serve processes that hold no poller (a sweep, ``robot-lab answer``, the A2A tier)."""

    def __init__(self, bus: Bus, robot: str) -> None:
        self.bus = bus
        self.robot = robot
        self.redis = bus.redis

    def _conv_key(self, conversation: str) -> str:
        return str(self.bus.keys.parked_conversation(self.robot, conversation))

    def find(self, msg: RobotMessage) -> tuple[Parked | None, str | None]:
        """``(parked, None)`` when ``msg`` answers a parked request; ``(None, request id)`` when
        its conversation waits on a request that ``msg`` does not answer; else ``(None, None)``."""
        if msg.in_reply_to:  # an older release's parked message is looked for by an answer only (not every reply)
            parked = _parked(self.bus, self.robot, msg.in_reply_to, legacy=msg.kind == "answer")
            if parked is not None:
                return parked, None
        key = self.waiting_key(msg)
        if key is not None:
            return None, waiting_request(coalesce.call(self.redis, "get", key))
        return None, None

    def waiting_key(self, msg: RobotMessage) -> str | None:
        """The key :meth:`find` reads for a message without ``in_reply_to`` (the request its
        conversation waits on), or None when it reads nothing for it."""
        if msg.conversation_id and msg.kind == "message" and not msg.in_reply_to:  # never a reply: no ping-pong
            return self._conv_key(msg.conversation_id)
        return None

    def is_wake(self, msg: RobotMessage) -> bool:
        """``msg`` only wakes a parked message whose request was answered through Redis."""
        if msg.kind != "answer" or not msg.in_reply_to or _parked(self.bus, self.robot, msg.in_reply_to) is None:
            return False
        found = InputStore(self.redis, self.bus.keys).get(msg.in_reply_to)
        return found is not None and found.answer is not None

    def may_answer(self, msg: RobotMessage, parked: Parked) -> bool:
        """Is the (verified) sender allowed to answer here (``durable.answerers``; default: the
        parked message's own sender)? Asked under ``signing.verify=require`` only."""
        answerers = get_settings().durable.answerers
        allowed = [*answerers.get(self.robot, []), *answerers.get("*", [])] or [parked.original.from_]
        return any(fnmatchcase(msg.from_, pattern) for pattern in allowed)

    def record_answer(self, msg: RobotMessage, parked: Parked) -> None:
        """Write ``msg``'s content as the request's answer (once: an earlier answer -- the CLI's,
        say -- stands). Raises InvalidAnswer (nothing recorded) for an answer the request cannot
        take (``inputs.check_answer``): the poller asks the sender again, saying why."""
        content = msg.content
        if isinstance(content, dict):
            text = str(content.get("text") or content.get("answer") or "")
            approved = content.get("approved")
        else:
            text, approved = str(content), None
        store = InputStore(self.redis, self.bus.keys)
        found = store.get(parked.request_id)
        if found is None or found.answer is not None:
            return  # gone (the parked message runs on its own journal), or answered: that answer stands
        if found.request.get("kind") == "approval" and approved is None:
            approved = approves(text)
        try:
            store.give(found, Answer(text=text, approved=approved, by=msg.from_))
        except AlreadyAnswered:
            pass  # answered a moment ago, elsewhere: that answer stands

    def park(self, msg: RobotMessage, original: RobotMessage, exc: InputRequired) -> RobotMessage:
        """Remember ``original`` under the request and build the ``input_required`` reply to ``msg``."""
        request = exc.request or {}
        rid = str(request["id"])
        ttl = max(int(self.bus.settings.record_ttl), 7 * 86_400)  # as long as the request lives
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.bus.keys.parked_message(self.robot, rid), encode_message(original), ex=ttl)
        if original.conversation_id:
            pipe.set(self._conv_key(original.conversation_id), rid, ex=ttl)
        pipe.execute()
        InputStore(self.redis, self.bus.keys).park(rid, {
            "robot": self.robot, "from": original.from_, "reply_to": original.reply_to,
            "conversation_id": original.conversation_id})
        return self.bus.build_reply(msg, question_content(request), from_=self.robot, kind="input_required")

    def pending_question(self, request_id: str, msg: RobotMessage, error: str | None = None) -> RobotMessage | None:
        """The ``input_required`` reply again, for a message that did not answer it (``error``:
        why ``msg``, an answer, was not taken)."""
        found = InputStore(self.redis, self.bus.keys).get(request_id)
        if found is None:
            return None
        content = question_content({**found.request, "id": request_id})
        if error is not None:
            content["error"] = error
        return self.bus.build_reply(msg, content, from_=self.robot, kind="input_required")

    def resumed(self, parked: Parked) -> None:
        """The parked message ran to its end: forget it."""
        _forget(self.bus, self.robot, parked)


def waiting_request(raw: bytes | str | None) -> str | None:
    """The request id a conversation waits on, from the value of its :meth:`Parking.waiting_key`."""
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def question_content(request: dict[str, Any]) -> dict[str, Any]:
    out = {"request_id": request.get("id"), "question": request.get("question"), "kind": request.get("kind")}
    for name in ("choices", "default", "tool", "arguments", "deadline"):
        if request.get(name) is not None:
            out[name] = request[name]
    return out


def _forget(bus: Bus, robot: str, parked: Parked) -> None:
    """Delete the parked message and its conversation's wait (if it is still this request's),
    and the request's note of where it waits."""
    keys = [parked.key]
    conversation_id = parked.original.conversation_id
    if conversation_id:
        conv = bus.keys.parked_conversation(robot, conversation_id)
        if waiting_request(bus.redis.get(conv)) == parked.request_id:
            keys.append(conv)
    bus.redis.delete(*keys)
    InputStore(bus.redis, bus.keys).unpark(parked.request_id)


def is_parked(bus: Bus, robot: str, request_id: str) -> bool:
    """Does ``robot``'s message still wait for ``request_id``? Read from the request's record
    (any process may read it; the parked keys are the robot's own), else from where an older
    release parked it (``EXISTS`` under the inbox, which every worker may do)."""
    found = InputStore(bus.redis, bus.keys).get(request_id)
    if found is not None and found.parked is not None:
        return True
    return bool(bus.redis.exists(bus.keys.legacy_parked_message(robot, request_id)))


def wake_parked(bus: Bus, robot: str, request_id: str, answer: Answer, parked: dict[str, Any] | None, *,
                reply_to: str | None = None) -> bool:
    """Wake ``robot``'s message waiting for the (recorded) answer to ``request_id``: where the
    request's record says it waits (``parked``), else the parked message itself (at its key or
    where an older release parked it; read by a user allowed to). False when nothing waits."""
    if parked is None:  # not noted on the record: parked by an older release, or a crash between the two writes
        try:
            legacy = _parked(bus, robot, request_id)
        except ResponseError as exc:  # another robot's keys, for a worker's user (its timeout sweep)
            log.warning("bus.parked_unreadable", robot=robot, request=request_id, error=str(exc))
            return False
        if legacy is None:
            return False
        parked = {"from": legacy.original.from_, "reply_to": legacy.original.reply_to,
                  "conversation_id": legacy.original.conversation_id}
    wake(bus, robot, request_id, answer, from_=str(parked["from"]), reply_to=reply_to or parked.get("reply_to"),
         conversation_id=parked.get("conversation_id"))
    return True


def withdraw(bus: Bus, robot: str, request_id: str, *, by: str) -> bool:
    """Cancel ``robot``'s message parked on ``request_id``: the request is closed (recorded as
    answered ``<by> (cancelled)``, so no later answer runs it) and the message and its
    conversation's wait are forgotten, so the conversation's next message runs. True when a
    parked message was withdrawn."""
    parked = _parked(bus, robot, request_id)
    InputStore(bus.redis, bus.keys).answer(request_id, Answer(text="", approved=False, by=f"{by} (cancelled)"))
    if parked is None:
        return False
    _forget(bus, robot, parked)
    log.info("bus.parked_withdrawn", robot=robot, request=request_id, by=by)
    return True


def wake(bus: Bus, robot: str, request_id: str, answer: Answer, *, from_: str, reply_to: str | None,
         conversation_id: str | None) -> RobotMessage:
    """Publish the ``answer`` envelope that runs ``robot``'s message parked on ``request_id``
    again (the answer itself is already recorded; the envelope carries it too, for the
    record). With a private reply stream (``_reply.*``) as ``reply_to``, a copy goes there
    first -- only into a stream that still exists -- so its reader can follow the
    conversation from the question to the answer's reply. Signed as ``from_`` when this
    process holds that sender's key (``signing.verify=require`` checks the answerer)."""
    from robot_lab.bus.core import build_message  # lazy: start-up time

    message = bus.keyring.sign(build_message(
        robot, {"text": answer.text, "approved": answer.approved}, from_=from_, kind="answer",
        in_reply_to=request_id, reply_to=reply_to, conversation_id=conversation_id))
    if reply_to and reply_to.startswith(REPLY_STREAM_PREFIX):
        try:
            bus.redis.xadd(bus.keys.inbox(reply_to), {"envelope": encode_message(message)}, nomkstream=True)
        except Exception as exc:  # an ACL user that may not write there (robot-lab acl): the answer still goes
            if "NOPERM" not in str(exc):
                raise
            log.warning("bus.answer_copy_refused", reply_to=reply_to, request=request_id, error=str(exc))
    bus.publish_message(message, create=True)
    return message
