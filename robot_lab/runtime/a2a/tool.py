"""A remote Agent2Agent agent offered to the model as one tool.

A robot built with ``a2a_agents=["http://host/robots/billing/.well-known/agent-card.json"]``
(or entries ``{"url": ..., "name": ..., "description": ...}``) gets a tool per agent that
sends the model's ``message`` to it and returns the agent's answer. Nothing connects
until the model calls the tool: the card is fetched then (and kept a while), each call has a
timeout, and a failed connection or a 5xx is retried. The agent's answer is its task's
artifacts (or its final status message); a task that fails, is cancelled or rejected is a
tool error the model reads. An agent that asks a question back (``input-required``) is a
tool error too until the robot can ask its own user (:func:`input_required`).

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

from robot_lab.errors import ConfigurationError, ToolError
from robot_lab.logging import get_logger
from robot_lab.runtime.tools import Tool

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


def input_required(task: Any, agent: str) -> str:
    """What the robot does with a remote agent's question (``input-required``).

    The seam of the human-input bridge: a robot that cannot ask its own user (all of them,
    until runs can park for input) gets the question as a tool error, so the model can
    answer with what it has or tell its caller what is missing."""
    question = _text_of(task.status.message) if task.status.HasField("message") else ""
    raise ToolError(f"agent {agent} needs more input before it can answer: {question or '(no question given)'}")


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
        from robot_lab.settings import get_settings

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
        import httpx

        settings = self._settings()
        timeout = float(self.entry.get("timeout") or settings.client_timeout)
        token = self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
            card = await self._retrying(lambda: self._resolve(http), settings.client_retries, "fetch the agent card")
            try:
                task = await asyncio.wait_for(self._send(http, card, message), timeout)
            except asyncio.TimeoutError:
                raise ToolError(f"agent {self.url} did not answer within {timeout:g} s", retryable=True) from None
        return self._answer(task)

    async def _resolve(self, http: Any) -> Any:
        cached = _cards.get(self.url)
        if cached is not None and time.monotonic() - cached[0] < CARD_TTL:
            return cached[1]
        from a2a.client import A2ACardResolver

        base = self.url[: -len(CARD_SUFFIX)] if self.url.endswith(CARD_SUFFIX) else self.url
        card = await A2ACardResolver(http, base, CARD_SUFFIX).get_agent_card()
        _cards[self.url] = (time.monotonic(), card)
        return card

    async def _send(self, http: Any, card: Any, text: str) -> Any:
        from a2a.client import ClientConfig, ClientFactory
        from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, Role, SendMessageRequest

        from robot_lab.schemas import new_id

        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        request = SendMessageRequest(message=Message(message_id=new_id(), role=Role.ROLE_USER, parts=[Part(text=text)]))
        response = None
        async for response in client.send_message(request):
            pass
        if response is None or not response.HasField("task"):
            return response.message if response is not None else None
        task = response.task
        while task.status.state in (1, 2):  # SUBMITTED / WORKING: the server stopped waiting, poll
            await asyncio.sleep(0.5)
            task = await client.get_task(GetTaskRequest(id=task.id))
        return task

    async def _retrying(self, call: Any, retries: int, what: str) -> Any:
        from a2a.client import AgentCardResolutionError

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
        from a2a.types.a2a_pb2 import Message, TaskState

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
        if state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
            return input_required(result, self.url)
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
