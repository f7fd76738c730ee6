"""Reading, replaying and purging a robot's dead letters (``<inbox>:dlq``): the DLQ half of
:class:`robot_lab.bus.core.Bus`, used by ``robot-lab dlq`` and by tests without a poller.
Consumers write dead letters (bus/handling.py); this module only reads and moves them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING


from robot_lab.bus.records import DeadLetter
from robot_lab.errors import BusError
from robot_lab.keys import Keys
from robot_lab.text.strings import as_str as _s

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient


class DeadLetters:
    """Dead-letter operations of a Bus (which sets ``redis`` and ``keys``)."""

    redis: RedisClient
    keys: Keys

    def dead_letters(self, robot: str, count: int = 100, *, start: str = "-") -> list[DeadLetter]:
        """Oldest first."""
        entries = self.redis.xrange(self.keys.dlq(robot), min=start, max="+", count=count)
        return [DeadLetter.from_entry(i, f) for i, f in entries]

    def dead_letter(self, robot: str, dlq_id: str) -> DeadLetter:
        entries = self.redis.xrange(self.keys.dlq(robot), min=dlq_id, max=dlq_id, count=1)
        if not entries:
            raise BusError(f"robot {robot!r} has no dead letter {dlq_id!r}")
        return DeadLetter.from_entry(*entries[0])

    def dlq_size(self, robot: str) -> int:
        from robot_lab.bus.inbox_stats import dlq_size  # lazy: start-up time

        return dlq_size(self.redis, self.keys, robot)

    def replay_dead_letters(self, robot: str, ids: Iterable[str] | None = None) -> list[str]:
        """Put dead letters back on the inbox as new entries (fresh delivery count) and
        remove them from the DLQ, each in one MULTI. Returns the new entry ids."""
        letters = self._select_letters(robot, ids)
        inbox, dlq = self.keys.inbox(robot), self.keys.dlq(robot)
        if letters and not self.redis.exists(inbox):
            raise BusError(f"Unknown channel: {robot!r} has no inbox to replay into")
        new_ids: list[str] = []
        for letter in letters:
            pipe = self.redis.pipeline(transaction=True)
            pipe.xadd(inbox, {"envelope": letter.envelope})
            pipe.xdel(dlq, letter.dlq_id)
            entry, _ = pipe.execute()
            new_ids.append(_s(entry))
        return new_ids

    def purge_dead_letters(self, robot: str, ids: Iterable[str] | None = None) -> int:
        """Delete the given dead letters, or all of them. Returns how many went."""
        dlq = self.keys.dlq(robot)
        if ids is None:
            n = int(self.redis.xlen(dlq))
            self.redis.delete(dlq)
            return n
        wanted = list(ids)
        return int(self.redis.xdel(dlq, *wanted)) if wanted else 0

    def _select_letters(self, robot: str, ids: Iterable[str] | None) -> list[DeadLetter]:
        if ids is None:
            letters: list[DeadLetter] = []
            start = "-"
            while True:
                page = self.dead_letters(robot, 500, start=start)
                letters.extend(page)
                if len(page) < 500:
                    return letters
                start = "(" + page[-1].dlq_id
        return [self.dead_letter(robot, i) for i in ids]
