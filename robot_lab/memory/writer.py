"""Who a memory write is attributed to in this context (thread or asyncio task).

Apart from :mod:`.store` so a run can attribute writes to its robot without importing the
store (and redis-py) when it never touches memory (robot_lab/runtime/robot/own_memory.py).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

writer_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("robot_lab_memory_writer", default=None)


class Writer:
    """The writer recorded on one memory's changes: this context's override, else the
    memory's own name. A callable of its own, not a closure over the Memory, so the memory's
    parts hold no reference back to it: a dropped Memory is freed at once by reference
    counting instead of waiting, with everything it holds, for the cyclic GC (a worker
    builds two per network task)."""

    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name

    def __call__(self) -> str | None:
        override = writer_override.get()
        return override if override is not None else self.name


@contextmanager
def writing_as(name: str) -> Iterator[None]:
    """Attribute writes in this context to ``name`` without touching other contexts."""
    token = writer_override.set(name)
    try:
        yield
    finally:
        writer_override.reset(token)
