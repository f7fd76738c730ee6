"""The state one bus consumer keeps, shared by the parts of BusPoller.

BusPoller is assembled from one mixin per concern -- :mod:`.intake` (reading entries into
held deliveries), :mod:`.handling` (running them in conversation order and resolving them:
ack, nack, dead letter), :mod:`.reclaim` (heartbeats, the reclaim sweep, hand-back) -- and
:mod:`.poller` (handler styles, the loop); it owns a :class:`~.parking.Parking`
and, as the handler of ``serve()``, a :class:`~.responder.Responder`. This class names the
attributes they share, settings included, and sets each of them once, in ``__init__``
(BusPoller's constructor), so each of those modules can be read (and type-checked) alone.
It is not in poller.py because those modules need it and poller.py imports them: no import
cycles (tests/test_layering.py), not even for types.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from robot_lab.bus.core import Bus
from robot_lab.bus.keyring import VERIFY_MODES, verify_mode
from robot_lab.bus.names import check_robot_name
from robot_lab.bus.parking import Parking
from robot_lab.bus.stalls import sweep_interval
from robot_lab.connection import is_cluster_client
from robot_lab.errors import BusError

if TYPE_CHECKING:
    from robot_lab.bus.delivery import Delivery
    from robot_lab.connection import RedisClient
    from robot_lab.schemas import RobotMessage
    from robot_lab.threads import PoolShare


def default_consumer_name() -> str:
    """The default consumer name of this process in a group: its host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class PollerState:
    """The attributes of one consumer of one robot's inbox, each set (and typed) once here."""

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
        # who and where
        self.robot: str = check_robot_name(robot)  # the robot, also the consumer group's name
        self.bus: Bus = bus or Bus(redis)
        self.redis: RedisClient = self.bus.redis
        cfg = self.bus.settings
        self.consumer: str = consumer or default_consumer_name()  # this consumer's name in the group
        self.inbox: str = self.bus.keys.inbox(robot)  # the robot's inbox stream key
        self.dlq: str = self.bus.keys.dlq(robot)  # its dead-letter stream key
        # the keys the conversation scripts take after the inbox (READ/ACQUIRE/COMPLETE/DEAD_LETTER)
        self.conv_keys: list[str] = [self.inbox, self.bus.keys.conversation_queue(robot),
                                     self.bus.keys.conversation_heads(robot)]
        self._cluster: bool = is_cluster_client(self.redis)  # a RedisCluster client: no scripts in pipelines

        # settings
        self.batch_size: int = int(batch_size or cfg.batch_size)
        self.block_ms: int = int(cfg.block_ms if block_ms is None else block_ms)
        # seconds an entry may sit idle before another consumer takes it
        self.visibility_timeout: float = float(visibility_timeout or cfg.visibility_timeout)
        self.max_deliveries: int = int(max_deliveries or cfg.max_deliveries)
        self.retry_delay: float = float(cfg.retry_delay if retry_delay is None else retry_delay)
        # seconds between reclaim sweeps
        self.claim_interval: float = float(claim_interval or sweep_interval(self.visibility_timeout))
        self.heartbeat_interval: float = max(0.02, self.visibility_timeout / 3)
        self.in_flight: int = max(1, int(in_flight or 1))  # handlers running at once (1: inline, in the polling thread)
        # entries held at most (read, retrying or waiting for their conversation)
        self.max_held: int = max(self.batch_size * 4, self.in_flight * 2)
        self._vis_ms: int = max(1, int(self.visibility_timeout * 1000))
        self._register: bool = register  # create the inbox and group when missing
        # signature check of each entry: off | warn | require (bus/keyring.py)
        self.verify: str = verify or verify_mode(robot)
        if self.verify not in VERIFY_MODES:
            raise BusError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {self.verify!r}")
        self.parking: Parking = Parking(self.bus, self.robot)  # its served messages that wait for a person

        # what this consumer holds and does
        # robot_lab: an incoming message never runs the LLM by default
        self._handler: Callable[[Delivery], Any] = lambda d: None
        self._auto_ack: bool = True
        self._held: OrderedDict[str, Delivery] = OrderedDict()  # entry id -> delivery, unresolved
        self._lost: set[str] = set()  # held entries another consumer has reclaimed (from the heartbeat)
        self._running: dict[str, Delivery] = {}  # entry id -> delivery whose handler runs now
        self._run_since: dict[str, float] = {}  # entry id -> when its handler started on the pool
        # guards _held, _running, _ack_queue, counts (handler threads resolve)
        self._lock: threading.RLock = threading.RLock()
        self._wake: threading.Event = threading.Event()  # set when a handler thread finishes (a slot is free)
        self._pool: PoolShare | None = None  # the handler threads (in_flight > 1)
        self._handler_errors: list[BaseException] = []  # Redis errors of handler threads, raised by poll()
        self._finished: int = 0  # entries the pool finished since poll() last counted them
        self._waiting_ready: int = 0  # entries the last round could have started but for a free slot
        self._cursor: str = "0-0"  # newest entry id seen (the blocking wait starts after it)
        self._drained: bool = False  # the last read got fewer entries than asked for
        self._ack_queue: list[str] = []  # acks to send with the next round trip
        self._started: bool = False
        self._last_claim: float = 0.0
        self._last_beat: float = 0.0
        self._thread: threading.Thread | None = None  # the polling thread of start()
        self._stop_event: threading.Event = threading.Event()
        self.counts: dict[str, int] = {"acked": 0, "dead": 0, "retried": 0, "reclaimed": 0}
        self.key_problems: list[str] = []  # this robot's keys of the wrong type (bus/key_types.py)
        self._orphans_due: bool = False  # a round failed on such a key: read this consumer's pending back

    if TYPE_CHECKING:  # implemented by the other mixins of BusPoller
        def _intake(self, entry: str, fields: Any, deliveries: int, cid: str | bytes | None, *,
                    from_script: bool = False) -> int: ...

        def _delivery_counts(self, ids: list[str]) -> dict[str, int]: ...

        def _dead_letter(self, d: Delivery, reason: str, error: BaseException | str, *, notify: Any = None,
                         extra: Any = None, report: bool = True) -> None: ...

        def _send_reply(self, d: Delivery, reply: RobotMessage) -> None: ...

        def flush_acks(self) -> None: ...

        def free_slots(self) -> int: ...
