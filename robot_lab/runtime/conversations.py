"""Conversation history in Redis, so whichever worker gets the next message of a
conversation continues it (robot_lab keeps it in the live chat object of one process).

One string key per (robot, conversation) holding the message list as JSON, with a TTL that
each save renews (setting ``conversation_ttl``, 7 days), capped to a window of the latest
``conversation_max_messages`` messages (setting, 200) and ``conversation_max_bytes`` bytes of
JSON (setting, 1 MiB; a single turn larger than that is kept alone): the oldest turns are dropped whole, starting the window at a user message so
that no tool result is kept without the call that asked for it. Saves happen after a run completes; the bus serialises a conversation
(one message at a time across consumers), so last-writer-wins cannot lose a turn there.
"""

from __future__ import annotations

from typing import Any

import msgspec

from robot_lab import coalesce
from robot_lab.keys import Keys, default_keys
from robot_lab.settings import get_settings



class ConversationStore:
    def __init__(self, redis: Any = None, keys: Keys | None = None, ttl: int | None = None,
                 max_messages: int | None = None, max_bytes: int | None = None) -> None:
        if redis is None:
            from robot_lab.connection import get_redis  # lazy: start-up time

            redis = get_redis()

        settings = get_settings()
        self.redis = redis
        self.keys = keys or default_keys()
        self.ttl = int(settings.conversation_ttl if ttl is None else ttl)
        self.max_messages = int(settings.conversation_max_messages if max_messages is None else max_messages)
        self.max_bytes = int(settings.conversation_max_bytes if max_bytes is None else max_bytes)

    def _kept(self, messages: list[dict[str, Any]]) -> bytes:
        return msgspec.json.encode(cap_bytes(window(messages, self.max_messages), self.max_bytes))

    # load and save ride other threads' round trips (robot_lab.coalesce): an in-flight worker
    # runs hundreds of conversations at once, each one GET before its run and one SET after
    def load(self, robot: str, conversation_id: str) -> list[dict[str, Any]]:
        raw = coalesce.call(self.redis, "get", self.keys.conversation(robot, conversation_id))
        return self.decode(raw)

    @staticmethod
    def decode(raw: bytes | str | None) -> list[dict[str, Any]]:
        """A stored history (the value of ``Keys.conversation``) as a message list."""
        return list(msgspec.json.decode(raw)) if raw else []

    def save(self, robot: str, conversation_id: str, messages: list[dict[str, Any]]) -> None:
        coalesce.call(self.redis, "set", self.keys.conversation(robot, conversation_id), self._kept(messages),
                      ex=self.ttl)

    async def aload(self, robot: str, conversation_id: str) -> list[dict[str, Any]]:
        """:meth:`load` on the asyncio twin of this store's client (``Robot.arun``)."""
        raw = await self._aredis().get(self.keys.conversation(robot, conversation_id))
        return list(msgspec.json.decode(raw)) if raw else []

    async def asave(self, robot: str, conversation_id: str, messages: list[dict[str, Any]]) -> None:
        """:meth:`save` on the asyncio twin of this store's client."""
        await self._aredis().set(self.keys.conversation(robot, conversation_id), self._kept(messages), ex=self.ttl)

    def _aredis(self) -> Any:
        from robot_lab.connection import async_client_for  # lazy: start-up time

        return async_client_for(self.redis)

    def delete(self, robot: str, conversation_id: str) -> None:
        self.redis.delete(self.keys.conversation(robot, conversation_id))


def window(messages: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The latest ``limit`` messages, starting at a user message (whole turns); when the
    window holds no user message, from the last one. ``limit <= 0``: all of them."""
    if limit <= 0 or len(messages) <= limit:
        return messages
    start = len(messages) - limit
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    inside = [i for i in users if i >= start]
    if inside:
        return messages[inside[0]:]
    return messages[users[-1]:] if users else messages[start:]


def cap_bytes(messages: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The latest whole turns (each starting at a user message) whose JSON fits in ``limit``
    bytes; the last turn alone when even it does not fit. ``limit <= 0``: all of them."""
    if limit <= 0:
        return messages
    sizes = [len(msgspec.json.encode(m)) + 1 for m in messages]  # + the separating comma
    total = sum(sizes) + 1
    if total <= limit:
        return messages
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user" and i > 0]
    dropped = 0
    for start in starts:
        total -= sum(sizes[dropped:start])
        dropped = start
        if total <= limit:
            break
    return messages[dropped:]
