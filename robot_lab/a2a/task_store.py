"""A2A task records in Redis: what each task runs and, once it is over, how it ended.

One hash per task (``Keys.a2a_task``): the agent and kind it belongs to, its A2A context,
the caller it belongs to, the first message, and what it runs -- for a robot the id of the
bus message and the private stream its reply goes to, for a network the run id. The live
part of a task (working, its streamed text, its reply) is never copied here: every A2A
process reads it from the bus reply stream or the run's event stream (:mod:`.tasks`). Only
the end is recorded, once (``HSETNX final``), so a cancel and a completion racing in two
processes agree on one outcome.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from google.protobuf.json_format import MessageToDict, ParseDict

from a2a.types.a2a_pb2 import Message, Task

from robot_lab.keys import Keys

FIELDS = ("agent", "kind", "target", "context_id", "owner", "created_at", "message_id", "reply_stream",
          "run_id", "history", "final")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


@dataclass
class TaskRecord:
    """One A2A task as stored; ``kind`` is ``robot`` or ``network``."""

    id: str
    agent: str
    kind: str
    target: str
    context_id: str
    owner: str = ""
    created_at: float = field(default_factory=time.time)
    message_id: str = ""  # robot: the bus message's id
    reply_stream: str = ""  # robot: the stream name its reply goes to
    run_id: str = ""  # network: the run
    history: list[dict[str, Any]] = field(default_factory=list)  # A2A Messages (JSON form)
    final: dict[str, Any] | None = None  # the terminal Task (JSON form), once over

    @property
    def conversation_id(self) -> str:
        """The robot conversation this task's context is, on the bus: the A2A context *of
        its caller* (``a2a:<caller, %-quoted>:<contextId>``). Contexts are scoped per caller
        (A2A 1.0 section 13.1), so a caller that names another caller's contextId reaches a
        conversation of its own -- never the other's history or parked question."""
        return f"a2a:{quote(self.owner, safe='')}:{self.context_id}"

    def history_messages(self) -> list[Message]:
        return [ParseDict(m, Message(), ignore_unknown_fields=True) for m in self.history]

    def final_task(self) -> Task | None:
        return ParseDict(self.final, Task(), ignore_unknown_fields=True) if self.final else None


class TaskStore:
    """Task records on the bus's asyncio Redis client; records expire ``ttl`` seconds after creation
    (and again after they end), like finished runs."""

    def __init__(self, bus: Any, keys: Keys, *, ttl: int) -> None:
        self.bus = bus
        self.keys = keys
        self.ttl = ttl

    @property
    def r(self) -> Any:
        """The bus's asyncio client of the running loop (one per loop)."""
        return self.bus.aredis

    async def create(self, record: TaskRecord, *, reply_key: str | None = None) -> None:
        """Write the record; with ``reply_key``, also create the (empty) stream a robot's
        reply goes to, in the same round trip, with the record's TTL."""
        key = self.keys.a2a_task(record.id)
        mapping = {
            "agent": record.agent, "kind": record.kind, "target": record.target,
            "context_id": record.context_id, "owner": record.owner, "created_at": repr(record.created_at),
            "message_id": record.message_id, "reply_stream": record.reply_stream, "run_id": record.run_id,
            "history": json.dumps(record.history),
        }
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping=mapping)
        pipe.expire(key, self.ttl)
        if reply_key is not None:
            pipe.xgroup_create(reply_key, "_", id="$", mkstream=True)
            pipe.expire(reply_key, self.ttl)
        await pipe.execute()
        index = self._index(record.agent, record.owner)  # its own round trip: another slot in a cluster
        now_ms = int(record.created_at * 1000)
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(index, {record.id: now_ms})
        pipe.zremrangebyscore(index, 0, now_ms - self.ttl * 1000)  # records gone by now
        pipe.expire(index, self.ttl)
        await pipe.execute()

    def _index(self, agent: str, owner: str) -> str:
        return self.keys.a2a_tasks(agent, quote(owner, safe=""))

    async def listed(self, agent: str, owner: str, limit: int) -> list[TaskRecord]:
        """The records of the ``limit`` newest tasks ``owner`` started on ``agent`` (from its
        index: no scan), newest first; ones whose record expired are left out."""
        ids = [_s(i) for i in await self.r.zrevrange(self._index(agent, owner), 0, limit - 1)]
        pipe = self.r.pipeline(transaction=False)
        for task_id in ids:
            pipe.hmget(self.keys.a2a_task(task_id), *FIELDS)
        records = [self._record(task_id, raw) for task_id, raw in zip(ids, await pipe.execute())]
        return [r for r in records if r is not None and r.owner == owner and r.agent == agent]

    async def update_source(self, task_id: str, **fields: str) -> None:
        """Record what the task runs once it was started (the run id of a submitted run)."""
        await self.r.hset(self.keys.a2a_task(task_id), mapping=fields)

    async def get(self, task_id: str) -> TaskRecord | None:
        return self._record(task_id, await self.r.hmget(self.keys.a2a_task(task_id), *FIELDS))

    @staticmethod
    def _record(task_id: str, raw: list[Any]) -> TaskRecord | None:
        if raw[0] is None:
            return None
        values = dict(zip(FIELDS, (_s(v) for v in raw)))
        return TaskRecord(
            id=task_id, agent=values["agent"], kind=values["kind"], target=values["target"],
            context_id=values["context_id"], owner=values["owner"],
            created_at=float(values["created_at"] or 0), message_id=values["message_id"],
            reply_stream=values["reply_stream"], run_id=values["run_id"],
            history=json.loads(values["history"] or "[]"),
            final=json.loads(values["final"]) if values["final"] else None,
        )

    async def final(self, task_id: str) -> Task | None:
        raw = await self.r.hget(self.keys.a2a_task(task_id), "final")
        return ParseDict(json.loads(raw), Task(), ignore_unknown_fields=True) if raw else None

    async def finish(self, task: Task) -> Task:
        """Record ``task`` as the task's end unless another process recorded one first;
        returns the end that stands."""
        key = self.keys.a2a_task(task.id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(key, "final", json.dumps(MessageToDict(task)))
        pipe.hget(key, "final")
        pipe.expire(key, self.ttl)
        _, stored, _ = await pipe.execute()
        return ParseDict(json.loads(stored), Task(), ignore_unknown_fields=True)
