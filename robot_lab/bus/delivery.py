"""One delivery of one inbox entry to one consumer: the Ruby gem's TypedBus ``Delivery``.

A delivery is resolved exactly once: ``ack()`` (XACK, done), ``nack()`` (retry later, or
dead-letter once the delivery budget is spent) or ``dead_letter()``. Resolving twice
raises BusError, as in robot_lab.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from robot_lab.errors import BusError, SchemaError
from robot_lab.schemas import RobotMessage



class DeliveryOwner(Protocol):
    """What a delivery needs of the poller that read it (the poller implements it), so this
    module does not import the poller that imports it."""

    robot: str
    bus: Any

    def _ack(self, delivery: Delivery) -> None: ...

    def _nack(self, delivery: Delivery, error: Any, *, requeue: bool, delay: float) -> None: ...

    def _dead_letter(self, delivery: Delivery, reason: str, error: Any, *, notify: Any = None,
                     extra: Any = None) -> None: ...

    def _send_reply(self, delivery: Delivery, reply: RobotMessage) -> None: ...

PENDING, ACKED, NACKED, DEAD = "pending", "acked", "nacked", "dead"


class Delivery:
    """An inbox entry handed to a handler. ``message`` is None only for entries that fail
    validation; those never reach a handler (they go to the DLQ at once)."""

    __slots__ = (
        "poller", "entry_id", "fields", "deliveries", "message", "error", "conversation",
        "state", "retry_at", "needs_claim", "last_error",
    )

    def __init__(
        self,
        poller: DeliveryOwner,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        deliveries: int,
        message: RobotMessage | None,
        error: SchemaError | str | None,
        conversation: str | bytes | None,
    ) -> None:
        self.poller = poller
        self.entry_id = entry_id
        self.fields = fields
        self.deliveries = deliveries
        self.message = message
        self.error = error
        # the conversation id this entry was queued under by the READ script (None: free)
        self.conversation = conversation
        self.state = PENDING
        self.retry_at = 0.0
        self.needs_claim = False
        self.last_error: str | None = None

    @property
    def robot(self) -> str:
        return self.poller.robot

    @property
    def pending(self) -> bool:
        return self.state == PENDING

    @property
    def acked(self) -> bool:
        return self.state == ACKED

    @property
    def nacked(self) -> bool:
        return self.state in (NACKED, DEAD)

    @property
    def dead(self) -> bool:
        return self.state == DEAD

    def _check_pending(self, action: str) -> None:
        if self.state != PENDING:
            raise BusError(f"cannot {action} entry {self.entry_id} of {self.robot!r}: already {self.state}")

    def ack(self) -> None:
        """Acknowledge: XACK (and release the conversation) now."""
        self._check_pending("ack")
        self.poller._ack(self)

    def nack(self, error: BaseException | str | None = None, *, requeue: bool = True, delay: float | None = None) -> None:
        """Give the entry back. With ``requeue`` (default) it is redelivered to this consumer
        after a backoff and dead-lettered once delivered ``max_deliveries`` times; with
        ``requeue=False`` it goes to the DLQ now (the Ruby gem's nack semantics)."""
        self._check_pending("nack")
        self.poller._nack(self, error, requeue=requeue, delay=delay)

    def dead_letter(self, reason: str, error: BaseException | str) -> None:
        self._check_pending("dead-letter")
        self.poller._dead_letter(self, reason, error)

    def reply(self, content: str | Mapping[str, Any]) -> RobotMessage:
        """Reply to this message (to its ``reply_to``, else its sender). A reply that cannot
        be routed (that name is no valid inbox) dead-letters this delivery as
        ``unroutable_reply``, with the reply in the dead letter."""
        if self.message is None:
            raise BusError(f"entry {self.entry_id} of {self.robot!r} has no valid message to reply to")
        reply: RobotMessage = self.poller.bus.build_reply(self.message, content, from_=self.robot)
        self.poller._send_reply(self, reply)  # unroutable: this delivery is dead-lettered with it
        return reply

    def __repr__(self) -> str:
        mid = self.message.id if self.message else None
        return f"<Delivery {self.robot}/{self.entry_id} message={mid} deliveries={self.deliveries} {self.state}>"
