"""One turn of a robot: the run plan resolved, hooks and log context around it, the
prompt re-rendered with run-time context, the tools offered (local, MCP, skills),
learnings injected, then the tool loop. Conversations stored in Redis wrap a run so any
worker can continue them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from robot_lab import coalesce
from robot_lab.keys import default_keys
from robot_lab.logging import log_context
from robot_lab.observability import instrument as observe
from robot_lab.runtime.conversations import ConversationStore
from robot_lab.runtime.rails.hooks import (
    HookRegistry,
    LlmGenerationHookContext,
    RunHookContext,
    hook_scope,
)
from robot_lab.runtime.durable.scopes import DurableScope, current_scope, durable_scope, input_handler, local_scope
from robot_lab.runtime.robot.context import TurnContext, conversation_scope, turn_scope
from robot_lab.runtime.robot.drive import IO, SYNC
from robot_lab.runtime.robot.loop import ContentCallback, tool_loop
from robot_lab.runtime.robot.plan import TurnPlan, resolve_plan
from robot_lab.runtime.robot.prompt import set_system_message
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.tools import Tool
from robot_lab.schemas.messages import RobotResult

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts


async def execute(
    robot: RobotParts,
    message: str | None,
    *,
    tools: Any,
    mcp: Any,
    network_config: RunConfig | Mapping[str, Any] | None,
    task_config: RunConfig | Mapping[str, Any] | None,
    config: RunConfig | Mapping[str, Any] | None,
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
    io: IO = SYNC,
    on_input: Any = None,
    durable_id: str | DurableScope | None = None,
) -> RobotResult:
    """The body of ``Robot.run`` and ``Robot.arun`` (see there for the arguments); ``io`` is
    the driver (:mod:`.drive`)."""
    plan = resolve_plan(
        robot, tools=tools, mcp=mcp, network_config=network_config, task_config=task_config, run_config=config,
        memory=memory, network=network, budgets=budgets, doom_loop=doom_loop,
    )
    observe.agent_model(plan.model, plan.provider)  # on the robot.run span, now that they are known
    per_run = HookRegistry([hooks] if hooks is not None and not isinstance(hooks, (list, tuple)) else hooks or [])
    run_ctx = TurnContext(robot=robot, memory=plan.memory, plan=plan, task=task, run_id=run_id, network=network)
    scope = (durable_id if isinstance(durable_id, DurableScope) else
             local_scope(durable_id) if durable_id is not None else current_scope())
    with log_context(robot=robot.name, run_id=run_id, task=task), \
            hook_scope(network_hooks, robot.hooks, per_run), turn_scope(run_ctx), \
            durable_scope(scope), input_handler(on_input):
        ctx = RunHookContext(
            robot=robot, network=network, task=task, memory=plan.memory, config=plan.config, request=message,
            run_id=run_id,
        )

        async def core() -> RobotResult:
            if context or robot._prompt.render_deferred:
                robot._apply_system_prompt(context)
            selected = await io.maybe_blocking(tools_may_block, offered_tools, robot, plan, ctx.request, extra_tools)
            gen_ctx = LlmGenerationHookContext(
                robot=robot, network=network, task=task, memory=plan.memory, config=plan.config,
                request=ctx.request, run_id=run_id,
            )
            saved_prompt = robot.instructions
            try:
                applied = await io.maybe_blocking(
                    robot._prompt.skills_may_block, robot._prompt.with_agent_skills,
                    robot.messages, plan.skill_mode, ctx.request, selected, saved_prompt, robot_name=robot.name,
                    scope=robot._skill_scope or run_id, attachments=attachments,
                )

                async def generation() -> RobotResult:
                    request = await io.maybe_blocking(robot._learning.inject_may_block, robot._learning.inject,
                                                      gen_ctx.request)
                    result = await tool_loop(robot, plan, request, applied.tools, on_content, io)
                    return await io.maybe_blocking(applied.finish_may_block, applied.finish, result)  # the files the run wrote

                return await io.hooks("llm_generation", gen_ctx, generation)
            finally:
                set_system_message(robot.messages, saved_prompt)  # matched skills last one run only

        return await io.hooks("run", ctx, core)


def tools_may_block(robot: RobotParts, plan: TurnPlan, request: str | None, extra_tools: Iterable[Tool]) -> bool:
    """Whether :func:`offered_tools` may connect to or list MCP servers (``arun`` then runs it
    in a thread); local tools are chosen in memory."""
    return robot._mcp.may_block(plan.mcp)


def offered_tools(robot: RobotParts, plan: TurnPlan, request: str | None, extra_tools: Iterable[Tool]) -> list[Tool]:
    """Local tools by the plan's ``tools`` value, then MCP tools by its ``mcp`` value (a
    name list filters MCP tools too); a local tool wins a name clash."""
    tools = plan.tools
    selected = robot.select_tools(tools, network_config=plan.network_config, extra=extra_tools)
    mcp_tools = robot._mcp.tools_for_run(plan.mcp, request, robot.config.mcp, plan.network_config)
    if isinstance(tools, (list, tuple)) and tools:
        mcp_tools = [t for t in mcp_tools if t.name in tools]
    taken = {t.name for t in selected}
    return selected + [t for t in mcp_tools if t.name not in taken]


async def run_in_conversation(robot: RobotParts, conversation_id: str, message: str | None, io: IO = SYNC,
                              **kwargs: Any) -> RobotResult:
    """Load the conversation's history from Redis, run, save it back. The history is this
    run's own (a context variable, see :func:`conversation_scope`), so concurrent runs of
    one robot in different conversations -- tasks on one event loop, or threads -- never
    see each other's messages; the robot's own messages are untouched."""
    store = ConversationStore()
    system = robot.messages[:1] if robot.instructions is not None else []
    if io is SYNC:
        loaded = read_ahead(robot, store, conversation_id, kwargs)
    else:
        loaded = await io.either(store.load, store.aload, robot.name, conversation_id)
    history = [m for m in loaded if m.get("role") != "system"]
    try:
        with conversation_scope(robot, [*system, *history], conversation_id):
            result = await io.run(robot, message, **kwargs)
            await io.either(store.save, store.asave, robot.name, conversation_id,
                            [m for m in robot.messages if m.get("role") != "system"])
            return result
    finally:
        robot._learning.discard_preload()


def read_ahead(robot: RobotParts, store: ConversationStore, conversation_id: str,
               kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation's history, and in the same round trip (with other threads' round
    trips: robot_lab.coalesce) the two reads the run makes next: the step journal of a
    ``durable_id`` given as a string (a served bus message's; ``kwargs`` then carries the
    scope, journal preloaded) and the robot's stored learnings (preloaded for the run's one
    read). An in-flight worker serving a thousand conversations makes two round trips less
    per message. A read of another client (a memory or journal elsewhere) is left to the run,
    and so is a read answered with an error: the run's own read raises it where it did; the
    history's error raises here, as the plain read did."""
    redis = store.redis
    pipe = coalesce.pipeline(redis)
    pipe.get(store.keys.conversation(robot.name, conversation_id))
    durable_id = kwargs.get("durable_id")
    scope_id = durable_id if isinstance(durable_id, str) else None  # (execute: local_scope(durable_id))
    steps_key = None
    if scope_id is not None:
        from robot_lab.connection import get_redis  # lazy: start-up time

        steps_key = default_keys().durable_steps(scope_id)  # local_scope's journal

        if get_redis() is redis:  # local_scope's journal is on this very client
            pipe.hgetall(steps_key)
        else:
            steps_key = None
    learning = robot._learning
    memory = learning.memory  # Learning.load reads it each run (learnings in hand or not)
    values = getattr(memory, "_values", None)
    if values is not None and values.redis is redis:
        pipe.hget(values.keys.hash, "learnings")
    else:
        memory = None
    replies = coalesce.execute(pipe, raise_on_error=False)
    if isinstance(replies[0], Exception):
        raise replies[0]
    if steps_key is not None and not isinstance(replies[1], Exception):
        kwargs["durable_id"] = local_scope(scope_id, preloaded=replies[1])  # type: ignore[arg-type]
    if memory is not None and not isinstance(replies[-1], Exception):
        learning.preload(memory, replies[-1])
    return store.decode(replies[0])
