"""Conversation history in Redis, so whichever worker gets the next message of a
conversation continues it (robot_lab keeps it in the live chat object of one process).

One string key per (robot, conversation) holding the message list as JSON, with a TTL that
each save renews. Saves happen after a run completes; the bus serialises a conversation
(one message at a time across consumers), so last-writer-wins cannot lose a turn there.
"""

from __future__ import annotations

from typing import Any

import msgspec

from robot_lab.keys import Keys, default_keys

DEFAULT_TTL = 7 * 86_400


class ConversationStore:
    def __init__(self, redis: Any = None, keys: Keys | None = None, ttl: int = DEFAULT_TTL) -> None:
        if redis is None:
            from robot_lab.connection import get_redis

            redis = get_redis()
        self.redis = redis
        self.keys = keys or default_keys()
        self.ttl = ttl

    def load(self, robot: str, conversation_id: str) -> list[dict[str, Any]]:
        raw = self.redis.get(self.keys.conversation(robot, conversation_id))
        return list(msgspec.json.decode(raw)) if raw else []

    def save(self, robot: str, conversation_id: str, messages: list[dict[str, Any]]) -> None:
        self.redis.set(self.keys.conversation(robot, conversation_id), msgspec.json.encode(messages), ex=self.ttl)

    def delete(self, robot: str, conversation_id: str) -> None:
        self.redis.delete(self.keys.conversation(robot, conversation_id))
