"""The state one bus consumer keeps, shared by the parts of BusPoller.

BusPoller is assembled from one mixin per concern -- :mod:`.intake` (reading entries into
held deliveries), :mod:`.handling` (running them in conversation order and resolving them:
ack, nack, dead letter), :mod:`.reclaim` (heartbeats, the reclaim sweep, hand-back) -- and
:mod:`.poller` (settings, handler styles, the loop); it owns a :class:`~.parking.Parking`
and, as the handler of ``serve()``, a :class:`~.responder.Responder`. This class names the
attributes they share, so each of those modules can be read (and type-checked) alone;
:class:`robot_lab.bus.poller.BusPoller` sets them in ``__init__``. It is not in poller.py
because those modules need it and poller.py imports them: no import cycles
(tests/test_layering.py), not even for types.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from robot_lab.bus.core import Bus
    from robot_lab.bus.delivery import Delivery
    from robot_lab.bus.parking import Parking
    from robot_lab.connection import RedisClient
    from robot_lab.schemas import RobotMessage
    from robot_lab.threads import PoolShare


class PollerState:
    """Attributes of one consumer of one robot's inbox (set by ``BusPoller.__init__``)."""

    # who and where
    robot: str  # the robot, also the consumer group's name
    consumer: str  # this consumer's name in the group
    bus: Bus
    redis: RedisClient
    inbox: str  # the robot's inbox stream key
    dlq: str  # its dead-letter stream key
    conv_keys: list[str]  # inbox, conversation queue, conversation heads (the scripts' KEYS)
    _cluster: bool  # a RedisCluster client: no scripts in pipelines

    # settings
    batch_size: int
    block_ms: int
    visibility_timeout: float  # seconds an entry may sit idle before another consumer takes it
    max_deliveries: int
    retry_delay: float
    claim_interval: float  # seconds between reclaim sweeps
    heartbeat_interval: float
    max_held: int  # entries held at most (read, retrying or waiting for their conversation)
    in_flight: int  # handlers running at once (1: inline, in the polling thread)
    _vis_ms: int
    _register: bool  # create the inbox and group when missing
    verify: str  # signature check of each entry: off | warn | require (bus/keyring.py)
    parking: Parking  # its served messages that wait for a person (bus/parking.py)

    # what this consumer holds and does
    _handler: Callable[[Delivery], Any]
    _auto_ack: bool
    _held: OrderedDict[str, Delivery]  # entry id -> delivery, unresolved
    _lost: set[str]  # held entries another consumer has reclaimed (from the heartbeat)
    _running: dict[str, Delivery]  # entry id -> delivery whose handler runs now
    _run_since: dict[str, float]  # entry id -> when its handler started on the pool
    _lock: threading.RLock  # guards _held, _running, _ack_queue, counts (handler threads resolve)
    _wake: threading.Event  # set when a handler thread finishes (a slot is free)
    _pool: PoolShare | None  # the handler threads (in_flight > 1)
    _handler_errors: list[BaseException]  # Redis errors of handler threads, raised by poll()
    _finished: int  # entries the pool finished since poll() last counted them
    _waiting_ready: int  # entries the last round could have started but for a free slot
    _cursor: str  # newest entry id seen (the blocking wait starts after it)
    _drained: bool  # the last read got fewer entries than asked for
    _ack_queue: list[str]  # acks to send with the next round trip
    _started: bool
    _last_claim: float
    _last_beat: float
    counts: dict[str, int]

    if TYPE_CHECKING:  # implemented by the other mixins of BusPoller
        def _intake(self, entry: str, fields: Any, deliveries: int, cid: str | bytes | None, *,
                    from_script: bool = False) -> int: ...

        def _delivery_counts(self, ids: list[str]) -> dict[str, int]: ...

        def _dead_letter(self, d: Delivery, reason: str, error: BaseException | str, *, notify: Any = None,
                         extra: Any = None, report: bool = True) -> None: ...

        def _send_reply(self, d: Delivery, reply: RobotMessage) -> None: ...

        def flush_acks(self) -> None: ...

        def free_slots(self) -> int: ...
