"""The tool loop of one run: model -> tool calls -> results -> model, until the model
answers with text. Around it: the budget protocol of every model call, the
``max_tool_rounds`` circuit breaker, the doom-loop warning, tool hooks and streaming.

This is the seam pydantic-ai draws too: the loop is apart from the model layer (the
gateway) and from how the prompt and the offered tools were chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.errors import InputRequired, ToolLoopError
from robot_lab.runtime.durable.steps import StepRunner
from robot_lab.llm.gateway import Chunk, LLMResponse
from robot_lab.runtime.rails import budget as budget_mod
from robot_lab.runtime.rails.doom_loop import DEFAULT_THRESHOLD as DOOM_LOOP_THRESHOLD
from robot_lab.runtime.rails.doom_loop import DoomLoopDetector, with_warning
from robot_lab.runtime.rails.hooks import ToolCallHookContext
from robot_lab.runtime.robot.drive import IO, SYNC
from robot_lab.runtime.robot.plan import TurnPlan
from robot_lab.runtime.tools import Tool
from robot_lab.schemas.messages import (
    Message,
    RobotResult,
    TextMessage,
    ToolCall,
    ToolCallMessage,
    ToolResultMessage,
)

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

ContentCallback = Callable[[Chunk], Any]
# Provider finish reasons a reply keeps (a cut reply must not look complete); others are "stop".
_KEPT_FINISH_REASONS = ("length", "content_filter")


def stop_reason(response: LLMResponse) -> str:
    return response.finish_reason if response.finish_reason in _KEPT_FINISH_REASONS else "stop"


def add_usage(robot: RobotParts, response: LLMResponse) -> None:
    """Add one response's tokens and cost to the robot's running totals."""
    robot.total_input_tokens += response.input_tokens
    robot.total_output_tokens += response.output_tokens
    robot.total_cost += response.cost


async def call_model(
    robot: RobotParts,
    plan: TurnPlan,
    specs: list[dict[str, Any]] | None,
    on_chunk: Callable[[Chunk], Any] | None,
    ledgers: list[Any],
    io: IO = SYNC,
) -> LLMResponse:
    """One model call inside the budget protocol: reserve the call's estimate (waiting while
    other calls' reservations may come back; BudgetExceeded before the call when spent),
    reconcile actual usage, then InferenceError on overrun. Model, provider and parameters
    come from the run plan."""
    config = plan.config

    async def complete() -> LLMResponse:
        return await io.complete(robot.gateway, plan.model, robot.messages, tools=specs, on_chunk=on_chunk,  # type: ignore[no-any-return]
                                 params=plan.llm_params(), provider=plan.provider, robot=robot.name)

    if not ledgers:
        response = await complete()
        add_usage(robot, response)
        return response
    estimate = budget_mod.estimate_call(plan.model, robot.messages, specs, config.max_tokens)
    reservation = await io.blocking(budget_mod.reserve_for_call, ledgers, estimate)
    try:
        response = await complete()
    except BaseException:
        budget_mod.release(reservation)
        raise
    add_usage(robot, response)
    await io.blocking(_settle, robot, reservation, response, ledgers)
    return response


def _settle(robot: RobotParts, reservation: Any, response: LLMResponse, ledgers: list[Any]) -> None:
    """After a call: reconcile its reservation with what it used, then check every budget --
    unless the call stayed within what it reserved: then it keeps its answer, even when other
    calls in flight ran a shared budget over (budget.within_reservation)."""
    used = response.input_tokens + response.output_tokens
    budget_mod.reconcile(reservation, used, response.cost)
    within = budget_mod.within_reservation(reservation, used, response.cost)
    budget_mod.check_budgets(
        [] if within else ledgers,
        tokens_used=robot.total_input_tokens + robot.total_output_tokens if robot.config.token_budget else None,
        token_budget=robot.config.token_budget,  # the robot's own budget; run-wide ones are ledgers
    )


async def execute_tool(robot: RobotParts, by_name: Mapping[str, Tool], name: str, arguments: dict[str, Any],
                       io: IO = SYNC) -> str:
    """Call one offered tool inside the ``tool_call`` hooks; an unknown name is an error
    text for the model, never an exception."""
    tool = by_name.get(name)
    if tool is None:
        return f"Error: tool {name!r} is not available (offered: {', '.join(by_name) or 'none'})"
    ctx = ToolCallHookContext(tool=tool, tool_name=name, tool_args=dict(arguments), robot=robot)

    async def core() -> str:
        text = await io.call_tool(tool, arguments)
        if text.startswith(f"Error ({name})"):
            ctx.tool_error = RuntimeError(text)
        return text

    result = await io.hooks("tool_call", ctx, core)
    return result if isinstance(result, str) else str(result)


def this_turn_start(messages: list[dict[str, Any]]) -> int:
    """The index of this turn's user message: the step journal fingerprints the turn (the
    system prompt and what follows that message), not the history before it, which a
    redelivered message may meet differently (another slot's default conversation, or its own
    turn already saved by the attempt that crashed)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return 0


async def tool_loop(
    robot: RobotParts,
    plan: TurnPlan,
    message: str | None,
    tools: list[Tool] | Callable[[], list[Tool]],
    on_content: ContentCallback | None,
    io: IO = SYNC,
) -> RobotResult:
    """Run ``robot``'s conversation to a text answer under ``plan``; the offered tools may
    be a callable (tool-mode skills change them between rounds). ``io`` is the driver
    (:mod:`.drive`): blocking for ``run()``, awaiting for ``arun()``."""
    started = time.monotonic()
    await io.maybe_blocking(robot._compaction_may_block, robot._maybe_compact)
    config = plan.config
    active_ledgers = [ledger for ledger in plan.ledgers if ledger is not None]
    detector = plan.doom_loop or DoomLoopDetector(config.doom_loop_threshold or DOOM_LOOP_THRESHOLD)
    before = len(robot.messages)
    if message is not None:
        robot.messages.append({"role": "user", "content": message})
    offer = tools if callable(tools) else (lambda: tools)
    callbacks = [cb for cb in (config.on_content, on_content) if cb is not None]
    on_chunk = (lambda chunk: [cb(chunk) for cb in callbacks]) if callbacks else None
    max_rounds = plan.max_tool_rounds
    steps = StepRunner.begin(robot.name, config.input_timeout)
    try:
        return await _rounds(robot, plan, offer, on_chunk, active_ledgers, detector, max_rounds, started, steps, io)
    except InputRequired:
        # the turn parked on a question: the answer re-runs it whole (on any slot or worker),
        # so this robot's conversation is left as it was, with no tool call lacking its result
        # (a provider refuses such a history on the next turn) and no user message twice
        del robot.messages[before:]
        raise
    finally:
        steps.end()


async def _rounds(robot: RobotParts, plan: TurnPlan, offer: Callable[[], list[Tool]], on_chunk: Any, active_ledgers: list[Any],
                  detector: Any, max_rounds: int, started: float, steps: StepRunner, io: IO) -> RobotResult:
    """The loop itself: each model call and each tool call is a step of ``steps``."""
    config = plan.config
    turn_start = this_turn_start(robot.messages)
    output: list[Message] = []
    results: list[ToolResultMessage] = []
    input_tokens = output_tokens = 0
    cost = 0.0
    calls_made = 0
    while True:
        offered = offer()
        specs = [t.to_openai() for t in offered] or None
        by_name = {t.name: t for t in offered}
        response = await steps.model(plan.model, robot.messages, specs,
                                     lambda: call_model(robot, plan, specs, on_chunk, active_ledgers, io), io,
                                     turn_start=turn_start)
        if steps.replayed:  # from the journal: counted in the totals, not paid again
            add_usage(robot, response)
        input_tokens += response.input_tokens
        output_tokens += response.output_tokens
        cost += response.cost
        robot.messages.append(response.assistant_message())
        if not response.tool_calls:
            text = response.content or response.reasoning or ""
            output.append(TextMessage(content=text, stop_reason=stop_reason(response)))  # type: ignore[arg-type]
            break
        output.append(
            ToolCallMessage(
                tools=[ToolCall(id=c.id, name=c.name, input=c.arguments) for c in response.tool_calls],
                content=response.content or "",
            )
        )
        for call in response.tool_calls:
            calls_made += 1
            if calls_made > max_rounds:
                raise ToolLoopError(
                    f"Circuit breaker triggered: {calls_made} tool calls exceeded max_tool_rounds ({max_rounds})"
                )
            record = ToolCall(id=call.id, name=call.name, input=call.arguments)

            async def live(call: Any = call, record: ToolCall = record, by_name: Any = by_name) -> str:
                if config.on_tool_call:
                    config.on_tool_call(record)
                text = await execute_tool(robot, by_name, call.name, call.arguments, io)
                warning = detector.observe(call.name)
                return with_warning(text, warning) if warning else text

            if call.argument_error:  # never run a tool on arguments it was not given (nor ask to approve them)
                text = f"Error: {call.argument_error}; {call.name} was not called, send valid JSON arguments"
            else:
                # a step: replayed from the journal (no call, no events), or approved and run live
                text = await steps.tool(by_name.get(call.name), call.name, call.arguments, live, io)
            robot.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})
            is_error = text.startswith(("Error (", "Error:"))
            result_msg = ToolResultMessage(tool=record, content={"error": text} if is_error else {"data": text})
            output.append(result_msg)
            results.append(result_msg)
            if config.on_tool_result and not steps.replayed:  # its events went out the first time
                config.on_tool_result(result_msg)
    return RobotResult(
        robot_name=robot.name,
        output=output,
        tool_calls=results,
        stop_reason=output[-1].stop_reason or "stop",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=cost,
        duration=time.monotonic() - started,
    )
