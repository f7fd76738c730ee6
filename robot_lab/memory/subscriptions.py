"""Subscriptions: register callbacks on a scope's listener, and take them off again.

Where delivery starts is decided here: ``since_version`` replays from that version, a
durable ``subscriber_id`` resumes from its cursor (recorded at once on first use, so a crash
before the first delivery doesn't skip anything), and neither means "from now on" (the
listener's head). The listener (:mod:`.listener`) then delivers every change once, in
version order, on its thread.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.memory.feed import Feed
from robot_lab.memory.listener import Listener, Subscription


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """The Ruby gem's glob: ``*`` -> ``.*``, ``?`` -> ``.``, everything else literal, anchored."""
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return re.compile("^" + "".join(parts) + "$", re.S)


class Subscriptions:
    """The subscriptions of one Memory, kept on its :class:`Feed`'s listener."""

    def __init__(self, feed: Feed, scope: str) -> None:
        self.feed = feed
        self.scope = scope

    def add(self, names: frozenset[str] | None, pattern: re.Pattern[str] | None,
            callback: Callable[..., Any] | None, subscriber_id: str | None, since_version: int | None,
            transactional: bool) -> str:
        if callback is None or not callable(callback):
            raise ConfigurationError(f"memory {self.scope!r}: subscribe needs a callback")
        if since_version is not None and (not isinstance(since_version, int) or since_version < 0):
            raise ConfigurationError(f"memory {self.scope!r}: since_version must be an int >= 0, got {since_version!r}")
        sub = Subscription(id=str(uuid.uuid4()), callback=callback, version=0, keys=names,
                           pattern=pattern, subscriber_id=subscriber_id, transactional=transactional)
        changelog = self.feed.changelog

        def register(listener: Listener) -> None:
            if since_version is not None:
                sub.version = since_version
            elif subscriber_id is not None:
                sub.version = changelog.start_cursor(subscriber_id, listener.head)
            else:
                sub.version = listener.head
            listener.add_subscription(sub)

        self.feed.with_listener(register)
        return sub.id

    def remove(self, subscription_id: str) -> bool:
        listener = self.feed.listener
        if listener is None:
            return False
        with listener.dispatch_lock:
            return listener.subscriptions.pop(subscription_id, None) is not None

    def remove_keys(self, keys: frozenset[str]) -> int:
        """Drop ``keys`` from every key subscription; returns how many subscriptions ended."""
        listener = self.feed.listener
        if listener is None:
            return 0
        ended = 0
        with listener.dispatch_lock:
            for sub_id, sub in list(listener.subscriptions.items()):
                if sub.keys is not None and sub.keys & keys:
                    sub.keys = sub.keys - keys
                    if not sub.keys:
                        del listener.subscriptions[sub_id]
                        ended += 1
        return ended

    def covers(self, key: str) -> bool:
        listener = self.feed.listener
        return bool(listener) and any(s.matches(key) for s in list(listener.subscriptions.values()))
