"""Recorded replies: what makes ``respond_to_tasks`` / ``serve`` idempotent.

The reply to a handled message is recorded under ``<inbox>:replied:<from>:<id>`` before it
is sent, so a redelivery (or the sender publishing the same message again) re-sends that
reply instead of calling the handler -- an LLM -- again. The record is scoped by sender
(another sender may use the same id for its own message) and carries a hash of what the
message says (``from``, ``kind``, ``content``, ``conversation_id``): the same id from the
same sender with other content is a conflict, answered with an error envelope and
dead-lettered as ``duplicate_id``, never silently answered with another message's reply.

Record value: ``v2:<sha256 hex>:<reply envelope JSON or empty>`` (empty: handled, no reply).
A record written before the hash existed (the bare envelope, or empty) matches any message.
"""

from __future__ import annotations

import hashlib
from fnmatch import fnmatchcase
from collections.abc import Iterable

import msgspec

from robot_lab.schemas import RobotMessage

_PREFIX = b"v2:"


def fingerprint(message: RobotMessage) -> str:
    """sha256 of what a message says; transport fields (id, times, headers) are left out
    so a client that re-publishes a message is recognised."""
    doc = {"from": message.from_, "kind": message.kind, "content": message.content,
           "conversation_id": message.conversation_id}
    return hashlib.sha256(msgspec.json.encode(doc, order="sorted")).hexdigest()


def make_record(fp: str, reply: bytes) -> bytes:
    return _PREFIX + fp.encode() + b":" + reply


def read_record(value: bytes) -> tuple[str | None, bytes]:
    """``(fingerprint or None for an old record, reply envelope or b"")``."""
    if value.startswith(_PREFIX) and len(value) >= len(_PREFIX) + 65:
        fp, rest = value[len(_PREFIX):len(_PREFIX) + 64], value[len(_PREFIX) + 65:]
        return fp.decode(), rest
    return None, value


def record_key_part(message: RobotMessage) -> str:
    """The part of the record key after ``:replied:``: the Ruby gem's message key ``from:id``."""
    return message.key


REPLY_STREAM_PREFIX = "_reply."  # Bus.request / delegation reply streams (core.REPLY_PREFIX)


def reply_allowed(message: RobotMessage, allowed: Iterable[str]) -> bool:
    """May a robot reply where ``message`` asks? Only to the sender's own inbox, a
    ``_reply.*`` stream, or an inbox ``allowed`` names (``bus.reply_to_allowed``): anyone who
    can XADD could otherwise redirect a robot's replies (and its model's work) into another
    robot's inbox."""
    target = message.reply_to
    if not target or target == message.from_ or target.startswith(REPLY_STREAM_PREFIX):
        return True
    return any(fnmatchcase(target, pattern) for pattern in allowed)


def refusal(message: RobotMessage) -> str:
    return (f"reply_to {message.reply_to!r} is neither the sender's inbox ({message.from_!r}), a "
            f"{REPLY_STREAM_PREFIX}* stream nor allowed by bus.reply_to_allowed")
