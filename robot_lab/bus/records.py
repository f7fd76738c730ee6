"""Plain records the bus hands back: dead letters, outbox entries, inbox statistics.

They are read views over Redis data (stream entries, hashes, XINFO), not wire types: the
wire contract is the RobotMessage envelope alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from robot_lab.errors import SchemaError
from robot_lab.schemas import RobotMessage, decode_message


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of ``<inbox>:dlq``: the envelope exactly as it was, why it failed and how
    often it had been delivered."""

    dlq_id: str
    robot: str
    reason: str  # invalid | too_large | unsupported | expired | failed | max_deliveries | rejected | duplicate_id | unroutable_reply | reply_refused
    error: str
    deliveries: int
    envelope: str
    entry_id: str = ""
    message_id: str = ""
    consumer: str = ""
    failed_at: str = ""

    @classmethod
    def from_entry(cls, dlq_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
        get = lambda name: _text(fields.get(name.encode()))  # noqa: E731
        try:
            deliveries = int(get("deliveries") or 0)
        except ValueError:
            deliveries = 0
        return cls(
            dlq_id=_text(dlq_id),
            robot=get("robot"),
            reason=get("reason"),
            error=get("error"),
            deliveries=deliveries,
            envelope=get("envelope"),
            entry_id=get("entry_id"),
            message_id=get("message_id"),
            consumer=get("consumer"),
            failed_at=get("failed_at"),
        )

    def message(self) -> RobotMessage | None:
        """The envelope decoded, or None when it is the reason it is here."""
        try:
            return decode_message(self.envelope)
        except SchemaError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class OutboxEntry:
    """The Ruby gem's ``outbox[key]``: a message a robot sent and the replies it got back."""

    message_id: str
    status: str  # sent | replied
    message: RobotMessage | None
    replies: list[RobotMessage] = field(default_factory=list)
    sent_at: str = ""
    replied_at: str = ""




def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)
