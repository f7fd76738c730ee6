"""Who a memory write is attributed to in this context (thread or asyncio task).

Apart from :mod:`.store` so a run can attribute writes to its robot without importing the
store (and redis-py) when it never touches memory (robot_lab/runtime/robot/own_memory.py).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

writer_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("robot_lab_memory_writer", default=None)


@contextmanager
def writing_as(name: str) -> Iterator[None]:
    """Attribute writes in this context to ``name`` without touching other contexts."""
    token = writer_override.set(name)
    try:
        yield
    finally:
        writer_override.reset(token)
