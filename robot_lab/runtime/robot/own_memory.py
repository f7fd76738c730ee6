"""A run's active memory when it names none: the robot's own, opened on first use.

Most runs never touch memory, and opening it means the memory store, redis-py (which pulls
in opentelemetry) and, in embedded mode, fakeredis (numpy, lupa): a third of a second of a
fresh process's first run. :class:`OwnMemory` stands in for ``robot.memory`` until a tool,
hook or learning reaches for it; then it is that very Memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robot_lab.memory.writer import writing_as

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts


class OwnMemory:
    """``robot.memory``, opened when first used. ``writing_as`` needs no store: the robot's
    own memory writes as the robot anyway (``Memory.for_robot``)."""

    def __init__(self, robot: RobotParts) -> None:
        self._robot = robot
        self.scope = f"robot:{robot.name}"

    @property
    def opened(self) -> Any:
        return self._robot.memory

    def writing_as(self, name: str) -> Any:
        return writing_as(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._robot.memory, name)

    def __getitem__(self, key: str) -> Any:
        return self._robot.memory[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._robot.memory[key] = value

    def __delitem__(self, key: str) -> None:
        del self._robot.memory[key]

    def __contains__(self, key: object) -> bool:
        return key in self._robot.memory

    def __iter__(self) -> Any:
        return iter(self._robot.memory)

    def __len__(self) -> int:
        return len(self._robot.memory)

    def __repr__(self) -> str:
        return f"<OwnMemory {self.scope} (opened on first use)>"


def own_memory(robot: RobotParts) -> Any:
    """The robot's memory if it is open already, else a stand-in that opens it when used."""
    return robot.memory if robot._learning.memory_opened else OwnMemory(robot)
