"""The step runner: what the tool loop calls around each model call and each tool call.

Without a durable scope it only numbers steps and runs them (plus approvals and
``on_input`` for human input). In a durable scope each step is first looked up in the
journal: a finished step is *replayed* (its recorded result returned, no model call, no
tool call, no streamed text, no tool events); otherwise it runs live, emitting
``step.started`` then ``step.completed`` (or ``step.failed``), and its result is written to
the journal before the loop goes on (a model reply asking for no tool, in a network task:
with the task's result, see ``Journal.write``). A tool step that needs a person's answer records an
input request, journals the step as ``waiting`` and raises :class:`InputRequired`; the scope's
owner parks the run, and the next attempt replays up to that step and runs it with the answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, fields
from typing import Any

from robot_lab.errors import InputRequired, InputTimeout
from robot_lab.logging import get_logger
from robot_lab.runtime.durable import human
from robot_lab.runtime.durable.journal import request_hash
from robot_lab.runtime.durable.scopes import Asks, DurableScope, StepInfo, _runner, _step, take_scope
from robot_lab.llm.gateway import LLMResponse, ToolCallRequest
from robot_lab.settings import get_settings

log = get_logger("robot_lab.durable")
# LLMResponse's fields in order; those other than tool_calls hold str / int / float / bool /
# None, which asdict copies as they are.
_RESPONSE_FIELDS = tuple(f.name for f in fields(LLMResponse))


def response_record(response: LLMResponse) -> dict[str, Any]:
    """``dataclasses.asdict(response)``, built directly: the same dict (tool calls as dicts,
    their arguments deep-copied), without asdict's generic recursion over every field -- it
    runs once per model step of every durable run."""
    return {name: [asdict(call) for call in response.tool_calls] if name == "tool_calls" else getattr(response, name)
            for name in _RESPONSE_FIELDS}


def response_from(data: dict[str, Any]) -> LLMResponse:
    calls = [ToolCallRequest(**c) for c in data.get("tool_calls") or []]
    return LLMResponse(**{**data, "tool_calls": calls})


class StepRunner:
    """The steps of one tool loop (see the module docstring)."""

    def __init__(self, scope: DurableScope | None, robot: str, input_timeout: float | None = None) -> None:
        self.scope = scope
        self.robot = robot
        self.input_timeout = input_timeout
        self.index = 0
        self.replayed = False  # whether the last step came from the journal
        self._token: Any = None
        # a run nested in another's tool (an in-process delegation) asks through the outer
        # run: the outer step parks, and its answer reaches the nested question on resume
        self.parent: StepRunner | None = _runner.get()
        self.outer_step: StepInfo | None = _step.get()

    @classmethod
    def begin(cls, robot: str, input_timeout: float | None = None) -> StepRunner:
        """The runner of a tool loop starting now (it takes the pending durable scope);
        call :meth:`end` when the loop ends."""
        runner = cls(take_scope(), robot, input_timeout)
        runner._token = _runner.set(runner)
        return runner

    def end(self) -> None:
        if self._token is not None:
            _runner.reset(self._token)
            self._token = None

    # --- steps ------------------------------------------------------------------------
    async def model(self, model: str, messages: list[dict[str, Any]], specs: list[dict[str, Any]] | None,
                    call: Callable[[], Awaitable[LLMResponse]], io: Any, turn_start: int = 0) -> LLMResponse:
        """``messages[turn_start:]`` is this turn (see :func:`robot_lab.runtime.robot.loop.this_turn_start`):
        the fingerprint covers the leading system prompt and the turn, not the history between."""
        index, self.index = self.index, self.index + 1
        self.replayed = False
        if self.scope is None:
            return await call()
        head = messages[:1] if turn_start and messages[0].get("role") == "system" else []
        digest = request_hash({"model": model, "messages": head + messages[turn_start:], "tools": specs})
        record = await io.blocking(self.scope.journal.replay, index, "model", model, digest)
        if record is not None and record.get("status") == "done":
            self.replayed = True
            return response_from(record["result"])
        if self.scope.journal.unwritten:  # the step before (a last one, after all) is in Redis first
            await io.blocking(self.scope.journal.flush)
        started = self._started(index, "model", model)
        try:
            response = await call()
        except BaseException as exc:
            self._failed(index, "model", model, started, exc)
            raise
        result = response_record(response) if type(response) is LLMResponse else asdict(response)
        tokens = {"input_tokens": response.input_tokens, "output_tokens": response.output_tokens}
        # a reply asking for no tool is the run's last step unless its loop goes on (Journal.write)
        await io.blocking(self._done, index, "model", model, digest, started, result, tokens,
                          last=not response.tool_calls)
        return response

    async def tool(self, tool: Any, name: str, arguments: dict[str, Any],
                   call: Callable[[], Awaitable[str]], io: Any) -> str:
        index, self.index = self.index, self.index + 1
        self.replayed = False
        scope = self.scope
        digest = request_hash({"tool": name, "arguments": arguments})
        record = None
        if scope is not None:
            record = await io.blocking(scope.journal.replay, index, "tool", name, digest)
            if record is not None and record.get("status") == "done":
                self.replayed = True
                return str(record["result"])
        if scope is None and self.outer_step is not None:
            asks = self.outer_step.asks  # a nested run asks through the outer step
        else:
            asks = Asks(list(record.get("requests") or []) if record is not None else [])
        step = StepInfo(index, "tool", name, f"{scope.id}:{index}" if scope else None,
                        scope.id if scope else None, asks)
        if scope is not None and scope.journal.unwritten:  # every step before it is in Redis first
            await io.blocking(scope.journal.flush)
        started = self._started(index, "tool", name) if scope is not None else time.monotonic()
        token = _step.set(step)
        try:
            denial = (await io.maybe_blocking(self._approval_may_block, self._approve, tool, name, arguments)
                      if tool is not None else None)
            text = denial if denial is not None else await call()
        except InputRequired as exc:
            if exc.timeout is None:
                exc.timeout = getattr(tool, "input_timeout", None)
            if scope is None or scope.inputs is None:
                raise
            await io.blocking(self._park, step, digest, exc)
            raise
        except BaseException as exc:
            if scope is not None:
                self._failed(index, "tool", name, started, exc)
            raise
        finally:
            _step.reset(token)
        if scope is not None:
            await io.blocking(self._done, index, "tool", name, digest, started, text, None)
        return text

    @staticmethod
    def _approval_may_block(tool: Any, name: str, arguments: dict[str, Any]) -> bool:
        """Whether :meth:`_approve` may wait (a policy callable, a person's answer): ``arun``
        then runs it in a thread; a tool that needs no approval is let through in place."""
        policy = getattr(tool, "requires_approval", False)
        return callable(policy) or bool(policy)

    def _approve(self, tool: Any, name: str, arguments: dict[str, Any]) -> str | None:
        """None when the call may run; the refusal text the model sees when it is denied."""
        policy = getattr(tool, "requires_approval", False)
        needed = policy(arguments) if callable(policy) else bool(policy)
        if not needed:
            return None
        answer = human.request_input(
            f"Allow {name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})?",
            kind="approval", tool=name, arguments=arguments, timeout=getattr(tool, "input_timeout", None))
        if answer.approved:
            return None
        return human.denied(name, answer)

    # --- journal and events -------------------------------------------------------------
    def _emit(self, event: str, data: dict[str, Any]) -> None:
        if self.scope is None or self.scope.emit is None:
            return
        try:
            self.scope.emit(event, data)
        except Exception as exc:  # events are a side channel: never fail a step over them
            log.warning("durable.emit_failed", event=event, error=f"{type(exc).__name__}: {exc}")

    def _started(self, index: int, kind: str, name: str) -> float:
        self._emit("step.started", {"index": index, "kind": kind, "name": name})
        return time.monotonic()

    def _failed(self, index: int, kind: str, name: str, started: float, exc: BaseException) -> None:
        if isinstance(exc, InputRequired):
            return
        self._emit("step.failed", {"index": index, "kind": kind, "name": name,
                                   "duration": round(time.monotonic() - started, 4),
                                   "error": f"{type(exc).__name__}: {exc}"[:500]})

    def _done(self, index: int, kind: str, name: str, digest: str, started: float, result: Any,
              tokens: dict[str, int] | None, last: bool = False) -> None:
        assert self.scope is not None
        duration = round(time.monotonic() - started, 4)
        self.scope.journal.write(index, {"kind": kind, "name": name, "hash": digest, "status": "done",
                                         "result": result, "duration": duration}, last=last)
        self._emit("step.completed", {"index": index, "kind": kind, "name": name, "duration": duration,
                                      **(tokens or {})})

    def _park(self, step: StepInfo, digest: str, exc: InputRequired) -> None:
        """Record the request and journal the step as waiting for it."""
        scope = self.scope
        assert scope is not None and scope.inputs is not None
        timeout = exc.timeout if exc.timeout is not None else self.input_timeout
        if timeout is None:
            timeout = get_settings().durable.input_timeout
        now = time.time()
        waiting = step.asks.next_recorded()  # a re-run of a still-unanswered request keeps it
        request = {"id": waiting or uuid.uuid4().hex, "question": exc.question, "choices": exc.choices,
                   "default": exc.default, "kind": exc.kind, "tool": exc.tool or step.name,
                   "arguments": exc.arguments, "robot": self.robot, "step": step.index, "scope": scope.id,
                   "created_at": now, "deadline": now + timeout if timeout else None}
        if exc.context:
            request["context"] = exc.context
        if waiting is None:
            scope.inputs.create(request, scope.owner, scope.ttl)
            step.asks.ids.append(request["id"])
            scope.journal.write(step.index, {"kind": "tool", "name": step.name, "hash": digest,
                                             "status": "waiting", "requests": step.asks.ids})
        exc.request = request  # the owner parks the run and emits hitl.requested with it

    def effective_scope(self) -> DurableScope | None:
        """This run's scope, else the scope of the run this one is nested in."""
        if self.scope is not None or self.parent is None:
            return self.scope
        return self.parent.effective_scope()

    def request_for(self, request_id: str) -> Any:
        """The recorded request ``request_id`` (an InputRequest, None when gone)."""
        if self.scope is None or self.scope.inputs is None:
            return self.parent.request_for(request_id) if self.parent is not None else None
        return self.scope.inputs.get(request_id)

    def answer_for(self, request_id: str) -> Any:
        """The recorded answer of ``request_id`` (None while it waits); a timed-out request
        without a default raises :class:`InputTimeout`."""
        if self.scope is None or self.scope.inputs is None:
            return self.parent.answer_for(request_id) if self.parent is not None else None
        found = self.scope.inputs.get(request_id)
        if found is None or found.answer is None:
            return None
        if found.answer.timed_out and found.request.get("default") is None and found.request.get("kind") != "approval":
            raise InputTimeout(f"input request {request_id} ({found.question!r}) timed out with no default answer")
        return found.answer
