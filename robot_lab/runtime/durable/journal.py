"""The step journal of one durable scope: step index -> what that step returned.

A durable run's model calls and tool calls are numbered in the order the tool loop makes
them. Each finished step is written to one Redis hash (field = the index, value = JSON with
the step's kind, name, request hash and result), expiring with the scope's owner (a network
run's keys, a bus message's reply record). Running the scope again reads the hash once and
answers finished steps from it, so a crash or a park costs only the step that was in flight.

The request hash is what makes replay safe: a step is answered from the journal only when
the request that would be made now (model, messages, offered tools; tool name, arguments)
hashes to the recorded one. Anything else is a divergence -- never silently replayed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from robot_lab import coalesce
from robot_lab.errors import StepDivergence
from robot_lab.logging import get_logger

log = get_logger("robot_lab.durable")


def request_hash(request: Any) -> str:
    """A stable digest of a step's request (JSON with sorted keys)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Journal:
    """One scope's steps in the Redis hash ``key`` (read once, written per step)."""

    def __init__(self, redis: Any, key: str, ttl: int, *, scope: str, on_divergence: str = "error",
                 preloaded: Mapping[Any, Any] | None = None, defer_last: bool = False) -> None:
        self.redis = redis
        self.key = key
        self.ttl = int(ttl)
        self.scope = scope
        self.on_divergence = on_divergence
        self._steps: dict[int, dict[str, Any]] | None = None if preloaded is None else self._parse(preloaded)
        # The owner sends a step written with ``last=True`` with its own next round trip (see
        # :meth:`write`): a network task, with its result.
        self.defer_last = defer_last
        self.unwritten: dict[str, str] = {}  # field -> JSON of steps recorded here, not yet in Redis

    @staticmethod
    def _parse(raw: Mapping[Any, Any]) -> dict[int, dict[str, Any]]:
        return {int(_decode(k)): json.loads(v) for k, v in raw.items() if _decode(k).isdigit()}

    def steps(self) -> dict[int, dict[str, Any]]:
        """Every recorded step (one HGETALL -- or what the owner read with another round trip,
        ``preloaded`` -- then cached for the run)."""
        if self._steps is None:
            self._steps = self._parse(coalesce.call(self.redis, "hgetall", self.key))  # with other runs' reads
        return self._steps

    def replay(self, index: int, kind: str, name: str, digest: str) -> dict[str, Any] | None:
        """The record of step ``index`` if one exists for this very request; None when the
        step has not run (or, under ``on_divergence=live``, when it diverged: the journal
        from there on is dropped). A divergence otherwise raises :class:`StepDivergence`."""
        record = self.steps().get(index)
        if record is None:
            return None
        if record.get("kind") == kind and record.get("name") == name and record.get("hash") == digest:
            return record
        what = "tool call" if kind == "tool" else "model request"
        detail = (f"step {index} of {self.scope} was a {record.get('kind')} step {record.get('name')!r}; "
                  f"now it is a {kind} step {name!r}" if (record.get("kind"), record.get("name")) != (kind, name)
                  else f"the {what} of step {index} ({kind} {name!r}) of {self.scope} changed since it was "
                       "recorded (prompt, model, offered tools or arguments)")
        if self.on_divergence == "live":
            log.warning("durable.diverged", scope=self.scope, step=index, detail=detail)
            self.drop_from(index)
            return None
        raise StepDivergence(f"{detail}; set durable.on_divergence=live to continue live from this step")

    def write(self, index: int, record: dict[str, Any], *, last: bool = False) -> None:
        """Record step ``index`` (and refresh the hash's expiry), on the server when this
        returns -- except a ``last`` step (a model reply asking for no tool: the run ends
        unless its loop goes on) in a ``defer_last`` journal: it stays :attr:`unwritten` and
        goes out with the owner's next round trip (:meth:`queue_unwritten`; a network task's
        result, one round trip per task less), or with the next step's write, or
        :meth:`flush` before the next step runs. Nothing runs between such a step and that
        round trip that a replay would protect (no tool, no other step), so a crash between
        them costs this one model call again, as a crash just before a write does."""
        value = json.dumps(record, separators=(",", ":"), default=str)
        self.unwritten[str(index)] = value
        if not (last and self.defer_last):
            self.flush()
        self.steps()[index] = record

    def queue_unwritten(self, pipe: Any) -> int:
        """Queue the unwritten steps' write on ``pipe`` (the owner's round trip); returns how
        many commands it queued (0: none unwritten). Call :meth:`sent` once they are written."""
        if not self.unwritten:
            return 0
        pipe.hset(self.key, mapping=dict(self.unwritten))
        pipe.expire(self.key, self.ttl)
        return 2

    def sent(self) -> None:
        """The unwritten steps queued by :meth:`queue_unwritten` are on the server."""
        self.unwritten.clear()

    def flush(self) -> None:
        """Write the unwritten steps now, in a round trip of their own (none unwritten: no-op)."""
        if not self.unwritten:
            return
        pipe = coalesce.pipeline(self.redis)
        self.queue_unwritten(pipe)
        coalesce.execute(pipe)  # with other runs' steps; on the server when this returns
        self.sent()

    def drop_from(self, index: int) -> None:
        """Forget steps ``index`` and later (a diverged scope continues live)."""
        later = [str(i) for i in self.steps() if i >= index]
        for field in later:
            self.unwritten.pop(field, None)
        if later:
            self.redis.hdel(self.key, *later)
        for i in [i for i in self.steps() if i >= index]:
            del self.steps()[i]
