"""Which of a robot's bus keys hold the wrong kind of value, named key by key.

A key of the wrong type (a stream where the conversation heads hash should be, a string
where the inbox should be) makes every bus script of that robot fail with Redis's
``WRONGTYPE`` error, which names no key. The poller, ``robot-lab status`` and the worker's
health check ask :func:`wrong_typed_keys` which key it is, so an operator is told what to
delete (docs/operations.md, "Failure modes"); the poller keeps polling meanwhile and serves
again as soon as the key is fixed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_lab.keys import Keys, is_wrong_type, wrong_typed

__all__ = ["expected_types", "is_wrong_type", "shared_expected_types", "wrong_typed", "wrong_typed_keys"]

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient


def expected_types(keys: Keys, robot: str) -> dict[str, str]:
    """Each bus key of ``robot`` the poller's scripts use, and the type it must have."""
    return {keys.inbox(robot): "stream", keys.dlq(robot): "stream", keys.conversation_queue(robot): "zset",
            keys.conversation_heads(robot): "hash"}


def wrong_typed_keys(connection: RedisClient, keys: Keys, robot: str) -> list[str]:
    """``"<key> is a <type>, not a <expected>"`` for each of ``robot``'s bus keys of the wrong
    type (a missing key is fine: the scripts create it)."""
    return wrong_typed(connection, expected_types(keys, robot))


def shared_expected_types(keys: Keys) -> dict[str, str]:
    """The shared indexes any worker's Redis user may write (``robot-lab acl``:
    SHARED_FOR_WORKERS) that ``robot-lab status`` and ``robot-lab pending`` read, and their
    types: one set to a string by hand would otherwise fail those commands whole with a
    WRONGTYPE that names no key."""
    return {keys.registry(): "set", keys.workers(): "zset", keys.runs_index(): "zset", keys.runs_active(): "set",
            keys.inputs_pending(): "zset", keys.inputs_deadlines(): "zset"}
