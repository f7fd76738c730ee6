"""The bus: robot inboxes as Redis Streams (the Ruby gem's TypedBus + BusPoller, distributed).

``Bus`` publishes RobotMessage envelopes, sends replies, makes requests and inspects inboxes
and dead letters; ``BusPoller`` consumes one robot's inbox as one consumer of its group.
See docs/bus.md.

The names below are exported lazily (PEP 562), as the package's own are: a reader of inbox
statistics (``robot-lab status``, ``send``) imports :mod:`.core` and not the poller's modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_lab.lazy import lazy_exports

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Bus": "robot_lab.bus.core",
    "check_robot_name": "robot_lab.bus.names",
    "REPLY_PREFIX": "robot_lab.bus.requests",
    "Delivery": "robot_lab.bus.delivery",
    "BusPoller": "robot_lab.bus.poller",
    "default_consumer_name": "robot_lab.bus.state",
    "flatten_content": "robot_lab.bus.responder",
    "DeadLetter": "robot_lab.bus.records",
    "InboxStats": "robot_lab.bus.inbox_stats",
    "OutboxEntry": "robot_lab.bus.records",
    "Keyring": "robot_lab.bus.keyring",
}

__all__ = [
    "REPLY_PREFIX",
    "Bus",
    "BusPoller",
    "DeadLetter",
    "Delivery",
    "InboxStats",
    "Keyring",
    "OutboxEntry",
    "check_robot_name",
    "default_consumer_name",
    "flatten_content",
]


__getattr__, __dir__ = lazy_exports("robot_lab.bus", _EXPORTS, globals(), __all__)


if TYPE_CHECKING:  # pragma: no cover
    from robot_lab.bus.core import Bus  # noqa: F401
    from robot_lab.bus.delivery import Delivery  # noqa: F401
    from robot_lab.bus.keyring import Keyring  # noqa: F401
    from robot_lab.bus.names import check_robot_name  # noqa: F401
    from robot_lab.bus.poller import BusPoller  # noqa: F401
    from robot_lab.bus.state import default_consumer_name  # noqa: F401
    from robot_lab.bus.responder import flatten_content  # noqa: F401
    from robot_lab.bus.inbox_stats import InboxStats  # noqa: F401
    from robot_lab.bus.records import DeadLetter, OutboxEntry  # noqa: F401
    from robot_lab.bus.requests import REPLY_PREFIX  # noqa: F401
