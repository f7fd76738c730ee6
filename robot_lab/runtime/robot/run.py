"""One run of a robot: hooks and log context around it, the prompt re-rendered with
run-time context, the tools offered (local, MCP, skills), learnings injected, then the
tool loop. Conversations stored in Redis wrap a run so any worker can continue them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from robot_lab.logging import log_context
from robot_lab.runtime.rails.hooks import (
    HookRegistry,
    LlmGenerationHookContext,
    RunHookContext,
    hook_scope,
    run_hooks,
)
from robot_lab.runtime.robot.loop import ContentCallback, tool_loop
from robot_lab.runtime.robot.prompt import set_system_message
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.tools import Tool
from robot_lab.schemas.messages import RobotResult


def execute(
    robot: Any,
    message: str | None,
    *,
    tools: Any,
    mcp: Any,
    network_config: RunConfig | Mapping[str, Any] | None,
    on_content: ContentCallback | None,
    extra_tools: Iterable[Tool],
    hooks: Any,
    network_hooks: HookRegistry | None,
    network: Any,
    task: str | None,
    memory: Any,
    run_id: str | None,
    budgets: Iterable[Any],
    doom_loop: Any,
    context: Mapping[str, Any],
    attachments: Iterable[Any] | None = None,
) -> RobotResult:
    """The body of ``Robot.run`` (see there for the arguments)."""
    per_run = HookRegistry([hooks] if hooks is not None and not isinstance(hooks, (list, tuple)) else hooks or [])
    with log_context(robot=robot.name, run_id=run_id, task=task), hook_scope(network_hooks, robot.hooks, per_run):
        net_config = (
            network_config
            if isinstance(network_config, RunConfig) or network_config is None
            else RunConfig(network_config)
        )
        ctx = RunHookContext(
            robot=robot, network=network, task=task, memory=memory, config=robot.config, request=message,
            run_id=run_id,
        )

        def core() -> RobotResult:
            if context or robot._prompt.render_deferred:
                robot._apply_system_prompt(context)
            selected = robot.select_tools(tools, network_config=net_config, extra=extra_tools)
            mcp_tools = robot._mcp.tools_for_run(mcp, ctx.request, robot.config.mcp, net_config)
            if isinstance(tools, (list, tuple)) and tools:
                mcp_tools = [t for t in mcp_tools if t.name in tools]  # a name list filters MCP tools too
            taken = {t.name for t in selected}
            selected += [t for t in mcp_tools if t.name not in taken]
            gen_ctx = LlmGenerationHookContext(
                robot=robot, network=network, task=task, memory=memory, config=robot.config,
                request=ctx.request, run_id=run_id,
            )
            saved_prompt = robot.instructions
            try:
                offered = robot._prompt.with_agent_skills(
                    robot.messages, robot.skill_mode, ctx.request, selected, saved_prompt, robot_name=robot.name,
                    scope=getattr(robot, "_skill_scope", None) or run_id, attachments=attachments,
                )
                return run_hooks(
                    "llm_generation",
                    gen_ctx,
                    lambda: tool_loop(
                        robot,
                        robot._learning.inject(gen_ctx.request),
                        offered,
                        on_content,
                        ledgers=[robot.budget_ledger, *budgets],
                        doom=doom_loop,
                    ),
                )
            finally:
                set_system_message(robot.messages, saved_prompt)  # matched skills last one run only

        return run_hooks("run", ctx, core)


def run_in_conversation(robot: Any, conversation_id: str, message: str | None, **kwargs: Any) -> RobotResult:
    """Load the conversation's history from Redis, run, save it back; the robot's own
    messages are restored afterwards."""
    from robot_lab.runtime.conversations import ConversationStore

    store = ConversationStore()
    system = robot.messages[:1] if robot.instructions is not None else []
    saved = robot.messages
    history = [m for m in store.load(robot.name, conversation_id) if m.get("role") != "system"]
    robot.messages = [*system, *history]
    robot._skill_scope = conversation_id  # the conversation's skill workspace and sticky skills
    try:
        result = robot.run(message, **kwargs)
        store.save(robot.name, conversation_id, [m for m in robot.messages if m.get("role") != "system"])
        return result
    finally:
        robot.messages = saved
        robot._skill_scope = None
