"""Robot: an LLM agent with a system prompt, tools and a conversation, run in one process.

Ported from the Ruby gem's ``Robot``: the fixed keyword list of ``Robot.new``, tools off by
default at run time (``tools="inherit"`` or a name list sends them), the tool loop, the
``max_tool_rounds`` circuit breaker, both streaming callbacks, running token totals,
templates with template skills, and the ``RunConfig`` cascade. A robot holds live state
(its conversation); what crosses a process boundary is its
:class:`~robot_lab.schemas.RobotSpec` (``to_spec``/``from_spec``).

The class is the public face; each concern lives in a collaborator beside it: the prompt
(:mod:`.prompt`), tool selection (:mod:`.toolset`), MCP (:mod:`.mcp_attach`), one run
(:mod:`.turn`) and its tool loop (:mod:`.loop`), written once as coroutines and driven
blocking by ``run`` or on an event loop by ``arun`` (:mod:`.drive`; ``astream`` in
:mod:`.streaming`), learning (:mod:`.learning`), history compaction (:mod:`.compaction`)
and the spec (:mod:`.spec`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.runtime.a2a.tool import agent_tools
from robot_lab.runtime.delegation import delegate
from robot_lab.runtime.durable.scopes import DurableScope
from robot_lab.llm.gateway import LLMGateway, default_gateway
from robot_lab.runtime.rails import budget as budget_mod
from robot_lab.runtime.rails.hooks import HookRegistry
from robot_lab.runtime.robot import compaction
from robot_lab.runtime.robot import turn as turn_mod
from robot_lab.runtime.robot.context import conversation_state, default_conversation_turn
from robot_lab.runtime.robot.drive import ASYNC, SYNC, run_sync
from robot_lab.runtime.robot.learning import Learning
from robot_lab.runtime.robot.loop import ContentCallback
from robot_lab.runtime.robot.mcp_attach import MCPAttachment
from robot_lab.runtime.robot.plan import SKILL_MODES
from robot_lab.runtime.robot.prompt import PromptAssembly, set_system_message, system_message
from robot_lab.runtime.robot.serving import SERVE_DEFAULT, serve_kwargs
from robot_lab.runtime.robot.spec import check_bus, spec_kwargs, to_spec
from robot_lab.runtime.robot.streaming import TurnStream
from robot_lab.runtime.robot.toolset import DEFAULT_MAX_TOOLS, is_none_value, select_tools, validate_tools_filter
from robot_lab.runtime.run_config import RunConfig, check_enable_cache
from robot_lab.runtime.spawn import spawn
from robot_lab.runtime.tools import Tool, ToolManifest
from robot_lab.schemas.messages import RobotResult, RobotSpec
from robot_lab.settings import get_settings

log = get_logger("robot_lab.robot")


class Robot:
    """One LLM agent. Build with :func:`build` or ``Robot(name=..., ...)``."""

    DEFAULT_MAX_TOOLS = DEFAULT_MAX_TOOLS

    def __init__(
        self,
        name: str = "robot",
        *,
        template: str | None = None,
        system_prompt: str | None = None,
        context: Mapping[str, Any] | Callable[..., Mapping[str, Any]] | None = None,
        description: str | None = None,
        local_tools: Iterable[Any] = (),
        model: str | None = None,
        provider: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] = (),
        mcp: Any = "none",
        tools: Any = "none",
        on_tool_call: Callable[..., Any] | None = None,
        on_tool_result: Callable[..., Any] | None = None,
        on_content: ContentCallback | None = None,
        enable_cache: bool | None = None,
        bus: Any = None,
        skills: Iterable[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        max_tokens: int | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        stop: str | list[str] | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        max_tool_rounds: int | None = None,
        token_budget: int | None = None,
        cost_budget: float | None = None,
        doom_loop_threshold: int | None = None,
        mcp_discovery: bool = False,
        config: RunConfig | Mapping[str, Any] | None = None,
        gateway: LLMGateway | None = None,
        template_dirs: Iterable[str | Path] | None = None,
        hooks: Iterable[Any] = (),
        skill_mode: str = "match",
        serve_tools: Any = SERVE_DEFAULT,
        serve_mcp: Any = SERVE_DEFAULT,
        a2a_agents: Iterable[Any] = (),
    ) -> None:
        validate_tools_filter(tools)
        validate_tools_filter(serve_tools)
        self.name = str(name)
        self._name_from_constructor = self.name != "robot"
        self.description = description
        self.provider = provider
        self.system_prompt = system_prompt
        self.template = template
        self.template_dirs = [str(d) for d in template_dirs] if template_dirs is not None else None
        self._prompt = PromptAssembly([Path(d) for d in self.template_dirs] if self.template_dirs is not None else None)
        self._context_source = context
        self._mcp = MCPAttachment(self.name, mcp_servers, discovery=mcp_discovery)
        check_enable_cache(enable_cache)
        self.enable_cache = bool(enable_cache)
        self.skills = [str(s) for s in (skills or [])]
        if skill_mode not in SKILL_MODES:
            raise ConfigurationError(f"skill_mode must be 'match' or 'tool', got {skill_mode!r}")
        self.skill_mode = skill_mode
        self.serve_tools = serve_tools
        self.serve_mcp = serve_mcp
        self.local_tools = ToolManifest()
        for item in local_tools:
            self.local_tools.add(item).robot = self
        # remote A2A agents, one tool each (connected when the model first calls one)
        self.a2a_agents = [a if isinstance(a, str) else dict(a) for a in a2a_agents]
        self.a2a_tools = agent_tools(self.a2a_agents)
        for remote in self.a2a_tools:
            remote.robot = self
        self._gateway = gateway
        self.hooks = HookRegistry(hooks)
        explicit = dict(
            model=model, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, stop=stop,
            api_base=api_base, api_key=api_key, api_key_env=api_key_env,
            max_tool_rounds=max_tool_rounds, token_budget=token_budget, cost_budget=cost_budget,
            doom_loop_threshold=doom_loop_threshold, on_tool_call=on_tool_call, on_tool_result=on_tool_result,
            on_content=on_content, tools=None if is_none_value(tools) else tools,
            mcp=None if is_none_value(mcp) else mcp,
        )
        base = config if isinstance(config, RunConfig) else RunConfig(config or {})
        self.config = base.merge(explicit)
        self.bus = check_bus(bus if bus is not None else self.config.bus)
        self._messages: list[dict[str, Any]] = []
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.total_cost = 0.0
        self._learning = Learning(self)
        self.budget_ledger = budget_mod.robot_ledger(self.config.token_budget, self.config.cost_budget)
        self._apply_template()
        self._apply_system_prompt()

    # ------------------------------------------------------------------ conversation state
    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation: the one a run continues in this thread or task
        (``conversation_id``), else the robot's own default conversation."""
        state = conversation_state(self)
        return self._messages if state is None else state.messages

    @messages.setter
    def messages(self, value: list[dict[str, Any]]) -> None:
        state = conversation_state(self)
        if state is None:
            self._messages = value
        else:
            state.messages = value

    @property
    def _skill_scope(self) -> str | None:
        """The skill workspace scope of the conversation in progress (None: the robot's own)."""
        state = conversation_state(self)
        return None if state is None else state.skill_scope

    # ------------------------------------------------------------------ prompt
    @property
    def context(self) -> dict[str, Any]:
        source = self._context_source
        if callable(source):
            return dict(source(network=None))
        return dict(source or {})

    @property
    def agent_skills(self) -> list[Any]:
        return self._prompt.agent_skills

    def _apply_template(self) -> None:
        self._prompt.apply_template(self)

    def _apply_system_prompt(self, run_context: Mapping[str, Any] | None = None) -> None:
        self._set_system_message(self._prompt.render(self.context, self.system_prompt, run_context))

    def _set_system_message(self, text: str | None) -> None:
        set_system_message(self.messages, text)

    @property
    def instructions(self) -> str | None:
        return system_message(self.messages)

    # ------------------------------------------------------------------ accessors
    @property
    def model(self) -> str:
        if self.config.model:
            return str(self.config.model)

        return get_settings().default_model()

    @property
    def gateway(self) -> LLMGateway:
        return self._gateway or default_gateway()

    @property
    def tools(self) -> list[Tool]:
        return self.local_tools.values()

    def effective_config(self) -> dict[str, Any]:
        values = self.config.to_json_dict()
        values["model"] = self.model
        return values

    # ------------------------------------------------------------------ with_* chaining
    def with_model(self, model: str) -> Robot:
        self.config = self.config.merge({"model": model})
        return self

    def with_temperature(self, temperature: float) -> Robot:
        self.config = self.config.merge({"temperature": temperature})
        return self

    def with_params(self, **params: Any) -> Robot:
        self.config = self.config.merge(params)
        return self

    def with_instructions(self, text: str, *, replace: bool = True) -> Robot:
        self.system_prompt = text if replace else "\n\n".join(p for p in (self.system_prompt, text) if p)
        self._apply_system_prompt()
        return self

    def with_tools(self, *tools: Any, replace: bool = False) -> Robot:
        if replace:
            self.local_tools = ToolManifest()
        for item in tools:
            self.local_tools.add(item).robot = self
        return self

    def with_template(self, template: str, **context: Any) -> Robot:
        self.template = template
        if context:
            self._context_source = {**self.context, **context}
        self._apply_template()
        self._apply_system_prompt()
        return self

    def with_bus(self, bus: Any = None) -> Robot:
        """The Bus this robot delegates and spawns through (default: one on ``REDIS_URL``)."""
        self.bus = check_bus(bus)
        return self

    def update(
        self,
        *,
        template: str | None = None,
        context: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        **config: Any,
    ) -> Robot:
        if context is not None:
            self._context_source = dict(context)
        if system_prompt is not None:
            self.system_prompt = system_prompt
        if template is not None:
            self.template = template
            self._apply_template()
        if config:
            self.config = self.config.merge(config)
        self._apply_system_prompt()
        return self

    # ------------------------------------------------------------------ conversation
    def clear_messages(self, keep_system: bool = True) -> Robot:
        system = self.messages[:1] if keep_system and self.instructions is not None else []
        self.messages = list(system)
        return self

    def replace_messages(self, messages: Iterable[Mapping[str, Any]]) -> Robot:
        self.messages = [dict(m) for m in messages]
        return self

    def reset_token_totals(self) -> Robot:
        self.total_input_tokens = self.total_output_tokens = 0
        self.total_cost = 0.0
        return self

    def search_history(self, query: str, limit: int = 5) -> list[Any]:
        """The Ruby gem's ``search_history``: messages most similar to ``query`` (TF cosine)."""
        from robot_lab.runtime.history import search_history  # lazy: start-up time

        return search_history(self.messages, query, limit=limit)

    def compress_history(
        self,
        recent_turns: int = 3,
        keep_threshold: float = 0.6,
        drop_threshold: float = 0.2,
        summarizer: Callable[[str], str] | None = None,
        *,
        strategy: str = "custom",
    ) -> Robot:
        """Drop or summarize old turns that drifted from the recent conversation; fires the
        ``compaction`` hooks (an ``on_compaction`` hook may supply the result itself)."""
        compaction.compress(self, recent_turns, keep_threshold, drop_threshold, summarizer, strategy=strategy)
        return self

    def _maybe_compact(self) -> None:
        compaction.maybe_compact(self)

    def _compaction_may_block(self) -> bool:
        return compaction.may_block(self)

    # ------------------------------------------------------------------ MCP
    @property
    def mcp_servers(self) -> list[dict[str, Any]]:
        return self._mcp.servers

    @property
    def mcp_discovery(self) -> bool:
        return self._mcp.discovery

    @property
    def mcp(self) -> Any:
        """The robot's MCP servers (connected lazily, per process)."""
        return self._mcp.manager

    def connect_mcp(self) -> Robot:
        """Connect every MCP server now instead of on the first run that asks for MCP."""
        self.mcp.ensure_connected("inherit")
        return self

    @property
    def failed_mcp_server_names(self) -> list[str]:
        return self._mcp.failed_server_names

    def mcp_client(self, server_name: str) -> Any:
        return self.mcp.client(server_name)

    def shared_mcp(self) -> Any:
        """``with robot.shared_mcp(): robot.run(...)``: the run uses this process's shared MCP
        connections (one per server, reused across robots built from the same spec, closed
        when idle or at worker shutdown) instead of the robot's own. Workers wrap every run
        of a robot they build per task or slot with it."""
        return self._mcp.shared()

    def disconnect(self) -> None:
        """Close MCP connections (and the memory listener, if any)."""
        self._mcp.close()
        self._learning.close()

    # ------------------------------------------------------------------ tools for a run
    def select_tools(
        self,
        tools: Any = "none",
        *,
        network_config: RunConfig | None = None,
        extra: Iterable[Tool] = (),
    ) -> list[Tool]:
        """Tools sent on this run (see :func:`robot_lab.runtime.robot.toolset.select_tools`)."""
        return select_tools(self, tools, network_config=network_config, extra=extra)

    def on(self, handler: Any, context: dict[str, Any] | None = None) -> Robot:
        """Register a robot-scoped hook (a Hook subclass or its import path)."""
        self.hooks.on(handler, context)
        return self

    # ------------------------------------------------------------------ running
    @observe.robot_run
    def run(
        self,
        message: str | None = None,
        *,
        tools: Any = "none",
        mcp: Any = "none",
        network_config: RunConfig | Mapping[str, Any] | None = None,
        task_config: RunConfig | Mapping[str, Any] | None = None,
        config: RunConfig | Mapping[str, Any] | None = None,
        on_content: ContentCallback | None = None,
        extra_tools: Iterable[Tool] = (),
        hooks: Any = None,
        network_hooks: HookRegistry | None = None,
        network: Any = None,
        task: str | None = None,
        memory: Any = None,
        run_id: str | None = None,
        budgets: Iterable[Any] = (),
        doom_loop: Any = None,
        conversation_id: str | None = None,
        attachments: Iterable[Any] | None = None,
        on_input: Callable[..., Any] | None = None,
        durable_id: str | DurableScope | None = None,
        **context: Any,
    ) -> RobotResult:
        """Send ``message`` and run the tool loop until the model answers with text.

        Extra keyword arguments are run-time template context and re-render the prompt.
        Raises on failure (use :meth:`run_safely` for the Ruby gem's network semantics).
        The run's configuration is one :class:`~robot_lab.runtime.robot.plan.TurnPlan`:
        settings < ``network_config`` < the robot < ``task_config`` < ``config`` (this call).
        ``memory`` binds the run's active memory (a Memory, a scope name, or a mapping merged
        into it); else the network's, else the robot's own. ``hooks`` are per-run handlers;
        ``network_hooks`` the network's registry. ``budgets`` are extra ledgers checked beside
        the robot's own; ``doom_loop`` replaces the per-run detector. ``conversation_id``
        loads that conversation's history from Redis first and saves it after. ``attachments``
        (paths, ``(name, bytes)`` pairs) land in the skill workspace (docs/skills.md).
        ``on_input(request) -> answer`` answers ``ask_user`` and approvals; ``durable_id``
        keeps a step journal in Redis under that id, so running it again replays finished
        steps and resumes a run that asked for input (docs/durable.md).
        """
        return run_sync(self._run_core(SYNC, message, conversation_id, dict(
            tools=tools, mcp=mcp, network_config=network_config, task_config=task_config, config=config,
            on_content=on_content, extra_tools=extra_tools, hooks=hooks, network_hooks=network_hooks,
            network=network, task=task, memory=memory, run_id=run_id, budgets=budgets, doom_loop=doom_loop,
            attachments=attachments, on_input=on_input, durable_id=durable_id,
        ), context))

    @observe.robot_run
    async def arun(
        self,
        message: str | None = None,
        *,
        tools: Any = "none",
        mcp: Any = "none",
        network_config: RunConfig | Mapping[str, Any] | None = None,
        task_config: RunConfig | Mapping[str, Any] | None = None,
        config: RunConfig | Mapping[str, Any] | None = None,
        on_content: ContentCallback | None = None,
        extra_tools: Iterable[Tool] = (),
        hooks: Any = None,
        network_hooks: HookRegistry | None = None,
        network: Any = None,
        task: str | None = None,
        memory: Any = None,
        run_id: str | None = None,
        budgets: Iterable[Any] = (),
        doom_loop: Any = None,
        conversation_id: str | None = None,
        attachments: Iterable[Any] | None = None,
        on_input: Callable[..., Any] | None = None,
        durable_id: str | DurableScope | None = None,
        **context: Any,
    ) -> RobotResult:
        """:meth:`run` for asyncio code (a FastAPI handler, say): the same arguments, the
        same result, the same tool loop (:mod:`.drive`). The model call is awaited
        (litellm's ``acompletion``), async tools are awaited, sync tools and the blocking
        Redis steps run in worker threads, so one event loop runs many robots at once.
        Concurrent runs of one Robot with a ``conversation_id`` each run at once; those
        without one share the robot's default conversation, so they take turns."""
        return await self._run_core(ASYNC, message, conversation_id, dict(
            tools=tools, mcp=mcp, network_config=network_config, task_config=task_config, config=config,
            on_content=on_content, extra_tools=extra_tools, hooks=hooks, network_hooks=network_hooks,
            network=network, task=task, memory=memory, run_id=run_id, budgets=budgets, doom_loop=doom_loop,
            attachments=attachments, on_input=on_input, durable_id=durable_id,
        ), context)

    def astream(self, message: str | None = None, **kwargs: Any) -> TurnStream:
        """:meth:`arun` as an async iterator of the reply's text chunks (the ``Chunk`` that
        ``on_content`` receives); the RobotResult is ``await stream.result()`` afterwards
        (or ``stream.result()`` awaited alone, which also drains the chunks)::

            stream = robot.astream("hi")
            async for chunk in stream:
                print(chunk.content, end="")
            result = await stream.result()
        """
        return TurnStream(self, message, kwargs)

    async def _run_core(self, io: Any, message: str | None, conversation_id: str | None,
                        kwargs: dict[str, Any], context: dict[str, Any]) -> RobotResult:
        if conversation_id is not None:
            return await turn_mod.run_in_conversation(self, conversation_id, message, io, **kwargs, **context)
        if io.is_async and conversation_state(self) is None:
            async with default_conversation_turn(self):
                return await turn_mod.execute(self, message, **kwargs, context=context, io=io)
        return await turn_mod.execute(self, message, **kwargs, context=context, io=io)

    def serve_policy(self, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The ``tools``/``mcp`` arguments of a served run (bus, delegation, spawn): what the
        robot was built with, narrowed -- never widened -- by message ``headers``."""
        return serve_kwargs(self, headers)

    def run_safely(self, message: str | None = None, **kwargs: Any) -> RobotResult:
        """The Ruby gem's ``Robot#call``: any exception becomes an error RobotResult."""
        started = time.monotonic()
        try:
            result = self.run(message, **kwargs)
        except Exception as exc:
            log.warning("robot.run_failed", robot=self.name, error=f"{type(exc).__name__}: {exc}")
            result = RobotResult.from_error(self.name, exc)
        result.duration = time.monotonic() - started
        return result

    async def arun_safely(self, message: str | None = None, **kwargs: Any) -> RobotResult:
        """:meth:`run_safely` over :meth:`arun`."""
        started = time.monotonic()
        try:
            result = await self.arun(message, **kwargs)
        except Exception as exc:
            log.warning("robot.run_failed", robot=self.name, error=f"{type(exc).__name__}: {exc}")
            result = RobotResult.from_error(self.name, exc)
        result.duration = time.monotonic() - started
        return result

    # ------------------------------------------------------------------ learning, delegation
    @property
    def memory(self) -> Any:
        """The robot's inherent memory: scope ``robot:<name>`` in Redis (embedded or real),
        so every worker of this robot shares its learnings."""
        return self._learning.memory

    @property
    def learnings(self) -> list[str]:
        return self._learning.learnings

    def preload_learnings(self, memory: Any, raw: bytes | str | None) -> None:
        """For a worker that read this robot's stored ``learnings`` field from ``memory``
        (its inherent memory) along with other reads: the next run uses that instead of a
        round trip of its own (robot_lab/network/task_job.py)."""
        self._learning.preload(memory, raw)

    @learnings.setter
    def learnings(self, value: list[str]) -> None:
        self._learning.learnings = list(value)

    def learn(self, text: str) -> Robot:
        """Remember a lesson for later runs (the Ruby gem's dedupe: an existing entry contained
        in the new text is replaced; a new text contained in an existing one is dropped)."""
        self._learning.learn(text)
        return self

    def delegate(self, to: Any, task: str, *, async_: bool = False, timeout: float = 120.0, **run_kwargs: Any) -> Any:
        """Hand ``task`` to another robot: a Robot here, or a robot name served by a worker.
        Returns its RobotResult, or a DelegationFuture with ``async_=True``."""
        return delegate(to, task, delegated_by=self.name, async_=async_, timeout=timeout, bus=self.bus,
                        **run_kwargs)

    def spawn(self, name: str, **kwargs: Any) -> Any:
        """Create a new robot at run time for the generic worker pool (``robot-lab worker
        --spawned``); it inherits this robot's model and provider unless given. Returns a
        handle with ``send`` and ``ask``."""
        kwargs.setdefault("model", self.config.model)
        kwargs.setdefault("provider", self.provider)
        bus = self.bus
        return spawn(Robot(name, **kwargs).to_spec(), connection=getattr(bus, "redis", None),
                     keys=getattr(bus, "keys", None))

    # ------------------------------------------------------------------ specs
    def to_spec(self) -> RobotSpec:
        """The robot as data. Every tool needs an import path (no lambdas or closures)."""
        return to_spec(self)

    @classmethod
    def from_spec(cls, spec: RobotSpec, **overrides: Any) -> Robot:
        kwargs = spec_kwargs(spec)
        kwargs.update(overrides)
        return cls(spec.name, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "model": self.model,
            "tools": self.local_tools.names(),
            "config": self.effective_config(),
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
        }

    def __repr__(self) -> str:
        return f"<Robot {self.name} model={self.model}>"


def build(name: str = "robot", **kwargs: Any) -> Robot:
    """The Ruby gem's ``RobotLab.build``: unknown keyword arguments raise TypeError."""
    return Robot(name, **kwargs)
