"""The robot as the runtime's lowest pieces see it: a hook context, a tool and the run
context hold the Robot running them, and read nothing on it but its name (hooks and tools
may use the rest). A module of its own, importing nothing, so that ``rails.hooks`` and
``tools`` -- which :mod:`.parts` imports -- can name it without an import cycle.
"""

from __future__ import annotations

from typing import Protocol


class NamedRobot(Protocol):
    """A robot by its name (the Robot; a worker's RobotPool)."""

    @property
    def name(self) -> str: ...
