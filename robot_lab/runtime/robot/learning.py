"""What a robot learns: lessons kept in its inherent memory (scope ``robot:<name>`` in
Redis, so every worker of the robot shares them) and prepended to each later request.
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

from robot_lab.runtime.rails.hooks import LearnHookContext, call_point_hook, hook_scope, run_hooks
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts


_UNREAD = object()


class Learning:
    """One robot's learnings and its inherent memory (opened lazily).

    It points back at its robot through a weak reference: a Robot and its Learning are then
    no reference cycle, so a robot dropped after its run (a worker builds one per network
    task) is freed at once by reference counting, with its messages and config, instead of
    piling up for the cyclic GC (whose every collection walks a busy worker's garbage). The robot owns its Learning; nothing else keeps
    one, so the robot is alive whenever this is used."""

    def __init__(self, robot: RobotParts) -> None:
        self._robot = weakref.ref(robot)
        self.learnings: list[str] = []
        self._memory: Any = None
        self._preloaded: Any = _UNREAD

    def preload(self, memory: Any, raw: bytes | str | None) -> None:
        """Use ``memory`` as the inherent memory, and ``raw`` -- its stored ``learnings``
        field, read by the caller in a round trip it makes anyway (a network task's start)
        -- for the next :meth:`load` instead of a read of its own."""
        self._memory = memory
        self._preloaded = raw

    def discard_preload(self) -> None:
        """Forget a preloaded value no :meth:`load` used (a run that never got as far): the
        next run of this robot must read afresh, not what was stored then."""
        self._preloaded = _UNREAD

    @property
    def robot(self) -> RobotParts:
        robot = self._robot()
        assert robot is not None, "a Learning is only used through its robot"
        return robot

    @property
    def memory(self) -> Any:
        if self._memory is None:
            from robot_lab.memory.store import Memory  # lazy: start-up time

            self._memory = Memory.for_robot(self.robot.name)
        return self._memory

    @property
    def memory_opened(self) -> bool:
        return self._memory is not None

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()

    def learn(self, text: str) -> None:
        """The Ruby gem's dedupe: an existing entry contained in the new text is replaced; a
        new text contained in an existing one is dropped. Runs inside the ``learn`` hooks."""
        text = (text or "").strip()
        if not text:
            return
        robot = self.robot
        ctx = LearnHookContext(robot=robot, text=text, learnings_before=tuple(self.learnings))

        def core() -> bool:
            current = self.load()
            if any(text in existing for existing in current):
                return False
            updated = [existing for existing in current if existing not in text] + [text]
            self.learnings = updated
            self.memory.set("learnings", updated)
            ctx.stored = True
            call_point_hook("on_learn", ctx)
            return True

        with hook_scope(robot.hooks):
            run_hooks("learn", ctx, core)

    def _nothing_stored(self) -> bool:
        """True when no store exists that could hold learnings: embedded mode before its
        in-process server starts, with no memory opened and nothing learned here."""
        if self._memory is not None or self.learnings:
            return False

        # lazy: start-up time -- robot_lab.connection imports redis-py; not imported yet
        # means no embedded store exists yet either
        connection = sys.modules.get("robot_lab.connection")
        return bool(get_settings().embedded and getattr(connection, "_embedded_server", None) is None)

    def load(self) -> list[str]:
        if self._nothing_stored():
            return []  # no embedded store exists yet, so nothing can have been learned
        if self._preloaded is not _UNREAD:
            from robot_lab.memory.values import Values  # lazy: start-up time

            stored, self._preloaded = Values.value("learnings", self._preloaded), _UNREAD
        else:
            stored = self.memory.get("learnings")
        self.learnings = list(stored or self.learnings)
        return self.learnings

    def inject_may_block(self, message: str | None) -> bool:
        """Whether :meth:`inject` would read the store (a Redis round trip): ``arun`` then runs
        it in a thread; otherwise (no message, a preloaded value, no store yet) in place,
        because a hop to a thread costs more than the work (bench/robot_floor.py)."""
        return message is not None and not self._nothing_stored() and self._preloaded is _UNREAD

    def inject(self, message: str | None) -> str | None:
        """The request with ``LEARNINGS FROM PREVIOUS RUNS`` in front of it, if any."""
        if message is None:
            return None
        learnings = self.load()
        if not learnings:
            return message
        return "LEARNINGS FROM PREVIOUS RUNS:\n" + "\n".join(f"- {item}" for item in learnings) + "\n\n" + message
