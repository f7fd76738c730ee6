"""Spawning robots at run time, for a generic worker pool to serve.

the Ruby gem's ``spawn`` creates a robot on the same in-process bus. Across processes there is
no process to put it in, so a spawn *publishes* the new robot: its spec goes to the Redis
robot registry (inheriting model and provider from the spawning robot, as robot_lab does),
its bus inbox is registered, and its name joins ``<prefix>:robots:spawned``. Any
``robot-lab worker --spawned`` notices it within a second and starts serving its inbox.
The caller gets a :class:`SpawnedRobot` handle to talk to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.keys import default_keys
from robot_lab.runtime.registry import check_importable, publish_specs
from robot_lab.schemas.messages import RobotMessage, RobotSpec

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient


class SpawnedRobot:
    """A handle on a robot served by some worker: send to it, or ask and wait."""

    def __init__(self, spec: RobotSpec, *, bus: Any) -> None:
        self.spec = spec
        self.name = spec.name
        self.bus = bus

    def send(self, content: str | Mapping[str, Any], **kwargs: Any) -> RobotMessage:
        return self.bus.publish(self.name, content, **kwargs)

    def ask(self, content: str | Mapping[str, Any], *, timeout: float = 60.0, **kwargs: Any) -> str:
        """The robot's reply text (AwaitTimeout when no worker answers in time)."""
        reply = self.bus.request(self.name, content, timeout=timeout, **kwargs)
        return reply.content if isinstance(reply.content, str) else str(reply.content)

    def __repr__(self) -> str:
        return f"<SpawnedRobot {self.name}>"


def spawn(spec: RobotSpec, *, connection: RedisClient | None = None, keys: Any = None) -> SpawnedRobot:
    """Publish ``spec`` for the generic worker pool and return a handle on it."""
    from robot_lab.bus import Bus  # lazy: start-up time
    from robot_lab.connection import get_redis  # lazy: start-up time

    check_importable(spec)  # an unimportable tool fails here, not later on a worker
    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    publish_specs([spec], connection=connection, keys=keys)
    bus = Bus(connection, keys=keys)
    bus.register(spec.name)
    connection.sadd(keys.spawned(), spec.name)
    return SpawnedRobot(spec, bus=bus)
