"""Checking one inbox entry before anything handles it, so that a consumer never dies of
its input.

:func:`check_entry` turns any stream entry -- arbitrary field names and bytes, any JSON,
pathological nesting, huge values, wrong types -- into a :class:`Verdict`: the message to
handle, or the reason to dead-letter it at once (``invalid``, ``too_large``,
``unsupported``) with a readable error. It never raises: whatever goes wrong while
decoding is a verdict about the entry, not a crash of the consumer. For a refused entry it
also reads what it can of ``reply_to``, ``id``, ``from`` and ``conversation_id``, so the
sender can get an error envelope and the conversation can be released.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from robot_lab.errors import BusError, SchemaError
from robot_lab.schemas import RobotMessage, decode_message
from robot_lab.bus.names import check_robot_name

SUPPORTED_VERSION = 1
SUPPORTED_KINDS = ("message", "reply", "error", "input_required", "answer")  # the last two: docs/durable.md
_ERROR_LIMIT = 500  # characters of an error text kept (a huge value must not be echoed)


@dataclass(slots=True)
class Verdict:
    """What :func:`check_entry` found: ``message`` to handle, or ``reason`` + ``error``."""

    message: RobotMessage | None = None
    reason: str = ""  # '' = handle it; else invalid | too_large | unsupported
    error: str = ""
    # best-effort fields of a refused entry (only valid names / short strings)
    lenient: dict[str, str] = field(default_factory=dict)


def text(value: Any, limit: int = _ERROR_LIMIT) -> str:
    """Any value as a bounded, printable string (bytes decoded leniently)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    s = value if isinstance(value, str) else repr(value)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s)} characters)"


def check_entry(robot: str, entry: str, fields: Mapping[bytes, bytes], *, max_bytes: int) -> Verdict:
    """Decide what to do with one inbox entry; never raises."""
    try:
        return _check(robot, entry, fields, max_bytes)
    except Exception as exc:  # noqa: BLE001 - an entry must never crash its consumer
        return Verdict(reason="invalid", error=text(f"cannot read the entry: {type(exc).__name__}: {exc}"))


def _check(robot: str, entry: str, fields: Mapping[bytes, bytes], max_bytes: int) -> Verdict:
    raw = fields.get(b"envelope")
    if raw is None:
        names = ", ".join(sorted(text(k, 60) for k in fields))
        return Verdict(reason="invalid", error=text(f"entry has no 'envelope' field (fields: {names})"))
    if max_bytes > 0 and len(raw) > max_bytes:
        return Verdict(reason="too_large", lenient=lenient_fields(raw),
                       error=f"envelope is {len(raw)} bytes; the limit is {max_bytes} (setting bus.max_envelope_bytes)")
    try:
        message = decode_message(raw)
    except SchemaError as exc:
        return Verdict(reason="invalid", error=text(str(exc)), lenient=lenient_fields(raw))
    except (RecursionError, ValueError, TypeError, OverflowError, MemoryError, msgspec.MsgspecError) as exc:
        return Verdict(reason="invalid", error=text(f"{type(exc).__name__}: {exc}"), lenient=lenient_fields(raw))
    problem = _strictness(message)
    if problem:
        reason, error = problem
        return Verdict(message=message, reason=reason, error=error)
    if not _has_id(raw):
        # a hand-written envelope without "id": derive a stable one from the entry, so
        # redeliveries stay idempotent and replies can name it
        message = msgspec.structs.replace(message, id=f"{robot}/{entry}")
    return Verdict(message=message)


def _strictness(message: RobotMessage) -> tuple[str, str] | None:
    """What decoding accepts but this worker must not handle as if it were fine."""
    if message.v != SUPPORTED_VERSION:
        return "unsupported", f"envelope version v={message.v!r} is not supported (this worker speaks v1)"
    if message.kind not in SUPPORTED_KINDS:
        return "unsupported", text(f"kind {message.kind!r} is not supported (known: {', '.join(SUPPORTED_KINDS)})")
    for name in ("created_at", "deadline"):
        value = getattr(message, name)
        if isinstance(value, _dt.datetime) and value.tzinfo is None:
            return "invalid", f"{name} {value.isoformat()} has no timezone (add Z or +hh:mm)"
    for name, value in (("to", message.to), ("reply_to", message.reply_to)):
        if value is not None:
            try:
                check_robot_name(value, name)
            except BusError as exc:
                return "invalid", text(str(exc))
    return None


class _IdProbe(msgspec.Struct):
    id: Any = None


def _has_id(raw: bytes) -> bool:
    if b'"id"' not in raw:
        return False
    try:
        return msgspec.json.decode(raw, type=_IdProbe).id is not None
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return True


_LENIENT_KEYS = ("reply_to", "from", "id", "conversation_id")
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]')


def top_level_strings(raw: bytes, wanted: tuple[str, ...] = _LENIENT_KEYS) -> dict[str, Any]:
    """The top-level string members ``wanted`` of a JSON object, read without decoding the
    rest: one pass over its tokens, nesting counted rather than recursed into, so an entry
    nested 100,000 deep or of many megabytes is read as fast as a small one. Only an object
    whose brackets close is read (a truncated entry yields nothing)."""
    depth, key, expect_key, found = 0, None, False, {}
    for match in _TOKEN.finditer(raw):
        token = match.group()
        head = token[:1]
        if head in (b"{", b"["):
            if depth == 0 and head != b"{":
                return {}
            depth += 1
            expect_key = depth == 1
        elif head in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return found
        elif depth != 1:
            continue
        elif head == b",":
            expect_key, key = True, None
        elif head == b'"':
            if expect_key:
                key, expect_key = json.loads(token), False
            elif key in wanted:
                found[key] = json.loads(token)
    return {}


def lenient_fields(raw: bytes | None, max_bytes: int = 64 * 1_048_576) -> dict[str, str]:
    """Best-effort ``reply_to`` / ``from`` / ``id`` / ``conversation_id`` of an entry that
    failed validation (also one too deep or too large to decode): to send its sender an
    error envelope and release its conversation. Only top-level strings; names must be
    valid inbox names."""
    if not raw or len(raw) > max_bytes:
        return {}
    try:
        doc = top_level_strings(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for key in _LENIENT_KEYS:
        value = doc.get(key)
        if not isinstance(value, str) or not value or (key != "conversation_id" and len(value) > 200):
            continue
        if key in ("reply_to", "from"):
            try:
                check_robot_name(value, key)
            except BusError:
                continue
        out[key] = value
    return out
