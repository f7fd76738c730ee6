"""The A2A request handler: ``message/send``, ``message/stream``, ``tasks/get``,
``tasks/cancel`` and ``tasks/resubscribe`` of one agent (a robot or a network), on the SDK's
``RequestHandler`` interface, so the SDK's JSON-RPC routes (1.0 and 0.3 method names) parse,
validate and answer with the spec's error codes.

Nothing about a task is kept here between calls: each call reads the task record and what
it runs from Redis (:mod:`.tasks`), so any ``robot-lab a2a`` process answers for any task.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.task import (
    ListTasksCursor,
    apply_history_length,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_history_length,
    validate_page_size,
)

from robot_lab.a2a.states import is_interrupted, is_terminal
from robot_lab.a2a.task_store import TaskRecord, TaskStore
from robot_lab.a2a.tasks import NetworkSource, RobotSource, TaskView, agent_message
from robot_lab.bus import Bus
from robot_lab.bus.parking import withdraw
from robot_lab.bus.requests import REPLY_PREFIX
from robot_lab.errors import RobotLabError
from robot_lab.inputs import InputStore, InvalidAnswer
from robot_lab.keys import Keys
from robot_lab.logging import get_logger
from robot_lab.network import human_input
from robot_lab.network.coordinator import Coordinator, RunHandle
from robot_lab.schemas import RobotMessage, new_id
from robot_lab.settings import A2ASettings

log = get_logger("robot_lab.a2a")

LIST_WINDOW = 1000  # tasks/list looks at a caller's newest tasks on an agent, this many at most
LIST_FOLDS = 16  # tasks one tasks/list folds at once (the other requests share the Redis pool)


@dataclass
class Backend:
    """What every agent of one server shares: Redis clients, the task store, settings."""

    bus: Bus
    coordinator: Coordinator
    store: TaskStore
    keys: Keys
    settings: A2ASettings

    async def final_reply(self, run_id: str) -> str | None:
        return await asyncio.to_thread(lambda: RunHandle(self.coordinator, run_id).result().reply)

    def view(self, record: TaskRecord) -> TaskView:
        if record.kind == "network":
            source: Any = NetworkSource(self.bus.aredis, record, self.keys, self.final_reply)
        else:
            source = RobotSource(self.bus.aredis, record, self.keys)
        return TaskView(self.store, record, source)


def message_content(message: Message, input_modes: list[str]) -> tuple[str | dict[str, Any], list[dict[str, str]]]:
    """The bus content of an A2A message (its text parts, or one data part as a JSON object)
    and its file parts as bus attachments. Every part's media type, where it names one, must
    be one of ``input_modes`` (the card's): else the whole message is refused, never a part
    dropped (A2A 1.0 section 3.1.1, ``ContentTypeNotSupportedError``)."""
    texts: list[str] = []
    data: list[Any] = []
    files: list[dict[str, str]] = []
    for part in message.parts:
        which = part.WhichOneof("content")
        media = part.media_type.split(";", 1)[0].strip().lower()
        if media and media not in input_modes:
            raise ContentTypeNotSupportedError(
                message=f"a {which} part of media type {part.media_type!r} is not accepted: "
                        f"send one of {', '.join(input_modes)} (the agent card's defaultInputModes)")
        if which == "text":
            texts.append(part.text)
        elif which == "data":
            data.append(MessageToDict(part.data))
        elif which == "raw":
            files.append({"name": part.filename or f"file-{len(files) + 1}",
                          "content_base64": base64.b64encode(part.raw).decode()})
        else:
            raise ContentTypeNotSupportedError(message=f"{which} parts are not supported: send text, data or raw files")
    if not texts and len(data) == 1 and isinstance(data[0], dict):
        return data[0], files
    text = "\n".join(texts + [json.dumps(d) for d in data])
    if not text.strip():
        raise InvalidParamsError(message="the message has no text or data part")
    return text, files


def owner_of(context: ServerCallContext) -> str:
    return context.user.user_name if context.user.is_authenticated else ""


class AgentHandler(RequestHandler):
    """One agent: ``kind`` ``robot`` (bus messages to its workers) or ``network`` (runs)."""

    def __init__(self, backend: Backend, *, kind: str, name: str, card: AgentCard, network: Any = None) -> None:
        self.backend = backend
        self.kind = kind
        self.name = name
        self.card = card
        self.network = network
        self.agent = f"{kind}/{name}"

    # --- reading tasks --------------------------------------------------------------------
    async def _record(self, task_id: str, context: ServerCallContext) -> TaskRecord:
        record = await self.backend.store.get(task_id) if task_id else None
        if record is None or record.agent != self.agent or record.owner != owner_of(context):
            raise TaskNotFoundError(message=f"task {task_id!r} not found")
        return record

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        view = self.backend.view(await self._record(params.id, context))
        await view.catch_up()
        return apply_history_length(view.snapshot(), params)

    @validate_request_params
    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The caller's tasks on this agent (A2A 1.0 section 3.1.4): only its own (read from
        its index), filtered by context, state and status time, newest status first, paged by
        the SDK's cursor tokens (the position of a page's last task, so a token stays valid
        when tasks change). Each task is folded from what it runs, like ``tasks/get``; the
        caller's ``LIST_WINDOW`` newest tasks are the ones looked at."""
        validate_history_length(params)
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        after: tuple[int, str] | None = None
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(message="pageToken is not a token this server gave")
            after = (cursor.timestamp_ns or 0, cursor.task_id)
        records = await self.backend.store.listed(self.agent, owner_of(context), LIST_WINDOW)
        if params.context_id:
            records = [r for r in records if r.context_id == params.context_id]
        folds = asyncio.Semaphore(LIST_FOLDS)
        tasks = await asyncio.gather(*(self._current(r, folds) for r in records))
        if params.status:
            tasks = [t for t in tasks if t.status.state == params.status]
        if params.HasField("status_timestamp_after"):
            since = params.status_timestamp_after.ToNanoseconds()
            tasks = [t for t in tasks if t.status.timestamp.ToNanoseconds() >= since]
        tasks.sort(key=_list_key, reverse=True)
        total = len(tasks)
        if after is not None:
            tasks = [t for t in tasks if _list_key(t) < after]
        size = params.page_size if params.HasField("page_size") else DEFAULT_LIST_TASKS_PAGE_SIZE
        page, more = tasks[:size], len(tasks) > size
        for task in page:
            if not params.include_artifacts:
                task.ClearField("artifacts")
            task.CopyFrom(apply_history_length(task, params))
        token = encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=_list_key(page[-1])[0],
                                                         task_id=page[-1].id)) if more else ""
        return ListTasksResponse(tasks=page, next_page_token=token, page_size=size, total_size=total)

    async def _current(self, record: TaskRecord, folds: asyncio.Semaphore) -> Task:
        async with folds:
            view = self.backend.view(record)
            await view.catch_up()
            return view.snapshot()

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        record = await self._record(params.id, context)
        view = self.backend.view(record)
        await view.catch_up()
        if view.ended is not None or is_terminal(view.projection.state):
            raise TaskNotCancelableError(message=f"task {record.id} is already {TaskState.Name(view.snapshot().status.state)}")
        if record.kind == "network":
            try:  # the same as `robot-lab cancel RUN`: nothing new starts, running tasks finish
                await asyncio.to_thread(self.backend.coordinator.cancel, record.run_id, "cancelled over A2A")
            except RobotLabError as exc:
                log.warning("a2a.cancel_failed", task=record.id, run_id=record.run_id, error=str(exc))
            await view.catch_up()
        elif getattr(view.source, "pending", None):  # a robot parked on a question: withdraw it
            await asyncio.to_thread(withdraw, self.backend.bus, record.target, view.source.pending,
                                    by=_answerer(record))
        if view.ended is None:
            cancelled = view.snapshot()
            cancelled.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_CANCELED, timestamp=cancelled.status.timestamp))
            view.ended = await self.backend.store.finish(cancelled)
        log.info("a2a.cancelled", agent=self.agent, task=record.id)
        return view.snapshot()

    # --- messages -----------------------------------------------------------------------
    async def _start(self, params: SendMessageRequest, context: ServerCallContext) -> TaskView:
        message = params.message
        if message.task_id:
            return await self.continue_task(await self._record(message.task_id, context), message)
        content, files = message_content(message, self.backend.settings.input_modes)
        task_id = new_id()
        context_id = message.context_id or new_id()
        stored = Message()
        stored.CopyFrom(message)
        stored.task_id, stored.context_id = task_id, context_id
        record = TaskRecord(id=task_id, agent=self.agent, kind=self.kind, target=self.name,
                            context_id=context_id, owner=owner_of(context), history=[MessageToDict(stored)])
        if self.kind == "robot":
            await self._send_to_robot(record, content, files)
        else:
            await self._submit_run(record, content)
        log.info("a2a.task", agent=self.agent, task=task_id, context=context_id, owner=record.owner or None)
        return self.backend.view(record)

    async def continue_task(self, record: TaskRecord, message: Message) -> TaskView:
        """A message naming an existing task. A task waiting for input takes it as the answer
        (the human-input bridge: :func:`answer_input`); any other task refuses it."""
        view = self.backend.view(record)
        await view.catch_up()
        state = view.snapshot().status.state
        if is_interrupted(state):
            request_id = await answer_input(self.backend, record, message, view)
            answered = self.backend.view(record)
            # a stream of the answer goes on from the answer (working), not from the start
            await answered.catch_up(resumed=request_id)
            return answered
        raise UnsupportedOperationError(
            message=f"task {record.id} is {TaskState.Name(state)} and takes no message; send a new message "
                    f"with contextId {record.context_id} (and no taskId) to go on in the same conversation")

    async def _send_to_robot(self, record: TaskRecord, content: Any, files: list[dict[str, str]]) -> None:
        settings = self.backend.settings
        bus = self.backend.bus
        record.reply_stream = f"{REPLY_PREFIX}{settings.sender}.{record.id}"
        deadline = None
        if settings.robot_deadline:
            deadline = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=settings.robot_deadline)
        envelope = RobotMessage(to=self.name, content=content, from_=settings.sender, reply_to=record.reply_stream,
                                conversation_id=record.conversation_id, correlation_id=record.id, deadline=deadline,
                                extensions={"attachments": files} if files else {})
        record.message_id = envelope.id
        await self.backend.store.create(record, reply_key=self.backend.keys.inbox(record.reply_stream))
        try:
            await bus.apublish_message(envelope)
        except RobotLabError as exc:
            await self._fail(record, str(exc))

    async def _submit_run(self, record: TaskRecord, content: Any) -> None:
        record.run_id = new_id()
        await self.backend.store.create(record)
        try:
            await asyncio.to_thread(self.backend.coordinator.submit, self.network, content, run_id=record.run_id)
        except RobotLabError as exc:
            await self._fail(record, str(exc))

    async def _fail(self, record: TaskRecord, error: str) -> None:
        view = self.backend.view(record)
        task = view.snapshot()
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_FAILED, message=agent_message(task, f"Error: {error}")))
        await self.backend.store.finish(task)
        log.warning("a2a.task_failed_to_start", agent=self.agent, task=record.id, error=error)

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        view = await self._start(params, context)
        if params.configuration.return_immediately:
            await view.catch_up()
            return apply_history_length(view.snapshot(), params.configuration)
        task = await view.wait(self.backend.settings.send_timeout)
        return apply_history_length(task, params.configuration)

    @validate_request_params
    async def on_message_send_stream(self, params: SendMessageRequest, context: ServerCallContext
                                     ) -> AsyncGenerator[Any, None]:
        view = await self._start(params, context)
        yield view.snapshot()
        async for event in view.events():
            yield event

    @validate_request_params
    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest, context: ServerCallContext
                                   ) -> AsyncGenerator[Any, None]:
        view = self.backend.view(await self._record(params.id, context))
        await view.catch_up()
        if view.ended is not None:
            raise UnsupportedOperationError(
                message=f"task {params.id} is {TaskState.Name(view.ended.status.state)}: nothing more to stream "
                        "(tasks/get returns it)")
        yield view.snapshot()
        # A2A 1.0 section 3.1.6: a subscription "MUST terminate when the task reaches a terminal
        # state" and may be made to any task not terminal, an input-required one included: so it
        # goes on past a question (answered by another request) to the end. A message's own
        # stream still ends at the question (section 3.1.2's blocking rule, and its client is the
        # one to answer).
        async for event in view.events(through_input=True):
            yield event

    # --- not offered ----------------------------------------------------------------------
    async def on_create_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(self, params: Any, context: ServerCallContext) -> Any:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(self, params: Any, context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, params: Any, context: ServerCallContext) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _list_key(task: Task) -> tuple[int, str]:
    """``tasks/list`` order (descending): the status time, then the id (a stable order)."""
    return task.status.timestamp.ToNanoseconds(), task.id


APPROVALS = frozenset({"yes", "y", "approve", "approved", "ok", "allow", "true"})


async def answer_input(backend: Backend, record: TaskRecord, message: Message, view: TaskView | None = None) -> str:
    """Deliver ``message`` as the answer the task waits for (docs/a2a.md, "Input
    required"): its text answers the pending request once, recorded as answered by
    ``a2a:<caller>``; for an approval, ``yes`` approves and any other text denies with that
    reason. A network run then resumes on any worker (``network.human_input``); a served
    robot's parked message is woken by an ``answer`` envelope the tier sends as its own
    sender, whose reply (the robot's final answer, or its next question) the task follows
    (``view``: the task as it stands, caught up). Returns the id of the request answered."""
    content, _ = message_content(message, backend.settings.input_modes)
    text = content if isinstance(content, str) else json.dumps(content)
    if record.kind == "network":
        return await asyncio.to_thread(_answer_run, backend, record, text.strip())
    if view is None:
        view = backend.view(record)
        await view.catch_up()
    request_id = getattr(view.source, "pending", None)
    if not request_id:
        raise UnsupportedOperationError(message=f"task {record.id} has no question waiting for an answer")
    await asyncio.to_thread(_answer_robot, backend, record, request_id, text.strip())
    return str(request_id)


def _answerer(record: TaskRecord) -> str:
    return f"a2a:{record.owner}" if record.owner else "a2a"


def _answer_robot(backend: Backend, record: TaskRecord, request_id: str, text: str) -> None:
    """Answer the robot's request through the one answering path (``network.human_input``:
    recorded once, then the robot's parked message is woken with an ``answer`` envelope from
    the message's own sender -- the tier's -- whose reply goes into this task's stream, where
    a copy of the envelope lands first: ``bus.parking.wake``)."""
    found = InputStore(backend.bus.redis, backend.keys).get(request_id)
    if found is None:
        raise UnsupportedOperationError(message=f"task {record.id}: its question {request_id} is gone "
                                                "(expired, or the robot's records were cleared)")
    _answer(backend, record, found, text, backend.bus.redis, reply_to=record.reply_stream)
    log.info("a2a.answered", task=record.id, request=request_id, robot=record.target, by=_answerer(record))


def _answer_run(backend: Backend, record: TaskRecord, text: str) -> str:
    connection = backend.coordinator.connection
    waiting = human_input.for_run(record.run_id, connection, backend.keys)
    if not waiting:
        raise UnsupportedOperationError(message=f"task {record.id} has no question waiting for an answer")
    _answer(backend, record, waiting[0], text, connection)
    return waiting[0].id


def _answer(backend: Backend, record: TaskRecord, request: Any, text: str, connection: Any,
            reply_to: str | None = None) -> None:
    """``text`` as the answer to ``request`` (for an approval ``yes`` approves, any other text
    denies with that reason), by ``a2a:<caller>``; the spec's errors for an answer the
    question cannot take (-32602) and one it takes no more (-32004). ``reply_to``: the
    task's reply stream, where a served robot's next reply goes."""
    approve = text.lower() in APPROVALS if request.request.get("kind") == "approval" else None
    try:
        human_input.answer(request.id, None if approve is True else text, approve=approve, by=_answerer(record),
                           connection=connection, keys=backend.keys, reply_to=reply_to)
    except InvalidAnswer as exc:  # not a choice, too long: the question still waits
        raise InvalidParamsError(message=f"task {record.id}: {exc}") from None
    except RobotLabError as exc:  # answered meanwhile, the run ended
        raise UnsupportedOperationError(message=f"task {record.id}: {exc}") from exc

