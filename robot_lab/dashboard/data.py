"""What the dashboard shows, read from Redis with the same readers as ``robot-lab status``,
plus the per-run detail (DAG, task states, results) and the live feed of one run: its
event stream (``robot_lab:run:<id>:events``) and its memory change stream
(``robot_lab:mem:run:<id>:changes``), read with XREAD from cursors the browser keeps.

Everything here is synchronous redis-py; the server runs it in worker threads.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab.bus import Bus
from robot_lab.errors import BusError, ConfigurationError
from robot_lab.keys import Keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.human_input import answer, pending
from robot_lab.network.run_state import RUN_FINISHED as FINISHED_RUN  # the run statuses that end a run (the page reads it)
from robot_lab.schemas.messages import RobotResult
from robot_lab.text.strings import as_str as _s
from robot_lab.workers.fleet_status import collect_status, recent_runs

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient


class DashboardData:
    """The dashboard's reads and its actions over one connection."""

    def __init__(self, connection: RedisClient, keys: Keys) -> None:
        self.r = connection
        self.keys = keys

    # --- overview -------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        status = collect_status(self.r, self.keys)
        return {
            "prefix": status["prefix"], "redis": status["redis"], "time": status["time"],
            "robots": status["robots"], "workers": status["workers"], "active": status["runs"],
            "recent": recent_runs(self.r, self.keys, limit=20), "problems": status["problems"],
            "failed_tasks": self.failed_tasks(),
        }

    def failed_tasks(self, runs: int = 50, limit: int = 50) -> list[dict[str, Any]]:
        """The failed tasks of the latest ``runs`` runs (newest run first) with their error:
        what an operator looks at first. Two pipelined reads whatever the number of runs."""
        ids = [_s(r) for r in self.r.zrevrange(self.keys.runs_index(), 0, runs - 1)]
        pipe = self.r.pipeline(transaction=False)
        for run_id in ids:
            key = self.keys.run(run_id)
            pipe.hmget(key, "network", "status", "finished_at")
            pipe.hgetall(key + ":state")
        replies = pipe.execute()
        failed: list[tuple[str, list[Any], str]] = []
        for i, run_id in enumerate(ids):
            meta, states = replies[2 * i], replies[2 * i + 1]
            failed += [(run_id, meta, _s(t)) for t, v in states.items() if _s(v) == "failed"]
        failed = failed[:limit]
        pipe = self.r.pipeline(transaction=False)
        for run_id, _, task in failed:
            key = self.keys.run(run_id)
            pipe.hget(key + ":results", task)
            pipe.hget(key + ":graph", task)
            pipe.hget(key + ":attempts", task)
        replies = pipe.execute() if failed else []
        out = []
        for i, (run_id, meta, task) in enumerate(failed):
            result, node, attempts = (_json(v) for v in replies[3 * i:3 * i + 3])
            out.append({"run_id": run_id, "network": _s(meta[0] or b""), "run_status": _s(meta[1] or b""),
                        "finished_at": float(meta[2]) if meta[2] else None, "task": task,
                        "robot": (node or {}).get("robot"), "attempt": attempts or 0,
                        "error": (result or {}).get("error")})
        return out

    def dead_letters(self, robot: str, limit: int = 50) -> list[dict[str, Any]]:
        letters = Bus(redis=self.r, keys=self.keys).dead_letters(robot, limit)
        return [_letter(letter) for letter in letters]

    # --- one run --------------------------------------------------------------------------
    def run(self, run_id: str) -> dict[str, Any]:
        key = self.keys.run(run_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(key)
        for suffix in (":graph", ":state", ":results", ":attempts", ":inputs"):
            pipe.hgetall(key + suffix)
        meta, graph, states, results, attempts, inputs = pipe.execute()
        if not meta:
            raise ConfigurationError(f"no run {run_id!r} (finished runs expire)")
        meta = {_s(k): _s(v) for k, v in meta.items()}
        order = json.loads(meta.get("order") or "[]")
        graph_d = {_s(k): json.loads(v) for k, v in graph.items()}
        tasks = []
        for name in order or sorted(graph_d):
            node = graph_d.get(name, {})
            result = _json(results.get(name.encode()) or results.get(name))
            tasks.append({
                "name": name, "robot": node.get("robot"), "deps": node.get("deps", []),
                "optional": bool(node.get("optional")), "activators": node.get("activators", []),
                "input": _s(inputs[name.encode()]) if name.encode() in inputs else None,
                "state": _s(states.get(name.encode(), b"pending")),
                "attempt": int(_s(attempts.get(name.encode(), b"0")) or 0),
                "reply": _reply(results.get(name.encode()) or results.get(name)),
                "error": (result or {}).get("error"),
                "input_tokens": (result or {}).get("input_tokens", 0),
                "output_tokens": (result or {}).get("output_tokens", 0), "cost": (result or {}).get("cost", 0.0),
                "duration": (result or {}).get("duration"),
            })
        return {
            "run_id": run_id, "network": meta.get("network"), "status": meta.get("status"),
            "message": _json(meta.get("message")), "created_at": float(meta.get("created_at") or 0),
            "finished_at": float(meta["finished_at"]) if meta.get("finished_at") else None,
            "traceparent": meta.get("traceparent"), "tasks": tasks,
        }

    def feed(self, run_id: str, events_after: str, memory_after: str, block_ms: int
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, str]:
        """New run events and memory changes after the two cursors (blocking up to
        ``block_ms`` when there are none); returns them with the advanced cursors."""
        events_key = self.keys.run_events(run_id)
        memory_key = self.keys.memory_changes(f"run:{run_id}")
        raw = self.r.xread({events_key: events_after, memory_key: memory_after}, count=500,
                           block=block_ms or None)
        events: list[dict[str, Any]] = []
        changes: list[dict[str, Any]] = []
        for stream, entries in raw or []:
            for entry_id, fields in entries:
                if _s(stream) == events_key:
                    events_after = _s(entry_id)
                    events.append(json.loads(fields[b"event"]))
                else:
                    memory_after = _s(entry_id)
                    changes.append(json.loads(fields[b"c"]))
        return events, changes, events_after, memory_after

    # --- actions (only when the server has a token) ---------------------------------------
    def cancel(self, run_id: str) -> str:
        return Coordinator(connection=self.r, keys=self.keys).cancel(run_id, "cancelled from the dashboard")

    def rerun(self, run_id: str, task: str) -> str:

        status = Coordinator(connection=self.r, keys=self.keys).rerun(run_id, task)
        if status != "ok":
            raise ConfigurationError(f"cannot re-run task {task!r} of run {run_id}: {status}")
        return status

    def pending(self) -> list[dict[str, Any]]:
        """Input requests waiting for an answer (docs/durable.md)."""
        return [r.to_dict() for r in pending(self.r, self.keys)]

    def answer(self, request_id: str, text: str | None, approve: bool | None, by: str) -> dict[str, Any]:
        return answer(request_id, text, approve=approve, by=by, connection=self.r, keys=self.keys).to_dict()

    def replay(self, robot: str, ids: list[str] | None) -> list[str]:
        try:
            return Bus(redis=self.r, keys=self.keys).replay_dead_letters(robot, ids or None)
        except BusError as exc:
            raise ConfigurationError(str(exc)) from exc


def _reply(raw: Any) -> str | None:
    """A recorded result's reply: ``RobotResult.reply`` is computed from its output, not
    stored, so the page read none and showed the task's streamed text (every attempt's)."""
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=RobotResult).reply
    except msgspec.DecodeError:
        return None


def _json(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return _s(raw)


def _letter(letter: Any) -> dict[str, Any]:
    """A dead letter for the page: its fields, and the message content when the envelope parses."""
    content = letter.envelope
    try:
        content = json.loads(letter.envelope).get("content", letter.envelope)
    except (ValueError, AttributeError):
        pass
    text = content if isinstance(content, str) else json.dumps(content)
    return {"dlq_id": letter.dlq_id, "robot": letter.robot, "reason": letter.reason, "error": letter.error,
            "deliveries": letter.deliveries, "message_id": letter.message_id, "failed_at": letter.failed_at,
            "content": text[:500]}
