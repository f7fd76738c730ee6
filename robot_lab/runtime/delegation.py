"""Delegation: one robot hands a task to another and gets its result, now or later.

The delegatee is a live :class:`Robot` in this process (the Ruby gem's behaviour), or a robot
*name*, in which case the task travels over the bus (``Bus.request``) to whichever worker
serves that robot, and the reply comes back on a private reply stream. A future settles
once; ``value(timeout)`` raises ``DelegationTimeout("Delegation to 'X' timed out after
Ns")`` and re-raises the delegatee's error on every call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from robot_lab.errors import AwaitTimeout, DelegationTimeout, InferenceError, InputRequired, RemoteError
from robot_lab.schemas.messages import RobotResult, TextMessage


class DelegationFuture:
    """The pending result of ``delegate(..., async_=True)``."""

    def __init__(self, robot_name: str, delegated_by: str | None = None) -> None:
        self.robot_name = robot_name
        self.delegated_by = delegated_by
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._value: RobotResult | None = None
        self._error: BaseException | None = None

    @property
    def resolved(self) -> bool:
        """True once the delegation succeeded or failed."""
        return self._done.is_set()

    def resolve(self, value: RobotResult) -> None:
        with self._lock:
            self._value, self._error = value, None
            self._done.set()

    def reject(self, error: BaseException) -> None:
        with self._lock:
            self._value, self._error = None, error
            self._done.set()

    def value(self, timeout: float | None = None) -> RobotResult:
        if not self._done.wait(timeout):
            raise DelegationTimeout(f"Delegation to '{self.robot_name}' timed out after {timeout:g}s")
        with self._lock:
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value

    wait = value

    def __repr__(self) -> str:
        state = "resolved" if self.resolved else "pending"
        return f"<DelegationFuture {self.robot_name} {state}>"


def _remote(to: str, task: str, *, delegated_by: str, timeout: float, bus: Any = None) -> RobotResult:
    """``task`` to the robot ``to`` over the bus. A question the delegatee asks back
    (``input_required``) is asked as the delegating robot's own (``request_input``): answered
    by its ``on_input`` or terminal, or it parks the delegating step with the delegatee's
    request recorded beside its own, and the resumed step (on any worker) sends the answer on
    and waits for the delegatee's reply."""
    from robot_lab.bus import Bus  # lazy: start-up time

    bus = bus or Bus()
    started = time.monotonic()
    reply = _resumed(bus, to, delegated_by, timeout)
    if reply is None:
        reply = _request(bus, to, task, delegated_by=delegated_by, timeout=timeout)
    while reply.kind == "input_required":  # the delegatee parked on a question (docs/durable.md)
        asked = reply.content if isinstance(reply.content, dict) else {}
        answer = _ask(to, asked, reply.conversation_id, delegated_by)
        reply = _send_answer(bus, to, asked.get("request_id"), answer, reply.conversation_id, delegated_by, timeout)
    content = reply.content if isinstance(reply.content, str) else str(reply.content)
    return RobotResult(
        robot_name=to,
        output=[TextMessage(content=content, stop_reason="stop")],
        stop_reason="stop",
        duration=time.monotonic() - started,
        delegated_by=delegated_by,
    )


def _request(bus: Any, to: str, content: Any, *, delegated_by: str, timeout: float, **kwargs: Any) -> Any:
    try:
        return bus.request(to, content, timeout=timeout, from_=delegated_by, **kwargs)
    except AwaitTimeout as exc:
        raise DelegationTimeout(f"Delegation to '{to}' timed out after {timeout:g}s") from exc
    except RemoteError as exc:  # the delegatee's worker gave up on the task: re-raise here
        raise InferenceError(f"Delegation to '{to}' failed: {exc}") from exc


def _ask(to: str, asked: dict[str, Any], conversation: str | None, delegated_by: str) -> Any:
    """The delegatee's question as this robot's own: its answer, or InputRequired parking the
    step (with the delegatee's request as the request's context)."""
    from robot_lab.runtime.durable import human  # lazy: start-up time

    question = str(asked.get("question") or "(no question given)")
    context = {"delegatee": to, "delegatee_request": asked.get("request_id"), "conversation_id": conversation}
    try:
        return human.request_input(question, choices=asked.get("choices"), default=asked.get("default"),
                                   kind=str(asked.get("kind") or "question"), context=context)
    except InputRequired as exc:
        if human.can_park():
            raise  # the step parks; the resumed step answers the delegatee (_resumed)
        raise InferenceError(f"Delegation to '{to}' waits for a person's answer to {question!r} "
                             f"(request {asked.get('request_id')}) and {delegated_by!r} cannot ask its user: "
                             f"{exc}") from None


def _send_answer(bus: Any, to: str, request_id: Any, answer: Any, conversation: str | None, delegated_by: str,
                 timeout: float) -> Any:
    return _request(bus, to, {"text": answer.text, "approved": answer.approved}, delegated_by=delegated_by,
                    timeout=timeout, kind="answer", in_reply_to=request_id, conversation_id=conversation)


def _resumed(bus: Any, to: str, delegated_by: str, timeout: float) -> Any:
    """On a resumed attempt of the step that delegated: the delegatee's reply to the answer of
    the question it asked before the step parked (None on a first attempt)."""
    from robot_lab.runtime.durable import human  # lazy: start-up time

    recorded = human.recorded_requests()
    ours = [r for r in recorded if (r.get("context") or {}).get("delegatee") == to]
    if not ours:
        return None
    human.skip_recorded(len(recorded) - 1)  # the questions settled before are passed over
    last = ours[-1]
    context = last["context"]
    from robot_lab.bus.parking import is_parked  # lazy: start-up time

    if not is_parked(bus, to, str(context.get("delegatee_request"))):
        raise InferenceError(f"Delegation to '{to}': its question {last.get('question')!r} was answered before this "
                             "run was interrupted and no longer waits; its reply went to the interrupted attempt")
    asked = {**last, "request_id": context.get("delegatee_request")}
    answer = _ask(to, asked, context.get("conversation_id"), delegated_by)  # the recorded answer, now
    return _send_answer(bus, to, context.get("delegatee_request"), answer, context.get("conversation_id"),
                        delegated_by, timeout)


def delegate(
    to: Any,
    task: str,
    *,
    delegated_by: str,
    async_: bool = False,
    timeout: float = 120.0,
    bus: Any = None,
    **run_kwargs: Any,
) -> RobotResult | DelegationFuture:
    """Run ``task`` on ``to`` (a Robot or a robot name served by a worker)."""
    name = to if isinstance(to, str) else to.name

    def work() -> RobotResult:
        if isinstance(to, str):
            return _remote(to, task, delegated_by=delegated_by, timeout=timeout, bus=bus)
        started = time.monotonic()
        policy = getattr(to, "serve_policy", None)  # a delegatee offers what it was built with
        result = to.run(task, **{**(policy() if callable(policy) else {}), **run_kwargs})
        result.duration = time.monotonic() - started
        result.delegated_by = delegated_by
        return result

    if not async_:
        return work()
    future = DelegationFuture(name, delegated_by)
    _start(work, future)
    return future


def _start(work: Callable[[], RobotResult], future: DelegationFuture) -> None:
    def target() -> None:
        try:
            future.resolve(work())
        except BaseException as exc:  # settled as an error; re-raised by value()
            future.reject(exc)

    threading.Thread(target=target, name=f"delegate-{future.robot_name}", daemon=True).start()
