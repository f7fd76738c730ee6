"""bytes -> str for values read back from Redis (redis-py returns bytes unless told not to)."""

from __future__ import annotations

from typing import Any


def as_str(value: Any) -> str:
    """``value`` as text: bytes decoded as UTF-8, ``None`` as ``""``, anything else ``str()``."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else str(value)


__all__ = ["as_str"]
