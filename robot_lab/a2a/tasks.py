"""An A2A task seen from Redis: its snapshot and its events, derived from what it runs.

A robot task is a bus message whose reply lands in a private stream; a network task is a
run whose events stream (``run.started`` ... ``text.delta`` ... ``stream.ended``) is
replayable from any id. :class:`TaskView` folds those entries, in order, into an A2A
``Task`` and yields the A2A events of each step (status updates, artifact chunks). Every
process derives the same events from the same entries, so a subscriber on any ``robot-lab
a2a`` process gets the snapshot up to entry N and then every event after N: nothing lost,
nothing twice, and nothing about a task lives in the process that created it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from google.protobuf.timestamp_pb2 import Timestamp

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)

from robot_lab.a2a.states import is_interrupted, is_terminal, task_state_for
from robot_lab.a2a.task_store import TaskRecord, TaskStore
from robot_lab.keys import Keys
from robot_lab.schemas import RunEvent
from robot_lab.schemas.codec import decode_message

Event = Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent

# run events that become a WORKING status update naming the robot-lab event (progress a
# client can show); the rest (usage, memory, queueing) stay inside robot-lab
PROGRESS_EVENTS = ("task.started", "task.completed", "task.failed", "task.skipped", "task.retrying",
                   "tool_call.started", "tool_call.completed")


def _stamp(ms: int | None = None) -> Timestamp:
    """A protobuf timestamp: of ``ms`` (a stream entry's time, the same in every process
    that folds the entry), else now."""
    ts = Timestamp()
    if ms is None:
        ts.FromNanoseconds(time.time_ns())
    else:
        ts.FromMilliseconds(ms)
    return ts


def question_text(request: dict[str, Any]) -> str:
    """What a parked task asks, as the text of an ``input-required`` status: the question,
    its choices and default; for an approval, the tool and arguments to approve."""
    text = str(request.get("question") or "")
    if request.get("kind") == "approval" and request.get("tool"):
        text = text or f"approve {request['tool']}?"
        text += f" (tool {request['tool']}, arguments {json.dumps(request.get('arguments') or {}, default=str)};"
        text += " answer yes to approve, anything else denies it)"
    if request.get("choices"):
        text += f" (choices: {', '.join(str(c) for c in request['choices'])})"
    if request.get("default") is not None:
        text += f" (default: {request['default']})"
    return text


def agent_message(task: Task, text: str) -> Message:
    return Message(message_id=f"{task.id}-reply", context_id=task.context_id, task_id=task.id,
                   role=Role.ROLE_AGENT, parts=[Part(text=text)])


class Projection:
    """The Task as it stands after the entries applied so far, and the event of each step."""

    def __init__(self, record: TaskRecord) -> None:
        self.task = Task(id=record.id, context_id=record.context_id,
                         status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED,
                                           timestamp=_stamp(int(record.created_at * 1000))),
                         history=record.history_messages())
        self._artifacts: dict[str, int] = {}
        self.at: int | None = None  # ms of the entry being applied (its stream id)

    @property
    def state(self) -> int:
        return self.task.status.state

    def status(self, state: int, text: str | None = None, metadata: dict[str, Any] | None = None
               ) -> TaskStatusUpdateEvent:
        status = TaskStatus(state=state, timestamp=_stamp(self.at))
        if text is not None:
            status.message.CopyFrom(agent_message(self.task, text))
        self.task.status.CopyFrom(status)
        if text is not None and is_terminal(state):
            self.task.history.append(status.message)
        elif text is not None and is_interrupted(state):  # the question, before the answer in the history
            asked = Message()
            asked.CopyFrom(status.message)
            asked.message_id = f"{self.task.id}-ask-{len(self.task.history)}"
            self.task.history.append(asked)
        event = TaskStatusUpdateEvent(task_id=self.task.id, context_id=self.task.context_id, status=status)
        if metadata:
            event.metadata.update(metadata)
        return event

    def chunk(self, artifact_id: str, name: str, text: str, *, append: bool, last: bool) -> TaskArtifactUpdateEvent:
        """Add ``text`` to an artifact (``append=False`` replaces it)."""
        index = self._artifacts.get(artifact_id)
        if index is None:
            self._artifacts[artifact_id] = len(self.task.artifacts)
            self.task.artifacts.append(Artifact(artifact_id=artifact_id, name=name, parts=[Part(text=text)]))
        else:
            part = self.task.artifacts[index].parts[0]
            part.text = part.text + text if append else text
        piece = Artifact(artifact_id=artifact_id, name=name, parts=[Part(text=text)])
        return TaskArtifactUpdateEvent(task_id=self.task.id, context_id=self.task.context_id, artifact=piece,
                                       append=append and index is not None, last_chunk=last)

    def artifact_text(self, artifact_id: str) -> str | None:
        index = self._artifacts.get(artifact_id)
        return None if index is None else self.task.artifacts[index].parts[0].text


class Source:
    """What a task runs, read as ordered entries ``(cursor, payload)`` from one stream."""

    stream_key: str

    def __init__(self, aredis: Any, record: TaskRecord) -> None:
        self.r = aredis
        self.record = record

    async def read(self, after: str, block_ms: int | None) -> list[tuple[str, Any]]:
        if block_ms is None:
            entries = await self.r.xrange(self.stream_key, min=f"({after}" if after != "0-0" else "-")
        else:
            raw = await self.r.xread({self.stream_key: after}, block=block_ms)
            entries = raw[0][1] if raw else []
        return [(e.decode() if isinstance(e, bytes) else e, self.decode(f)) for e, f in entries]

    def decode(self, fields: dict[bytes, bytes]) -> Any:
        raise NotImplementedError

    async def apply(self, projection: Projection, payload: Any) -> list[Event]:
        raise NotImplementedError


class RobotSource(Source):
    """A bus message's private reply stream: one reply (or error envelope) ends the task.

    A served robot that asks a person replies ``input_required`` (bus/parking.py): the task
    is then input-required with the question. The answer envelope that resumes it is
    copied into this stream before it is published (``parking.wake``), and the final reply
    answers *that* envelope's id; so the fold follows the chain message -> question ->
    answer -> (question -> answer ...) -> reply in stream order, the same in every process,
    and ignores what answers an earlier link (a resent question after the answer)."""

    def __init__(self, aredis: Any, record: TaskRecord, keys: Keys) -> None:
        super().__init__(aredis, record)
        self.stream_key = keys.inbox(record.reply_stream)
        self.expected = record.message_id  # the envelope whose reply the task waits for
        self.pending: str | None = None  # the input request it waits on, while input-required

    def decode(self, fields: dict[bytes, bytes]) -> Any:
        raw = fields.get(b"envelope")
        try:
            return decode_message(raw) if raw is not None else None
        except Exception:  # a foreign entry in the stream is not the reply
            return None

    async def apply(self, projection: Projection, payload: Any) -> list[Event]:
        message = payload
        if message is None or is_terminal(projection.state):
            return []
        if message.kind == "answer":  # the copy of the answer that resumes the parked message
            if self.pending is None or message.in_reply_to != self.pending:
                return []
            request, self.pending, self.expected = self.pending, None, message.id
            content = message.content if isinstance(message.content, dict) else {"text": str(message.content)}
            projection.task.history.append(Message(message_id=message.id, context_id=projection.task.context_id,
                                                   task_id=projection.task.id, role=Role.ROLE_USER,
                                                   parts=[Part(text=str(content.get("text") or ""))]))
            return [projection.status(task_state_for("running"), metadata={"event": "input.answered",
                                                                            "request": request})]
        if message.in_reply_to != self.expected:
            return []
        if message.kind == "input_required":
            question = message.content if isinstance(message.content, dict) else {"question": str(message.content)}
            request = str(question.get("request_id") or "")
            if request and request == self.pending:  # the same question again (a redelivery)
                return []
            self.pending = request or None
            return [projection.status(TaskState.TASK_STATE_INPUT_REQUIRED, question_text(question),
                                      metadata={"event": "input.requested", "request": request})]
        text = message.content if isinstance(message.content, str) else msgspec.json.encode(message.content).decode()
        if message.kind == "error":
            return [projection.status(task_state_for("failed"), text, {"reason": message.headers.get("error", "")})]
        return [projection.chunk("reply", "reply", text, append=False, last=True),
                projection.status(task_state_for("completed"), text)]


class NetworkSource(Source):
    """A run's event stream: progress as status updates, ``text.delta`` as artifact chunks
    (an artifact per network task), the run's end as the final status."""

    def __init__(self, aredis: Any, record: TaskRecord, keys: Keys,
                 final_reply: Callable[[str], Awaitable[str | None]]) -> None:
        super().__init__(aredis, record)
        self.stream_key = keys.run_events(record.run_id)
        self.final_reply = final_reply

    def decode(self, fields: dict[bytes, bytes]) -> Any:
        return msgspec.json.decode(fields[b"event"], type=RunEvent)

    async def apply(self, projection: Projection, event: RunEvent) -> list[Event]:
        kind, task = event.event, event.task or ""
        out: list[Event] = []
        if kind == "run.started":
            out.append(projection.status(task_state_for("running"), metadata={"event": kind, "run_id": event.run_id}))
        elif kind == "text.delta":
            text = str(event.data.get("delta", ""))
            if text:
                out.append(projection.chunk(task, task, text, append=True, last=False))
        elif kind in ("task.completed", "task.failed"):
            reply = event.data.get("reply") or event.data.get("error") or ""
            if projection.artifact_text(task) != reply:  # what streamed is not the reply: send it whole
                out.append(projection.chunk(task, task, str(reply), append=False, last=True))
            else:
                out.append(projection.chunk(task, task, "", append=True, last=True))
        elif kind in ("run.completed", "run.cancelled"):
            status = "completed" if kind == "run.completed" else "cancelled"
            reply = await self.final_reply(event.run_id) if kind == "run.completed" else event.data.get("reason")
            out.append(projection.status(task_state_for(status), reply if reply is not None else ""))
        elif kind == "hitl.requested":  # a task parked for a person (docs/durable.md)
            out.append(projection.status(TaskState.TASK_STATE_INPUT_REQUIRED, question_text(event.data),
                                         metadata={"event": kind, "task": task, "request": str(event.data.get("id", ""))}))
        elif kind == "hitl.resolved":
            out.append(projection.status(task_state_for("running"), metadata={
                "event": kind, "task": task, "request": str(event.data.get("request_id", ""))}))
        elif task_state_for(kind.split(".")[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED:
            out.append(projection.status(TaskState.TASK_STATE_INPUT_REQUIRED, str(event.data.get("question", ""))))
        if kind in PROGRESS_EVENTS:
            meta = {"event": kind, "task": task, "robot": event.robot or ""}
            out.insert(0, projection.status(task_state_for("running"), metadata=meta))
        return out


class TaskView:
    """Follows one task: ``catch_up`` folds what is there, ``events`` goes on live."""

    POLL_MS = 1000  # longest block between looks at the task record (a cancel elsewhere)

    def __init__(self, store: TaskStore, record: TaskRecord, source: Source) -> None:
        self.store = store
        self.record = record
        self.source = source
        self.projection = Projection(record)
        self.cursor = "0-0"
        self.ended: Task | None = record.final_task()

    @property
    def over(self) -> bool:
        return self.ended is not None or is_interrupted(self.projection.state)

    def snapshot(self) -> Task:
        task = Task()
        task.CopyFrom(self.ended if self.ended is not None else self.projection.task)
        return task

    async def _apply(self, entries: list[tuple[str, Any]], resumed: str | None = None) -> list[Event]:
        """Fold ``entries`` in order; with ``resumed`` (an input request id), stop right
        after the entry that resumes the task from that request."""
        out: list[Event] = []
        for cursor, payload in entries:
            self.cursor = cursor
            self.projection.at = int(cursor.split("-", 1)[0])
            events = await self.source.apply(self.projection, payload)
            out += events
            if is_terminal(self.projection.state):
                return out + await self._end()
            if resumed is not None and any(isinstance(e, TaskStatusUpdateEvent) and not is_interrupted(e.status.state)
                                           and e.metadata["request"] == resumed for e in events
                                           if "request" in e.metadata):
                return out
        return out

    async def _end(self) -> list[Event]:
        """Record the projected end; when another process recorded a different one first
        (a cancel), that one stands and is the last event."""
        stood = await self.store.finish(self.projection.task)
        self.ended = stood
        if stood.status.state != self.projection.state:
            return [TaskStatusUpdateEvent(task_id=stood.id, context_id=stood.context_id, status=stood.status)]
        return []

    async def catch_up(self, *, resumed: str | None = None) -> list[Event]:
        """Fold what is there; with ``resumed``, only up to the entry that resumed the task
        from that input request (a stream of the answer goes on from there)."""
        if self.ended is not None:
            return []
        return await self._apply(await self.source.read(self.cursor, None), resumed)

    async def events(self, *, deadline: float | None = None, through_input: bool = False) -> AsyncIterator[Event]:
        """The events from the current position until the task ends or waits for input
        (a blocking read returns at once with what is already there); ``through_input``:
        on past a wait for input (an answer given elsewhere), until the task ends."""
        while self.ended is None if through_input else not self.over:
            if deadline is not None and time.monotonic() >= deadline:
                return
            for event in await self._apply(await self.source.read(self.cursor, self.POLL_MS)):
                yield event
            if self.ended is None:
                recorded = await self.store.final(self.record.id)
                if recorded is not None:  # ended elsewhere (cancelled)
                    self.ended = recorded
                    yield TaskStatusUpdateEvent(task_id=recorded.id, context_id=recorded.context_id,
                                                status=recorded.status)

    async def wait(self, timeout: float) -> Task:
        deadline = time.monotonic() + timeout
        async for _ in self.events(deadline=deadline):
            pass
        return self.snapshot()

