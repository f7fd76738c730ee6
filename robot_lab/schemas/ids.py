"""Time-sortable unique ids (UUIDv7) for envelopes, results and runs.

Python 3.11 has no ``uuid.uuid7``; the layout below follows RFC 9562 section 5.7 so ids
sort by creation time as strings and stay unique across processes without coordination.
"""

from __future__ import annotations

import threading
import time
import uuid

from robot_lab.randomness import random_bytes

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48-bit Unix milliseconds, then a 12-bit counter, then random bits."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter = (_counter + 1) & 0xFFF
            if _counter == 0:  # counter overflow inside one millisecond: borrow the next one
                ms += 1
        else:
            _counter = int.from_bytes(random_bytes(2), "big") & 0x3FF
        _last_ms = ms
        counter = _counter
    rand = int.from_bytes(random_bytes(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand
    return uuid.UUID(int=value)


def new_id() -> str:
    """A new time-sortable id as a canonical UUID string."""
    return str(uuid7())
