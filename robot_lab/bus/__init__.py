"""The bus: robot inboxes as Redis Streams (the Ruby gem's TypedBus + BusPoller, distributed).

``Bus`` publishes RobotMessage envelopes, sends replies, makes requests and inspects inboxes
and dead letters; ``BusPoller`` consumes one robot's inbox as one consumer of its group.
See docs/bus.md.
"""

from robot_lab.bus.core import Bus
from robot_lab.bus.names import check_robot_name
from robot_lab.bus.requests import REPLY_PREFIX
from robot_lab.bus.delivery import Delivery
from robot_lab.bus.poller import BusPoller, default_consumer_name, flatten_content
from robot_lab.bus.records import DeadLetter, InboxStats, OutboxEntry
from robot_lab.bus.keyring import Keyring

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
