"""Random bytes for ids (run and message ids, trace ids) without a system call each.

os.urandom releases the interpreter lock around its getrandom() call; in a worker with a
thousand busy threads each release hands the lock to another thread and this one queues
to get it back (three such calls per network task, for its ids). So random
bytes come from one buffer refilled 4 KiB at a time: the same kernel randomness, each byte
used once, one system call per ~400 ids. A forked child drops the buffer it inherited,
or parent and child would hand out the same bytes.
"""

from __future__ import annotations

import os
import threading

_POOL_SIZE = 4096
_pool = b""
_pool_at = 0
_pool_lock = threading.Lock()


def random_bytes(n: int) -> bytes:
    """``n`` bytes from ``os.urandom``, through the shared buffer (see the module docstring)."""
    global _pool, _pool_at
    with _pool_lock:
        if _pool_at + n > len(_pool):
            _pool, _pool_at = os.urandom(max(_POOL_SIZE, n)), 0
        out = _pool[_pool_at:_pool_at + n]
        _pool_at += n
    return out


def _drop_pool() -> None:
    global _pool, _pool_at, _pool_lock
    _pool, _pool_at, _pool_lock = b"", 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_pool)
