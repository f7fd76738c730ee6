"""Importable helpers for network tests (routers, tools) -- workers import them by path."""

from __future__ import annotations

from typing import Any


def fan(robot: Any, n: int, name: str) -> Any:
    """A network of ``n`` parallel tasks ``t0``..``t<n-1>`` on ``robot``."""
    from robot_lab.network.dsl import create_network  # (workers import this module by path)

    net = create_network(name)
    with net.parallel("all"):
        for i in range(n):
            net.task(f"t{i}", robot)
    return net


def route_by_last_word(result: Any, routes: list[str]) -> str | None:
    """A Python router: the last word of the reply, if it is a route."""
    words = (result.reply or "").split()
    return words[-1] if words and words[-1] in routes else None
