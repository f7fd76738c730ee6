"""A remote Agent2Agent agent offered to the model as one tool.

A robot built with ``a2a_agents=["http://host/robots/billing/.well-known/agent-card.json"]``
(or entries ``{"url": ..., "name": ..., "description": ...}``) gets a tool per agent that
sends the model's ``message`` to it and returns the agent's answer. Nothing connects
until the model calls the tool: the card is fetched then (and kept a while), each call has a
timeout, and a failed connection or a 5xx is retried. The agent's answer is its task's
artifacts (or its final status message); a task that fails, is cancelled or rejected is a
tool error the model reads. An agent that asks a question back (``input-required``) asks it
as the robot's own question (``runtime.durable.human.request_input``): in a network task or a
served message the step parks, with the remote task's id recorded with the request, and
resumes on any worker with the answer, which is sent on to the same remote task; in-process
``on_input`` or a terminal answers; a robot that cannot ask gets a tool error naming the
question.

Entries are data (they travel in the RobotSpec), so secrets never sit in them: a token
comes from ``a2a.client_tokens`` (URL prefix -> secret) or the environment variable named
by an entry's ``token_env``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from robot_lab.errors import ConfigurationError, InputRequired, ToolError
from robot_lab.logging import get_logger
from robot_lab.runtime.tools import Tool
from robot_lab.settings import get_settings

log = get_logger("robot_lab.a2a.client")

CARD_SUFFIX = "/.well-known/agent-card.json"
RETRY_BASE = 0.25  # seconds before the first retry of a failed connection; doubles
CARD_TTL = 300.0  # seconds a fetched card is reused by every robot of this process

# card URL -> (fetched at, AgentCard): network tasks build a fresh robot per task, so the
# cache is the process's, not the tool's
_cards: dict[str, tuple[float, Any]] = {}


def _entry(raw: str | Mapping[str, Any]) -> dict[str, Any]:
    entry = {"url": raw} if isinstance(raw, str) else dict(raw)
    url = str(entry.get("url") or "")
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(f"a2a_agents: {raw!r} is not an http(s) URL of an agent card")
    unknown = set(entry) - {"url", "name", "description", "token_env", "timeout"}
    if unknown:
        raise ConfigurationError(f"a2a_agents: {url}: unknown field(s) {', '.join(sorted(unknown))}")
    return entry


def default_name(url: str) -> str:
    """``a2a_<agent>`` from the URL: the path segment before the well-known card path."""
    path = url.split("://", 1)[-1].removesuffix(CARD_SUFFIX).rstrip("/")
    last = path.rsplit("/", 1)[-1] if "/" in path else path.split(":")[0]
    return "a2a_" + (re.sub(r"[^A-Za-z0-9_-]", "_", last)[:60] or "agent")


def question_of(task: Any) -> str:
    """The question of a remote task that is ``input-required`` (its status message)."""
    return (_text_of(task.status.message) if task.status.HasField("message") else "") or "(no question given)"


def _asked_at(task: Any) -> str:
    """What tells one question of a remote task from the next: its status time and text
    (a resumed step compares it with what it recorded)."""
    stamp = task.status.timestamp.ToJsonString() if task.status.HasField("timestamp") else ""
    return f"{stamp}|{question_of(task)}"


def _text_of(message: Any) -> str:
    return "\n".join(p.text for p in message.parts if p.WhichOneof("content") == "text")


class A2AAgentTool(Tool):
    """One remote agent; ``message`` is what the model sends it."""

    parameters = {
        "type": "object",
        "properties": {"message": {"type": "string", "description": "What to ask or tell the agent"}},
        "required": ["message"],
    }

    def __init__(self, entry: str | Mapping[str, Any]) -> None:
        spec = _entry(entry)
        self.entry = spec
        self.url = spec["url"]
        self.name = spec.get("name") or default_name(self.url)
        self.description = spec.get("description") or f"Ask the remote A2A agent at {self.url} and get its answer."
        super().__init__()

    # --- settings ------------------------------------------------------------------------
    def _settings(self) -> Any:
        return get_settings().a2a

    def _token(self) -> str | None:
        env = self.entry.get("token_env")
        if env:
            return os.environ.get(env) or None
        best = ""
        token = None
        for prefix, secret in self._settings().client_tokens.items():
            if self.url.startswith(prefix) and len(prefix) > len(best):
                best, token = prefix, secret.get_secret_value()
        return token

    # --- the call -----------------------------------------------------------------------
    async def execute(self, message: str) -> str:  # type: ignore[override]
        import httpx  # lazy: start-up time

        from a2a.client import ClientConfig, ClientFactory  # optional extra [a2a]
        from a2a.types.a2a_pb2 import TaskState  # optional extra [a2a]

        settings = self._settings()
        timeout = float(self.entry.get("timeout") or settings.client_timeout)
        token = self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
            card = await self._retrying(lambda: self._resolve(http), settings.client_retries, "fetch the agent card")
            client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
            task = await self._resumed(client, timeout)
            if task is None:
                task = await self._timed(self._send(client, message), timeout)
            while getattr(getattr(task, "status", None), "state", None) == TaskState.TASK_STATE_INPUT_REQUIRED:
                answer = await asyncio.to_thread(self._ask, task)  # may park the step (raises InputRequired)
                task = await self._timed(self._send(client, answer, task_id=task.id, context_id=task.context_id),
                                         timeout)
        return self._answer(task)

    async def _timed(self, call: Any, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(call, timeout)
        except asyncio.TimeoutError:
            raise ToolError(f"agent {self.url} did not answer within {timeout:g} s", retryable=True) from None

    def _ask(self, task: Any) -> str:
        """The remote agent's question, asked as this robot's own; the remote task is recorded
        with the request, so a resumed step (on any worker) goes on with that task."""
        from robot_lab.runtime.durable import human  # lazy: start-up time

        question = question_of(task)
        context = {"a2a_agent": self.url, "a2a_task": task.id, "a2a_context": task.context_id,
                   "a2a_asked": _asked_at(task)}
        try:
            return human.request_input(question, tool=self.name, context=context).text
        except InputRequired as exc:
            if human.can_park():
                raise  # the step parks; it resumes here (in _resumed) with the answer
            raise ToolError(f"agent {self.url} asks {question!r} and this robot cannot ask its user: {exc}") from None

    async def _resumed(self, client: Any, timeout: float) -> Any:
        """On a resumed attempt of the step: the remote task it asked about before it parked
        (None on a first attempt). The questions settled on earlier attempts are passed over;
        the last one is asked again -- answered now -- unless the remote task has moved on
        (the answer was sent before a crash), in which case what it does now stands."""
        from a2a.types.a2a_pb2 import GetTaskRequest, TaskState  # optional extra [a2a]

        from robot_lab.runtime.durable import human  # lazy: start-up time

        recorded = human.recorded_requests()
        ours = [r for r in recorded if (r.get("context") or {}).get("a2a_agent") == self.url]
        if not ours:
            return None
        human.skip_recorded(len(recorded) - 1)
        context = ours[-1]["context"]
        try:
            task = await self._timed(client.get_task(GetTaskRequest(id=context["a2a_task"])), timeout)
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(f"agent {self.url}: its task {context['a2a_task']} (asked about before this run "
                            f"waited) cannot be read: {exc}") from None
        task = await self._timed(self._settled(client, task), timeout)
        if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED or _asked_at(task) != context.get("a2a_asked"):
            human.skip_recorded(1)  # the recorded question is behind it: a new one is a new request
        log.info("a2a.client_resumed", agent=self.url, task=task.id, state=TaskState.Name(task.status.state))
        return task

    async def _send(self, client: Any, text: str, *, task_id: str = "", context_id: str = "") -> Any:
        from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest  # optional extra [a2a]

        from robot_lab.schemas import new_id  # lazy: start-up time

        request = SendMessageRequest(message=Message(message_id=new_id(), role=Role.ROLE_USER, parts=[Part(text=text)],
                                                     task_id=task_id, context_id=context_id))
        response = None
        async for response in client.send_message(request):
            pass
        if response is None or not response.HasField("task"):
            return response.message if response is not None else None
        return await self._settled(client, response.task)

    async def _resolve(self, http: Any) -> Any:
        cached = _cards.get(self.url)
        if cached is not None and time.monotonic() - cached[0] < CARD_TTL:
            return cached[1]
        from a2a.client import A2ACardResolver  # optional extra [a2a]

        base = self.url[: -len(CARD_SUFFIX)] if self.url.endswith(CARD_SUFFIX) else self.url
        card = await A2ACardResolver(http, base, CARD_SUFFIX).get_agent_card()
        _cards[self.url] = (time.monotonic(), card)
        return card

    @staticmethod
    async def _settled(client: Any, task: Any) -> Any:
        """Poll a task the server stopped waiting on (SUBMITTED / WORKING) until it moves."""
        from a2a.types.a2a_pb2 import GetTaskRequest  # optional extra [a2a]

        while task.status.state in (1, 2):
            await asyncio.sleep(0.5)
            task = await client.get_task(GetTaskRequest(id=task.id))
        return task

    async def _retrying(self, call: Any, retries: int, what: str) -> Any:
        from a2a.client import AgentCardResolutionError  # optional extra [a2a]

        for attempt in range(retries + 1):
            try:
                return await call()
            except AgentCardResolutionError as exc:
                status = getattr(exc, "status_code", None)
                transient = status is None or status >= 500
                if not transient or attempt == retries:
                    raise ToolError(f"cannot {what} of {self.url}: {exc}", retryable=transient) from None
            log.warning("a2a.client_retry", agent=self.url, attempt=attempt + 1, what=what)
            await asyncio.sleep(RETRY_BASE * 2 ** attempt)
        raise AssertionError("unreachable")

    def _answer(self, result: Any) -> str:
        from a2a.types.a2a_pb2 import Message, TaskState  # optional extra [a2a]

        if isinstance(result, Message):
            return _text_of(result)
        if result is None:
            raise ToolError(f"agent {self.url} answered nothing")
        state = result.status.state
        if state == TaskState.TASK_STATE_COMPLETED:
            texts = [p.text for a in result.artifacts for p in a.parts if p.WhichOneof("content") == "text" and p.text]
            if not texts and result.status.HasField("message"):
                texts = [_text_of(result.status.message)]
            return "\n".join(texts)
        if state == TaskState.TASK_STATE_AUTH_REQUIRED:
            raise ToolError(f"agent {self.url} needs other credentials before it can answer: {question_of(result)}")
        why = _text_of(result.status.message) if result.status.HasField("message") else ""
        raise ToolError(f"agent {self.url}: task {TaskState.Name(state)}{': ' + why if why else ''}")


def agent_tools(entries: Iterable[str | Mapping[str, Any]]) -> list[A2AAgentTool]:
    """Tools for a robot's ``a2a_agents`` (no network until the model calls one)."""
    tools = [A2AAgentTool(entry) for entry in entries]
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigurationError(f"a2a_agents: two agents are both named {', '.join(duplicates)}: give one a name")
    return tools
