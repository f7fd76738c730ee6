"""An inbox's figures (``robot-lab bus stats``, ``robot-lab status``) read without the Bus.

A :class:`~robot_lab.bus.core.Bus` brings the envelope schemas (msgspec), signing and the
observability hooks; reading an inbox's length, groups, lag and DLQ size needs none of them,
and ``robot-lab status`` (whose CPU is compared with ``rq info``'s, bench/startup.py) loaded
them only for this. ``Bus.stats`` is this function.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import redis as _redis

from robot_lab.keys import Keys
from robot_lab.text.strings import as_str as _s


@dataclass(frozen=True, slots=True)
class InboxStats:
    """One row of ``robot-lab bus stats`` (from XINFO STREAM / GROUPS and the DLQ length)."""

    robot: str
    length: int
    groups: int
    consumers: int
    pending: int
    lag: int | None
    dlq: int
    last_entry: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dlq_size(redis: Any, keys: Keys, robot: str) -> int:
    """The length of ``robot``'s dead-letter stream (0 for a wrong-typed key: reported by
    bus/key_types.py)."""
    try:
        return int(redis.xlen(keys.dlq(robot)))
    except _redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        return 0


def inbox_stats(redis: Any, keys: Keys, robots: Iterable[str]) -> list[InboxStats]:
    """Per robot: length, groups, consumers, pending, lag and DLQ size (XINFO)."""
    rows: list[InboxStats] = []
    for robot in robots:
        inbox = keys.inbox(robot)
        try:
            info = redis.xinfo_stream(inbox)
            groups = redis.xinfo_groups(inbox)
        except _redis.ResponseError:  # no such key
            rows.append(InboxStats(robot, 0, 0, 0, 0, None, dlq_size(redis, keys, robot)))
            continue
        lags = [g.get("lag") for g in groups]
        lag = None if any(v is None for v in lags) else sum(int(v) for v in lags)
        rows.append(
            InboxStats(
                robot=robot,
                length=int(info.get("length", 0)),
                groups=len(groups),
                consumers=sum(int(g.get("consumers", 0)) for g in groups),
                pending=sum(int(g.get("pending", 0)) for g in groups),
                lag=lag,
                dlq=dlq_size(redis, keys, robot),
                last_entry=_s(info.get("last-generated-id")),
            )
        )
    return rows
