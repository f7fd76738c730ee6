"""Write commands folded into one script call: one command for redis-py to queue, pack and
parse in place of a dozen.

``robot-lab worker`` writes rq's start records of a network task job (the execution, the
started registry, the job's status: about ten commands) with the task's claim, and its finish
records (status, result, registries, counters: about sixteen) with the task's result. Through
a redis-py pipeline each command costs its own interpreter time to queue, pack, check and
parse -- about 6 us, so ~0.15 ms a task, at a thousand tasks in hand a tenth of the worker's
CPU (bench/concurrency.py) -- while Redis runs them in microseconds. :func:`queue` puts them
in the pipeline as one ``EVALSHA`` of :data:`APPLY`, which runs each command in order.

What stays the same: the commands are rq's own, built by rq's own functions (only how they
travel changes); each runs with ``redis.pcall``, so a failing one does not stop the rest, as
in a non-transactional pipeline, and the call answers an error reply naming the first failure
(the caller sees an exception, as it would for that command). Every key a command names is
declared in the call's KEYS (a command's first argument; every argument of DEL, UNLINK,
EXISTS, TOUCH), as EVAL's contract asks and servers that enforce it (Dragonfly) require. Only
where every key lives on one server: on Redis Cluster, where rq's keys sit in other slots,
the callers send these writes in a pipeline of their own.

A server that has not cached the script yet (first use, a restart, ``SCRIPT FLUSH``) answers
``NOSCRIPT`` without running any of them: :func:`missing` tells the caller (which then writes
them the plain way) and loads the script for the next call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

APPLY = """
local i, n, failed = 1, #ARGV, nil
while i <= n do
  local count = tonumber(ARGV[i])
  local reply = redis.pcall(unpack(ARGV, i + 1, i + count))
  if failed == nil and type(reply) == 'table' and reply.err then failed = reply.err end
  i = i + count + 1
end
if failed then return redis.error_reply(failed) end
return 1
"""
APPLY_SHA = hashlib.sha1(APPLY.encode()).hexdigest()


_ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "TOUCH"})  # commands whose every argument is a key


def flatten(commands: Iterable[tuple[tuple[Any, ...], Any]]) -> tuple[list[Any], list[Any]]:
    """The keys the commands name, and ``[len(args), *args]`` of each ``(args, options)`` of
    a pipeline's command stack."""
    keys: list[Any] = []
    flat: list[Any] = []
    for args, _options in commands:
        flat.append(len(args))
        flat.extend(args)
        if len(args) > 1:
            name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            if name.upper() in _ALL_KEYS:
                keys.extend(args[1:])
            else:
                keys.append(args[1])
    return keys, flat


def queue(pipe: Any, commands: list[tuple[tuple[Any, ...], Any]]) -> bool:
    """Queue ``commands`` (a pipeline's ``command_stack`` entries, writes only) on ``pipe``
    as one script call; False (nothing queued) when there are none."""
    if not commands:
        return False
    keys, flat = flatten(commands)
    pipe.evalsha(APPLY_SHA, len(keys), *keys, *flat)
    return True


def missing(reply: Any, connection: Any) -> bool:
    """Whether ``reply`` (the folded call's) says the server lacked the script: then none of
    the commands ran, and the script is loaded on ``connection`` for the next call."""
    from redis.exceptions import NoScriptError  # lazy: start-up time

    if not isinstance(reply, NoScriptError):
        return False
    try:
        connection.script_load(APPLY)
    except Exception:  # noqa: BLE001 - the caller's plain writes follow; a later call loads it
        pass
    return True
