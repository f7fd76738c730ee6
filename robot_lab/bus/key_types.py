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

__all__ = ["expected_types", "is_wrong_type", "wrong_typed", "wrong_typed_keys"]

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

