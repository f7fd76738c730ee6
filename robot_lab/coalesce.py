"""Group commit: pipelines that many threads send to one Redis at once go out as one round trip.

A ``robot-lab worker --in-flight N`` process runs hundreds of tasks on threads of their own,
and each task makes the same few round trips (its claim, its step journal, its result). Each
round trip through redis-py costs far more interpreter time than its commands: a pool
checkout with a health check, retry and observability wrappers, a ``sendall`` and a read,
every one of them a GIL hand-off. At a thousand tasks in hand that fixed cost was about a
third of the worker's CPU (bench/concurrency.py).

:func:`execute` sends a non-transactional pipeline the way ``pipe.execute()`` does, except
that pipelines submitted by other threads while a round trip is on the wire wait and then go
out *together*, in one pipeline on one connection: the classic group commit (a database's
log writer, ioredis' auto-pipelining). There is no thread of its own: the first caller
leads, sends what is queued, hands each caller its own replies, and passes the lead to the
next waiting caller. A lone caller sends its own pipeline at once, as before.

Why this keeps every guarantee:

- each caller's commands stay in order and contiguous (Redis runs the merged pipeline in
  order, and other clients' commands may interleave between any two anyway: a
  non-transactional pipeline was never atomic);
- a caller returns only once its own replies are read, so a write is on the server when
  ``execute`` returns, exactly as before (the step journal's durability);
- a command's error reply goes to its caller only (``raise_on_error`` as redis-py); a
  connection error reaches every caller of that round trip, as each one's own round trip
  would have failed (redis-py's retry policy applies to the merged pipeline once).

Only plain clients coalesce: a Redis Cluster client (keys in other slots) and anything that
is not a ``redis.Redis`` run the pipeline themselves.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

# One merged round trip carries at most this many commands; callers beyond it wait for the
# next one (a reply buffer of a few thousand commands stays small).
MAX_COMMANDS = 4_000
# A waiting caller looks every this many seconds whether nobody leads (the caller woken to
# lead the next round trip was interrupted before it could): then it leads itself.
LEAD_CHECK = 1.0


class RoundTripInterrupted(Exception):
    """Raised to the other callers of a merged round trip that an exception of the leading
    thread's own (a signal's, a job timeout's) cut short: whether their commands ran is
    unknown, as after a lost connection. It is a ``redis.ConnectionError`` (see
    :func:`_interrupted`), so their outage handling applies."""


class _Call:
    """One caller's pipeline waiting for a round trip."""

    __slots__ = ("commands", "replies", "error", "_bell")

    def __init__(self, commands: list[tuple[Any, Any]]) -> None:
        self.commands = commands
        self.replies: list[Any] | None = None
        self.error: BaseException | None = None
        # A held lock as a one-shot bell (far cheaper than an Event's Condition): released
        # when the replies (or the error) are in, or the lead is free; the caller then looks.
        self._bell = threading.Lock()
        self._bell.acquire()

    def ring(self) -> None:
        try:
            self._bell.release()
        except RuntimeError:  # rung already, not heard yet: once is enough
            pass

    def wait(self, timeout: float) -> None:
        self._bell.acquire(timeout=timeout)


class Coalescer:
    """The group commit of one client (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._waiting: list[_Call] = []
        self._leading = False
        self.round_trips = 0  # merged round trips sent (tests and benches read these)
        self.calls = 0

    def lead_alone(self) -> bool:
        """Take the lead when nobody leads and nobody waits (True): the caller then sends its
        own command as a plain one and must :meth:`release` the lead after. Callers that come
        meanwhile queue and go out together after it, as behind any leader."""
        with self._lock:
            if self._leading or self._waiting:
                return False
            self._leading = True
            return True

    def release(self) -> None:
        """Free the lead taken by :meth:`lead_alone` and wake the next waiting caller."""
        with self._lock:
            self._leading = False
            nxt = self._waiting[0] if self._waiting else None
        if nxt is not None:
            nxt.ring()

    def execute(self, pipe: Any, raise_on_error: bool = True) -> list[Any]:
        """``pipe.execute(raise_on_error)`` for a non-transactional pipeline of ``client``."""
        call = _Call(list(pipe.command_stack))
        pipe.reset()
        if not call.commands:
            return []
        with self._lock:
            self._waiting.append(call)
            self.calls += 1
        try:
            while call.replies is None and call.error is None:
                if not self._try_lead():
                    call.wait(LEAD_CHECK)
        except BaseException:  # interrupted while waiting: out of the queue, the lead passed on
            self._abandon(call)
            raise
        if call.error is not None:
            raise call.error
        replies = call.replies or []
        if raise_on_error:
            _raise_first_error(pipe, call.commands, replies)
        return replies

    def _try_lead(self) -> bool:
        """Lead one round trip unless another caller does: send what is waiting (up to
        ``MAX_COMMANDS``, in arrival order), hand out the replies, free the lead and wake the
        next waiting caller to take it."""
        with self._lock:
            if self._leading:
                return False
            self._leading = True
        batch: list[_Call] = []
        try:
            with self._lock:
                size = 0
                while self._waiting and (not batch or size + len(self._waiting[0].commands) <= MAX_COMMANDS):
                    call = self._waiting.pop(0)
                    batch.append(call)
                    size += len(call.commands)
            merged = self.client.pipeline(transaction=False)
            for call in batch:
                merged.command_stack.extend(call.commands)
            try:
                replies = merged.execute(raise_on_error=False)
            except Exception as exc:  # the round trip failed: every caller of it sees the error
                for call in batch:
                    call.error = exc
            except BaseException as exc:  # this thread's own (a signal): the others' fate is unknown
                for call in batch:
                    call.error = _interrupted(exc)
                raise
            else:
                self.round_trips += 1
                at = 0
                for call in batch:
                    call.replies = replies[at:at + len(call.commands)]
                    at += len(call.commands)
        finally:
            with self._lock:
                self._leading = False
                nxt = self._waiting[0] if self._waiting else None
            for call in batch:
                call.ring()
            if nxt is not None:
                nxt.ring()
        return True

    def _abandon(self, call: _Call) -> None:
        with self._lock:
            if call in self._waiting:
                self._waiting.remove(call)
            nxt = self._waiting[0] if self._waiting and not self._leading else None
        if nxt is not None:
            nxt.ring()


def _interrupted(exc: BaseException) -> Exception:
    global _Interrupted
    if _Interrupted is None:
        from redis.exceptions import ConnectionError as RedisConnectionError  # lazy: start-up time

        _Interrupted = type("RoundTripInterrupted", (RoundTripInterrupted, RedisConnectionError), {})
    return _Interrupted(f"the round trip was interrupted in another thread ({type(exc).__name__})")


_Interrupted: Any = None


def _raise_first_error(pipe: Any, commands: list[tuple[Any, Any]], replies: list[Any]) -> None:
    """redis-py's ``raise_first_error``: the first error reply, annotated with its command."""
    from redis.exceptions import ResponseError  # lazy: start-up time

    for i, reply in enumerate(replies):
        if isinstance(reply, ResponseError):
            pipe.annotate_exception(reply, i + 1, commands[i][0])
            raise reply


_coalescers: weakref.WeakKeyDictionary[Any, Coalescer] = weakref.WeakKeyDictionary()
_coalescers_lock = threading.Lock()


def coalescer_for(client: Any) -> Coalescer | None:
    """The client's group commit, or None where pipelines must run on their own (a Redis
    Cluster client, an object that is not a ``redis.Redis``)."""
    try:
        return _coalescers[client]
    except (KeyError, TypeError):
        pass
    import redis  # lazy: start-up time

    if not isinstance(client, redis.Redis):
        return None
    with _coalescers_lock:
        found = _coalescers.get(client)
        if found is None:
            found = _coalescers[client] = Coalescer(client)
    return found


def execute(pipe: Any, raise_on_error: bool = True, *, client: Any = None) -> list[Any]:
    """Send the non-transactional pipeline ``pipe`` (of ``client``, default the pipeline's
    own client) together with other threads' pipelines to the same client, or on its own
    where that client cannot coalesce."""
    target = client if client is not None else _client_of(pipe)
    coalescer = coalescer_for(target) if target is not None else None
    if coalescer is None or getattr(pipe, "transaction", False) or getattr(pipe, "watching", False):
        return pipe.execute(raise_on_error=raise_on_error)
    return coalescer.execute(pipe, raise_on_error=raise_on_error)


def call(client: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``getattr(client, name)(*args, **kwargs)`` -- one command (``"get"``, ``"set"``,
    ``"hgetall"``...) -- riding the round trip other threads have on the wire, if any.

    The reply, and an error reply's exception (the very exception the command raises on its
    own, not annotated as a pipeline's), are the command's own; a connection error reaches
    this caller as it would have on its own round trip. A lone caller (nobody leads, nobody
    waits: an ``--in-flight 1`` worker, a script) takes the lead and sends the plain command:
    a one-command pipeline costs more interpreter time than the command (about 140 us against
    90), with nothing to share the round trip with. Where the client cannot coalesce it runs
    as a plain command."""
    coalescer = coalescer_for(client)
    if coalescer is None:
        return getattr(client, name)(*args, **kwargs)
    if coalescer.lead_alone():
        try:
            return getattr(client, name)(*args, **kwargs)
        finally:
            coalescer.release()
    pipe = pipeline(client)
    getattr(pipe, name)(*args, **kwargs)
    reply = coalescer.execute(pipe, raise_on_error=False)[0]
    if isinstance(reply, Exception):
        raise reply
    return reply


def script(lua: Any, keys: list[Any], args: list[Any], *, client: Any = None) -> Any:
    """``lua(keys=keys, args=args)`` (a ``register_script`` Script, on ``client``, default
    the one it was registered with) riding the round trip other threads have on the wire, as
    :func:`call`: the merged pipeline carries its ``EVALSHA``. A server that does not know the
    script answers NOSCRIPT without running it; the script then runs on its own, which loads
    it (redis-py's own recovery), so a flushed script cache costs one extra round trip."""
    target = client if client is not None else lua.registered_client
    coalescer = coalescer_for(target)
    if coalescer is None:
        return lua(keys=keys, args=args, client=target)
    if coalescer.lead_alone():
        try:
            return lua(keys=keys, args=args, client=target)
        finally:
            coalescer.release()
    pipe = pipeline(target)
    pipe.evalsha(lua.sha, len(keys), *keys, *args)
    reply = coalescer.execute(pipe, raise_on_error=False)[0]
    if isinstance(reply, Exception):
        from redis.exceptions import NoScriptError  # lazy: start-up time

        if isinstance(reply, NoScriptError):
            return lua(keys=keys, args=args, client=target)
        raise reply
    return reply


def _client_of(pipe: Any) -> Any:
    return getattr(pipe, "_robot_lab_client", None)


def pipeline(client: Any) -> Any:
    """``client.pipeline(transaction=False)``, remembering its client for :func:`execute`."""
    pipe = client.pipeline(transaction=False)
    try:
        pipe._robot_lab_client = client
    except AttributeError:  # a pipeline class with slots: execute() then runs it on its own
        pass
    return pipe
