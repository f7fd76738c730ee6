"""Network tasks that wait for a person: park, answer, resume, time out.

A task whose robot needs input (``ask_user``, an approval, ``InputRequired``) *parks*: the
job records the input request (runtime/durable), and the PARK transition moves the task
from ``running`` to ``waiting``, deletes its lease and emits ``hitl.requested`` -- then the
rq job returns. A waiting task holds no thread, no in-flight slot, no lease, no
``max_concurrent_robots`` slot and no budget reservation (the job released its holds).

An answer (``robot-lab answer``, ``RunHandle.answer``, the dashboard, a bus ``answer``
envelope) is written once to the request (HSETNX), then the RESUME transition moves the task
back to ``ready`` with ``hitl.resolved`` and enqueues a new attempt, which replays the task's
step journal up to the parked step and runs it with the answer. A crash between the two is
repaired by :func:`sweep` (a waiting task whose request is answered is resumed), which also
answers requests whose ``input_timeout`` passed with their default (or times them out, and
the resumed task fails with a clear error).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from robot_lab.bus.parking import wake_parked
from robot_lab.connection import get_redis
from robot_lab.errors import ConfigurationError, InputRequired
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.network import transitions
from robot_lab.network.enqueue import enqueue_jobs
from robot_lab.network.run_state import RUN_TTL, TERMINAL, RunStore
from robot_lab.runtime.durable.journal import Journal
from robot_lab.inputs import Answer, InputRequest, InputStore, approves
from robot_lab.network.graphs import graph_for
from robot_lab.runtime.durable.scopes import DurableScope
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.network.human_input")

# ARGV: run_id, task, job_id, request_json; LEASE (KEYS[13]) the task's lease
PARK = transitions._LIB + r"""
local t, job = ARGV[2], ARGV[3]
if st(t) ~= 'running' or redis.call('HGET', JOBS, t) ~= job then return 0 end
set_st(t, 'waiting')
redis.call('DEL', LEASE)
emit('hitl.requested', t, graph(t).robot, ARGV[4])
local out = advance()  -- its max_concurrent slot is free: a ready task may go
table.insert(out, 1, 1)
return out
"""

# ARGV: run_id, task, data_json -- a waiting task goes back to ready and is queued again
RESUME = transitions._LIB + r"""
local t = ARGV[2]
if redis.call('HGET', R, 'status') ~= 'running' then return {'cancelled'} end
if st(t) ~= 'waiting' then return {'not-waiting'} end
set_st(t, 'ready')
-- a resumed attempt is not a lost worker: RECLAIM counts attempts less resumes
redis.call('HINCRBY', ATTEMPTS, 'resumed:' .. t, 1)
emit('hitl.resolved', t, graph(t).robot, ARGV[3])
local out = advance()
table.insert(out, 1, 'ok')
return out
"""


def task_scope(store: RunStore, task: str, robot: str, events: Any, preloaded: Any = None) -> DurableScope:
    """The durable scope of one network task: its journal lives with the run (same hash
    tag, same TTL; ``preloaded``: read with the claim), its step events go to the run's
    stream through ``events`` (the task's DeltaBuffer: in order after the text streamed
    before them, with its next event write -- no round trip of their own)."""
    scope_id = f"run:{store.run_id}:{task}"
    journal = Journal(store.r, store.keys.run_steps(store.run_id, task), RUN_TTL, scope=scope_id,
                      on_divergence=get_settings().durable.on_divergence, preloaded=preloaded,
                      defer_last=True)  # the last step goes out with the result (RunStore.complete)
    owner = {"kind": "task", "run_id": store.run_id, "task": task, "robot": robot}
    return DurableScope(id=scope_id, journal=journal, inputs=InputStore(store.r, store.keys), owner=owner,
                        emit=events.owe, ttl=RUN_TTL)


def park(store: RunStore, task: str, job_id: str, exc: InputRequired) -> dict[str, Any]:
    """The task's robot asked for input: move it to ``waiting`` (the job then returns)."""
    request = {k: v for k, v in (exc.request or {"question": exc.question}).items() if v is not None}
    raw = store._eval(PARK, task, job_id, json.dumps(request, default=str), leases=(task,), critical=True)
    parked = isinstance(raw, list)  # else 0: not running, or another attempt's
    if parked and len(raw) > 1:  # the tasks its freed max_concurrent slot let through
        items = [tuple(v.decode() if isinstance(v, bytes) else str(v) for v in raw[i:i + 3])
                 for i in range(1, len(raw), 3)]
        enqueue_jobs(store.r, store.keys, store.run_id, items, graph_for(store))  # type: ignore[arg-type]
    log.info("task.waiting", request=request.get("id"), parked=bool(parked))
    return {"task": task, "status": "waiting" if parked else "stale", "request": request.get("id")}


def resume(connection: RedisClient, keys: Keys, run_id: str, task: str, data: dict[str, Any]) -> str:
    """Move a waiting task back to the queue (a new attempt, counted as a resume: it does not
    bring the task closer to ``ROBOT_LAB_TASK_MAX_ATTEMPTS`` lost workers); ``ok``,
    ``not-waiting`` or ``cancelled``."""
    store = RunStore(connection, keys, run_id)
    raw = store._eval(RESUME, task, json.dumps(data, default=str))
    status = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
    if status == "ok":
        items = [tuple(v.decode() if isinstance(v, bytes) else str(v) for v in raw[i:i + 3])
                 for i in range(1, len(raw), 3)]
        enqueue_jobs(connection, keys, run_id, items, graph_for(store))  # type: ignore[arg-type]
    return status


def answer(request_id: str, text: str | None = None, *, approve: bool | None = None, by: str = "unknown",
           connection: RedisClient | None = None, keys: Keys | None = None, timed_out: bool = False,
           reply_to: str | None = None) -> InputRequest:
    """Answer a request once, and resume what waits for it. ``approve=True/False`` answers
    an approval (``text``: the reason of a denial). ``reply_to``: where a served message's
    reply goes instead of where it was sent from (the A2A task that answered it). Raises ConfigurationError for an unknown
    request, one already answered, one whose run is no longer running, or an answer the
    request cannot take (InvalidAnswer: :func:`robot_lab.inputs.check_answer`)."""
    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    inputs = InputStore(connection, keys)
    found = inputs.unanswered(request_id)
    owner = found.owner
    if owner.get("kind") == "task" and _task_gone(connection, keys, owner):
        inputs.unlist(request_id)
        status = RunStore(connection, keys, owner["run_id"]).status()
        raise ConfigurationError(f"input request {request_id}: run {owner['run_id']} is {status}, "
                                 f"its task {owner['task']!r} no longer waits")
    if found.request.get("kind") == "approval" and approve is None and text is not None:
        approve = approves(text)
    inputs.give(found, Answer(text=text or "", approved=approve, by=by, timed_out=timed_out))
    _resume_owner(connection, keys, found, reply_to=reply_to)
    return found


def _resume_owner(connection: RedisClient, keys: Keys, found: InputRequest, reply_to: str | None = None) -> None:
    owner = found.owner
    if owner.get("kind") == "message":
        _wake_served(connection, keys, found, reply_to)
        return
    if owner.get("kind") != "task":
        return  # an in-process durable run resumes when it is run again with its durable_id
    data = {"request_id": found.id, "by": found.answer.by if found.answer else None}
    if found.answer is not None and found.answer.approved is not None:
        data["approved"] = found.answer.approved
    if found.answer is not None and found.answer.timed_out:
        data["timed_out"] = True
    status = resume(connection, keys, owner["run_id"], owner["task"], data)
    log.info("input.answered", request=found.id, run_id=owner["run_id"], task=owner["task"], resumed=status)


def _wake_served(connection: RedisClient, keys: Keys, found: InputRequest, reply_to: str | None = None) -> None:
    """A served message waits for this (now answered) request: put an ``answer`` envelope in
    its robot's inbox, in its conversation, so a worker runs it again and replies to its
    sender (bus/parking.py; the recorded answer stands, the envelope only wakes it). Where it
    waits is on the request's record: the robot's parked keys are its own (any worker's
    timeout sweep may answer here)."""
    from robot_lab.bus import Bus  # lazy: start-up time

    if found.answer is None:
        return
    wake_parked(Bus(connection, keys=keys), str(owner_robot(found)), found.id, found.answer, found.parked,
                reply_to=reply_to)


def owner_robot(found: InputRequest) -> Any:
    return found.owner.get("robot") or found.request.get("robot")


def pending(connection: RedisClient | None = None, keys: Keys | None = None, limit: int = 1000) -> list[InputRequest]:
    """Requests waiting for an answer, oldest first (those whose run is gone are dropped)."""
    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    inputs = InputStore(connection, keys)
    out = []
    for rid in inputs.pending_ids(limit):
        found = inputs.get(rid)
        if found is None or found.answer is not None:
            inputs.unlist(rid)
            continue
        owner = found.owner
        if owner.get("kind") == "task":
            if _task_gone(connection, keys, owner):
                inputs.unlist(rid)
                continue
            if RunStore(connection, keys, owner["run_id"]).states().get(owner["task"]) != "waiting":
                continue  # recorded a moment before its task parks: listed once it waits
        out.append(found)
    return sorted(out, key=lambda r: float(r.request.get("created_at") or 0))  # found by SCAN: in no order


def _task_gone(connection: RedisClient, keys: Keys, owner: dict[str, Any]) -> bool:
    """Will the task of a request never wait for it again (its run ended, the task finished)?
    A task still ``running`` may be about to park: its request is recorded just before the
    PARK transition, and an answer given meanwhile is resumed by the sweep (:func:`repair`)."""
    store = RunStore(connection, keys, owner["run_id"])
    return store.status() != "running" or store.states().get(owner["task"]) in TERMINAL


def for_run(run_id: str, connection: RedisClient, keys: Keys) -> list[InputRequest]:
    """The pending requests of one run (``RunHandle.answer`` without a request id)."""
    return [r for r in pending(connection, keys) if r.owner.get("run_id") == run_id]


def sweep(connection: RedisClient, keys: Keys, now: float | None = None) -> int:
    """Time out due requests (answer with the default, or as timed out), and resume waiting
    tasks whose request was answered but not resumed (a crash in between). Returns how many
    requests it settled."""
    inputs = InputStore(connection, keys)
    settled = 0
    for rid in inputs.due(now or time.time()):
        found = inputs.get(rid)
        if found is None:
            inputs.unlist(rid)
            continue
        if found.answer is not None:  # answered, maybe not resumed: resume is idempotent
            inputs.unlist(rid)
            _resume_owner(connection, keys, found)
            continue
        default = found.request.get("default")
        try:
            answer(rid, default, approve=False if found.request.get("kind") == "approval" and default is None else None,
                   by="timeout", connection=connection, keys=keys, timed_out=True)
            settled += 1
        except ConfigurationError as exc:
            log.info("input.timeout_skipped", request=rid, reason=str(exc))
    return settled


def repair(store: RunStore) -> int:
    """Waiting tasks of one run whose request has an answer: resume them (a crash between
    the answer and the resume)."""
    inputs = InputStore(store.r, store.keys)
    fixed = 0
    for task, state in store.states().items():
        if state != "waiting":
            continue
        journal = Journal(store.r, store.keys.run_steps(store.run_id, task), RUN_TTL, scope=task)
        waiting = [rid for r in journal.steps().values() if r.get("status") == "waiting"
                   for rid in (r.get("requests") or [])[-1:]]
        for rid in waiting:
            found = inputs.get(rid) if rid else None
            if found is not None and found.answer is not None:
                _resume_owner(store.r, store.keys, found)
                fixed += 1
    return fixed
