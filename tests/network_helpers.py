"""Importable helpers for network tests (routers, tools) -- workers import them by path."""

from __future__ import annotations

from typing import Any


def route_by_last_word(result: Any, routes: list[str]) -> str | None:
    """A Python router: the last word of the reply, if it is a route."""
    words = (result.reply or "").split()
    return words[-1] if words and words[-1] in routes else None
