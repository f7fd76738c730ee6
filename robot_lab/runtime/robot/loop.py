"""The tool loop of one run: model -> tool calls -> results -> model, until the model
answers with text. Around it: the budget protocol of every model call, the
``max_tool_rounds`` circuit breaker, the doom-loop warning, tool hooks and streaming.

This is the seam pydantic-ai draws too: the loop is apart from the model layer (the
gateway) and from how the prompt and the offered tools were chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from robot_lab.errors import ToolLoopError
from robot_lab.runtime.llm.gateway import Chunk, LLMResponse
from robot_lab.runtime.rails import budget as budget_mod
from robot_lab.runtime.rails.doom_loop import DEFAULT_THRESHOLD as DOOM_LOOP_THRESHOLD
from robot_lab.runtime.rails.doom_loop import DoomLoopDetector, with_warning
from robot_lab.runtime.rails.hooks import ToolCallHookContext, run_hooks
from robot_lab.runtime.tools import Tool
from robot_lab.schemas.messages import (
    Message,
    RobotResult,
    TextMessage,
    ToolCall,
    ToolCallMessage,
    ToolResultMessage,
)

ContentCallback = Callable[[Chunk], Any]


def add_usage(robot: Any, response: LLMResponse) -> None:
    """Add one response's tokens and cost to the robot's running totals."""
    robot.total_input_tokens += response.input_tokens
    robot.total_output_tokens += response.output_tokens
    robot.total_cost += response.cost


def call_model(
    robot: Any,
    specs: list[dict[str, Any]] | None,
    on_chunk: Callable[[Chunk], Any] | None,
    params: dict[str, Any],
    ledgers: list[Any],
) -> LLMResponse:
    """One model call inside the budget protocol: reserve the call's estimate (waiting while
    other calls' reservations may come back; BudgetExceeded before the call when spent),
    reconcile actual usage, then InferenceError on overrun."""
    config = robot.config
    if not ledgers:
        response = robot.gateway.complete(robot.model, robot.messages, tools=specs, on_chunk=on_chunk, params=params)
        add_usage(robot, response)
        return response
    estimate = budget_mod.estimate_call(robot.model, robot.messages, specs, config.max_tokens)
    reservation = budget_mod.reserve_for_call(ledgers, estimate)
    try:
        response = robot.gateway.complete(robot.model, robot.messages, tools=specs, on_chunk=on_chunk, params=params)
    except BaseException:
        budget_mod.release(reservation)
        raise
    budget_mod.reconcile(reservation, response.input_tokens + response.output_tokens, response.cost)
    add_usage(robot, response)
    budget_mod.check_budgets(
        ledgers,
        tokens_used=robot.total_input_tokens + robot.total_output_tokens if config.token_budget else None,
        token_budget=config.token_budget,
    )
    return response


def execute_tool(robot: Any, by_name: Mapping[str, Tool], name: str, arguments: dict[str, Any]) -> str:
    """Call one offered tool inside the ``tool_call`` hooks; an unknown name is an error
    text for the model, never an exception."""
    tool = by_name.get(name)
    if tool is None:
        return f"Error: tool {name!r} is not available (offered: {', '.join(by_name) or 'none'})"
    ctx = ToolCallHookContext(tool=tool, tool_name=name, tool_args=dict(arguments), robot=robot)

    def core() -> str:
        text = tool.call(arguments)
        if text.startswith(f"Error ({name})"):
            ctx.tool_error = RuntimeError(text)
        return text

    result = run_hooks("tool_call", ctx, core)
    return result if isinstance(result, str) else str(result)


def tool_loop(
    robot: Any,
    message: str | None,
    tools: list[Tool] | Callable[[], list[Tool]],
    on_content: ContentCallback | None,
    *,
    ledgers: Sequence[Any] = (),
    doom: Any = None,
) -> RobotResult:
    """Run ``robot``'s conversation to a text answer; the offered tools may be a callable
    (tool-mode skills change them between rounds)."""
    started = time.monotonic()
    robot._maybe_compact()
    config = robot.config
    active_ledgers = [ledger for ledger in ledgers if ledger is not None]
    detector = doom or DoomLoopDetector(config.doom_loop_threshold or DOOM_LOOP_THRESHOLD)
    if message is not None:
        robot.messages.append({"role": "user", "content": message})
    offer = tools if callable(tools) else (lambda: tools)
    callbacks = [cb for cb in (config.on_content, on_content) if cb is not None]
    on_chunk = (lambda chunk: [cb(chunk) for cb in callbacks]) if callbacks else None
    params = config.llm_params()
    max_rounds = config.max_tool_rounds
    output: list[Message] = []
    results: list[ToolResultMessage] = []
    input_tokens = output_tokens = 0
    cost = 0.0
    calls_made = 0
    while True:
        offered = offer()
        specs = [t.to_openai() for t in offered] or None
        by_name = {t.name: t for t in offered}
        response = call_model(robot, specs, on_chunk, params, active_ledgers)
        input_tokens += response.input_tokens
        output_tokens += response.output_tokens
        cost += response.cost
        robot.messages.append(response.assistant_message())
        if not response.tool_calls:
            text = response.content or response.reasoning or ""
            output.append(TextMessage(content=text, stop_reason="stop"))
            break
        output.append(
            ToolCallMessage(
                tools=[ToolCall(id=c.id, name=c.name, input=c.arguments) for c in response.tool_calls],
                content=response.content or "",
            )
        )
        for call in response.tool_calls:
            calls_made += 1
            if max_rounds is not None and calls_made > max_rounds:
                raise ToolLoopError(
                    f"Circuit breaker triggered: {calls_made} tool calls exceeded max_tool_rounds ({max_rounds})"
                )
            record = ToolCall(id=call.id, name=call.name, input=call.arguments)
            if config.on_tool_call:
                config.on_tool_call(record)
            text = execute_tool(robot, by_name, call.name, call.arguments)
            warning = detector.observe(call.name)
            if warning:
                text = with_warning(text, warning)
            robot.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})
            is_error = text.startswith(("Error (", "Error:"))
            result_msg = ToolResultMessage(tool=record, content={"error": text} if is_error else {"data": text})
            output.append(result_msg)
            results.append(result_msg)
            if config.on_tool_result:
                config.on_tool_result(result_msg)
    return RobotResult(
        robot_name=robot.name,
        output=output,
        tool_calls=results,
        stop_reason="stop",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=cost,
        duration=time.monotonic() - started,
    )
