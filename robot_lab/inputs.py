"""Input requests in Redis: what a parked run asked, and its one answer -- the one home of a
person's answer. A request is recorded here (:meth:`InputStore.create`), checked and answered
once here (:func:`check_answer`, :meth:`InputStore.give`), whoever answers; its owner is then
woken by its client: a network task (``network.human_input``: the RESUME transition) or a
served bus message (``bus.parking``: an ``answer`` envelope to where the record says it waits).
``network.human_input.answer`` is the entry point of an answer given through Redis (the CLI,
the dashboard, ``RunHandle.answer``, the A2A tier, the timeout sweep): the one layer that sees
both clients.

``<prefix>:input:<id>`` is a hash: ``request`` (JSON: id, question, choices, default, kind,
tool, arguments, robot, created_at, deadline), ``owner`` (JSON: who resumes the run once
answered -- a network task, a served bus message, an in-process durable run) and, once
answered, ``answer`` (JSON: text, approved, by, at). While a served bus message waits for
it, ``parked`` (JSON: robot, from, reply_to, conversation_id) says where the answer envelope
that wakes it goes -- so whoever answers (the CLI, the A2A tier, any worker's timeout sweep)
wakes it without reading the robot's private parked keys. The answer is written with HSETNX, so of
two answers racing from two processes exactly one wins and the other is told so. The index
``<prefix>:inputs:pending`` (request id -> created time) is what ``robot-lab pending`` lists;
``<prefix>:inputs:deadlines`` (request id -> deadline) is what the sweeper times out.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, glob_escape, is_wrong_type, wrong_typed
from robot_lab.logging import get_logger

log = get_logger("robot_lab.inputs")


_PARK = "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'parked', ARGV[1]) end"


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Answer:
    """A person's answer: ``text`` for a question; ``approved`` for an approval."""

    text: str = ""
    approved: bool | None = None
    by: str | None = None
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "approved": self.approved, "by": self.by, "timed_out": self.timed_out,
                "at": time.time()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        return cls(text=str(data.get("text") or ""), approved=data.get("approved"), by=data.get("by"),
                   timed_out=bool(data.get("timed_out")))


@dataclass
class InputRequest:
    """One recorded request; ``answer`` is None while it waits."""

    id: str
    request: dict[str, Any]
    owner: dict[str, Any] = field(default_factory=dict)
    answer: Answer | None = None
    parked: dict[str, Any] | None = None  # a served message waits: where to wake it (bus/parking.py)

    @property
    def question(self) -> str:
        return str(self.request.get("question", ""))

    def to_dict(self) -> dict[str, Any]:
        out = {**self.request, "id": self.id, "owner": self.owner,
               "status": "answered" if self.answer else "pending"}
        if self.answer is not None:
            out["answer"] = self.answer.to_dict()
        return out


APPROVE_WORDS = frozenset({"y", "yes", "approve", "approved", "ok", "true"})


def approves(text: str) -> bool:
    """Does a typed answer to an approval approve (``yes``, ``ok``, ...)?"""
    return text.strip().lower() in APPROVE_WORDS


class AlreadyAnswered(ConfigurationError):
    """The request holds an answer already (the first one stands); the message names who gave it."""


def _already(request_id: str, answer: Answer | None) -> AlreadyAnswered:
    return AlreadyAnswered(f"input request {request_id} was already answered by "
                           f"{(answer.by if answer is not None else None) or 'someone'}")


class InvalidAnswer(ConfigurationError):
    """An answer its request cannot take (not one of its choices, longer than
    ``durable.max_answer_chars``): nothing is recorded, the request still waits, and the
    answerer is told why in one line."""


def check_answer(found: InputRequest, answer: Answer) -> None:
    """The one check of a person's answer before it is recorded, whoever gives it (``robot-lab
    answer``, the dashboard API, ``RunHandle.answer``, the A2A tier, a bus ``answer``
    envelope): a question with choices takes one of them, its number (1-based) or nothing
    (its default); no answer is longer than ``durable.max_answer_chars``, so a pasted megabyte
    never reaches the prompt. A timeout's default answer is the robot's own: not checked."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    if answer.timed_out:
        return
    limit = get_settings().durable.max_answer_chars
    if len(answer.text) > limit:
        raise InvalidAnswer(f"the answer to input request {found.id} is {len(answer.text)} characters; at most "
                            f"{limit} are taken (durable.max_answer_chars)")
    choices = [str(c) for c in found.request.get("choices") or []]
    text = answer.text.strip()
    if found.request.get("kind") == "approval" or not choices or not text or text in choices:
        return
    if text.isdigit() and 1 <= int(text) <= len(choices):
        return
    raise InvalidAnswer(f"{_clip(text)!r} is not a choice of input request {found.id}: answer one of "
                        f"{', '.join(repr(c) for c in choices)}, or its number 1-{len(choices)}")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class InputStore:
    """The requests of one Redis / key prefix."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    def create(self, request: dict[str, Any], owner: dict[str, Any], ttl: int) -> None:
        """Record a new request and list it as pending (with its deadline, if any)."""
        rid = request["id"]
        key = self.keys.input_request(rid)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping={"request": json.dumps(request, default=str), "owner": json.dumps(owner)})
        pipe.expire(key, int(ttl))
        pipe.execute()
        # the indexes sit in another cluster slot: written after the record, so an id listed
        # there always has one (a record missing from them is found by its run's events)
        self.redis.zadd(self.keys.inputs_pending(), {rid: float(request.get("created_at") or time.time())})
        if request.get("deadline"):
            self.redis.zadd(self.keys.inputs_deadlines(), {rid: float(request["deadline"])})

    def get(self, request_id: str) -> InputRequest | None:
        raw = self.redis.hgetall(self.keys.input_request(request_id))
        if not raw:
            return None
        fields = {_decode(k): _decode(v) for k, v in raw.items()}
        answer = Answer.from_dict(json.loads(fields["answer"])) if "answer" in fields else None
        parked = json.loads(fields["parked"]) if "parked" in fields else None
        return InputRequest(request_id, json.loads(fields.get("request") or "{}"),
                            json.loads(fields.get("owner") or "{}"), answer, parked)

    def unanswered(self, request_id: str) -> InputRequest:
        """The request, still waiting for its answer; else ConfigurationError saying it is
        unknown, or AlreadyAnswered naming who answered it."""
        found = self.get(request_id)
        if found is None:
            raise ConfigurationError(f"no input request {request_id!r} (answered long ago, expired, or a typo)")
        if found.answer is not None:
            raise _already(found.id, found.answer)
        return found

    def give(self, found: InputRequest, answer: Answer) -> InputRequest:
        """Answer ``found`` once: the one way an answer is recorded, whoever gives it (the CLI,
        the dashboard, ``RunHandle.answer``, the A2A tier, a bus ``answer`` envelope, the
        timeout sweep). Checked first (:func:`check_answer`); of two answers racing, one wins
        and the other raises AlreadyAnswered naming the winner. Waking the owner is the
        caller's next step (``network.human_input.answer`` for an answer given through Redis;
        the bus poller runs a served message itself)."""
        if found.answer is not None:
            raise _already(found.id, found.answer)
        check_answer(found, answer)
        if not self.answer(found.id, answer):
            again = self.get(found.id)
            raise _already(found.id, again.answer if again is not None else None)
        found.answer = answer
        return found

    def answer(self, request_id: str, answer: Answer) -> bool:
        """Record ``answer`` unless the request already has one (True: this one won)."""
        won = bool(self.redis.hsetnx(self.keys.input_request(request_id), "answer", json.dumps(answer.to_dict())))
        if won:
            self.unlist(request_id)
        return won

    def park(self, request_id: str, where: dict[str, Any]) -> None:
        """A served message waits for this request: note where its answer envelope goes
        (``robot``, ``from``, ``reply_to``, ``conversation_id``), so an answer given anywhere
        wakes it (bus/parking.py). Only on an existing record: a request gone meanwhile is
        not made again as a bare hash."""
        self.redis.eval(_PARK, 1, self.keys.input_request(request_id), json.dumps(where))

    def unpark(self, request_id: str) -> None:
        """The served message no longer waits (it ran again, or was withdrawn)."""
        self.redis.hdel(self.keys.input_request(request_id), "parked")

    def unlist(self, request_id: str) -> None:
        """Take a request off the pending and deadline indexes (answered, or its run gone)."""
        for index in (self.keys.inputs_pending(), self.keys.inputs_deadlines()):
            self._index(self.redis.zrem, index, request_id)

    def pending_ids(self, limit: int = 1000) -> list[str]:
        """Ids of the requests listed as pending. When the index holds another type than a
        zset (any worker's Redis user may write it: :meth:`index_problems` names it), the
        records themselves are looked for instead (SCAN), so what waits is still listed."""
        raw = self._index(self.redis.zrange, self.keys.inputs_pending(), 0, limit - 1)
        if raw is not None:
            return [_decode(v) for v in raw]
        head = f"{self.keys.prefix}:input:"
        found = self.redis.scan_iter(match=f"{glob_escape(head)}*", count=1000)
        return [_decode(key)[len(head):].strip("{}") for key in found][:limit]

    def due(self, now: float | None = None, limit: int = 100) -> list[str]:
        """Pending requests whose deadline passed (none while the deadline index holds another
        type: :meth:`index_problems` names it, ``robot-lab status`` and ``pending`` show it)."""
        raw = self._index(self.redis.zrangebyscore, self.keys.inputs_deadlines(), "-inf", now or time.time(),
                          start=0, num=limit)
        return [_decode(v) for v in raw or []]

    def index_problems(self) -> list[str]:
        """``"<key> is a <type>, not a zset"`` for each index of the wrong type."""
        return wrong_typed(self.redis, {self.keys.inputs_pending(): "zset", self.keys.inputs_deadlines(): "zset"})

    @staticmethod
    def _index(command: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        """``command(key, ...)`` on an index; None when the index holds another type."""
        try:
            return command(key, *args, **kwargs)
        except Exception as exc:
            if not is_wrong_type(exc):
                raise
            log.warning("inputs.index_wrong_type", key=key, error=str(exc))
            return None
