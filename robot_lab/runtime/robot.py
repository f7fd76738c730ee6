"""Robot: an LLM agent with a system prompt, tools and a conversation, run in one process.

Ported from robot_lab's ``Robot``: the fixed keyword list of ``Robot.new``, tools off by
default at run time (``tools="inherit"`` or a name list sends them), the tool loop with tool
errors returned as text, the ``max_tool_rounds`` circuit breaker, both streaming callbacks
(stored first, then per call), running token totals, templates with template skills, and
the ``RunConfig`` cascade. A robot holds live state (its conversation); what crosses a
process boundary is its :class:`~robot_lab.schemas.RobotSpec` (``to_spec``/``from_spec``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError, ToolLoopError
from robot_lab.logging import get_logger, log_context
from robot_lab.observability import hooks as observe
from robot_lab.schemas.messages import (
    Message,
    RobotResult,
    RobotSpec,
    TextMessage,
    ToolCall,
    ToolCallMessage,
    ToolResultMessage,
)
from robot_lab.runtime.rails import budget as budget_mod
from robot_lab.runtime.rails.doom_loop import DEFAULT_THRESHOLD as DOOM_LOOP_THRESHOLD
from robot_lab.runtime.rails.doom_loop import DoomLoopDetector, with_warning
from robot_lab.runtime.rails.hooks import (
    CompactionHookContext,
    HookRegistry,
    LearnHookContext,
    LlmGenerationHookContext,
    RunHookContext,
    ToolCallHookContext,
    call_point_hook,
    hook_scope,
    run_hooks,
)
from robot_lab.runtime.llm.gateway import Chunk, LLMGateway, LLMResponse, default_gateway
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.templates import Template, expand_skills, load_template
from robot_lab.runtime.tools import Tool, ToolManifest, as_tool

log = get_logger("robot_lab.robot")

DEFAULT_MAX_TOOLS = 128
NONE_VALUES: tuple[Any, ...] = (None, "none", ())
ContentCallback = Callable[[Chunk], Any]


def _is_none_value(value: Any) -> bool:
    return value is None or value == "none" or (isinstance(value, (list, tuple)) and not value)


def resolve_tool_setting(value: Any, parent: Any) -> list[str] | None:
    """robot_lab's ToolConfig.resolve: ``inherit`` -> parent; none -> []; else the list.
    ``None`` as a result means "no restriction" (all attached)."""
    if value == "inherit":
        return parent
    if _is_none_value(value):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


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
        enable_cache: bool = True,
        bus: Any = None,
        skills: Iterable[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        max_tokens: int | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        stop: str | list[str] | None = None,
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
    ) -> None:
        self._validate_tools_filter(tools)
        self.name = str(name)
        self._name_from_constructor = self.name != "robot"
        self.description = description
        self.provider = provider
        self.system_prompt = system_prompt
        self.template = template
        self._template_dirs = [Path(d) for d in template_dirs] if template_dirs is not None else None
        self._context_source = context
        self.mcp_servers = [dict(s) for s in mcp_servers]
        self.mcp_discovery = mcp_discovery
        self._mcp_discovered = False
        self._mcp_manager: Any = None
        if self.mcp_servers:
            self.mcp  # validate the server configs now: a bad one fails at build time
        self.enable_cache = enable_cache
        self.bus = bus
        self.skills = [str(s) for s in (skills or [])]
        if skill_mode not in ("match", "tool"):
            raise ConfigurationError(f"skill_mode must be 'match' or 'tool', got {skill_mode!r}")
        self.skill_mode = skill_mode
        self.agent_skills: list[Any] = []
        self.local_tools = ToolManifest()
        for item in local_tools:
            self.local_tools.add(item).robot = self
        self._gateway = gateway
        self.hooks = HookRegistry(hooks)
        explicit = {
            "model": model,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_tokens": max_tokens,
            "presence_penalty": presence_penalty,
            "frequency_penalty": frequency_penalty,
            "stop": stop,
            "max_tool_rounds": max_tool_rounds,
            "token_budget": token_budget,
            "cost_budget": cost_budget,
            "doom_loop_threshold": doom_loop_threshold,
            "on_tool_call": on_tool_call,
            "on_tool_result": on_tool_result,
            "on_content": on_content,
            "tools": None if _is_none_value(tools) else tools,
            "mcp": None if _is_none_value(mcp) else mcp,
        }
        base = config if isinstance(config, RunConfig) else RunConfig(config or {})
        self.config = base.merge(explicit)
        self.messages: list[dict[str, Any]] = []
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.total_cost = 0.0
        self.learnings: list[str] = []
        self._memory: Any = None
        self.budget_ledger = budget_mod.robot_ledger(self.config.token_budget, self.config.cost_budget)
        self._templates: list[Template] = []
        self._render_deferred = False
        self._apply_template()
        self._apply_system_prompt()

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _validate_tools_filter(tools: Any) -> None:
        if _is_none_value(tools) or tools == "inherit":
            return
        entries = [tools] if isinstance(tools, str) else tools
        for entry in entries:
            if not isinstance(entry, str):
                raise ConfigurationError(
                    f"`tools:` expects tool names (strings), got {entry!r}; pass tool objects as `local_tools:`"
                )

    @property
    def context(self) -> dict[str, Any]:
        source = self._context_source
        if callable(source):
            return dict(source(network=None))
        return dict(source or {})

    def _apply_template(self) -> None:
        """Load template skills and the main template; front matter fills what the
        constructor left open (robot_lab's precedence rules)."""
        names = list(self.skills)
        main: Template | None = None
        if self.template:
            main = load_template(self.template, self._template_dirs)
            names += [s for s in main.skills if s not in names]
        names = self._split_agent_skills(names)
        skill_templates = expand_skills(names, self._template_dirs) if names else []
        self._templates = [*skill_templates, *([main] if main else [])]
        if not self._templates:
            return
        fm_config = RunConfig.cascade(*(RunConfig(t.config) for t in self._templates))
        self.config = fm_config.merge(self.config)
        extras: dict[str, Any] = {}
        for t in self._templates:
            extras.update({k: t.metadata[k] for k in ("robot_name", "description", "tools", "mcp") if k in t.metadata})
        if "robot_name" in extras and not self._name_from_constructor:
            self.name = str(extras["robot_name"])
        if extras.get("description") and self.description is None:
            self.description = str(extras["description"])
        if extras.get("tools") and not len(self.local_tools):
            for path in [extras["tools"]] if isinstance(extras["tools"], str) else extras["tools"]:
                try:
                    self.local_tools.add(path).robot = self
                except ConfigurationError as exc:
                    log.warning("template.tool_skipped", robot=self.name, tool=path, error=str(exc))
        if extras.get("mcp") and self.config.mcp is None:
            self.config = self.config.merge({"mcp": extras["mcp"]})

    def _split_agent_skills(self, names: list[str]) -> list[str]:
        """AgentSkills (SKILL.md bundles in the catalog) are checked first, as robot_lab
        does; the remaining names are template skills."""
        if not names:
            self.agent_skills = []
            return names
        from robot_lab.skills import default_catalog

        catalog = default_catalog()
        self.agent_skills = catalog.select(names)
        return [n for n in names if catalog.find(n) is None]

    def _render_templates(self, context: Mapping[str, Any]) -> str | None:
        parts = []
        for t in self._templates:
            parts.append(t.render(context))
        return "\n\n".join(p for p in parts if p) or None

    def _apply_system_prompt(self, run_context: Mapping[str, Any] | None = None) -> None:
        context = {**self.context, **(run_context or {})}
        rendered: str | None = None
        if self._templates:
            missing = sorted({m for t in self._templates for m in t.missing(context)})
            if missing and run_context is None:
                # robot_lab defers rendering to run time when build-time context is incomplete.
                self._render_deferred = True
            else:
                rendered = self._render_templates(context)
                self._render_deferred = False
        parts = [p for p in (rendered, self.system_prompt) if p]
        self._set_system_message("\n\n".join(parts) if parts else None)

    def _set_system_message(self, text: str | None) -> None:
        if self.messages and self.messages[0].get("role") == "system":
            if text:
                self.messages[0] = {"role": "system", "content": text}
            else:
                self.messages.pop(0)
        elif text:
            self.messages.insert(0, {"role": "system", "content": text})

    @property
    def instructions(self) -> str | None:
        if self.messages and self.messages[0].get("role") == "system":
            return self.messages[0]["content"]
        return None

    # ------------------------------------------------------------------ accessors
    @property
    def model(self) -> str:
        if self.config.model:
            return str(self.config.model)
        from robot_lab.settings import get_settings

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
        self.bus = bus
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

    # ------------------------------------------------------------------ MCP
    @property
    def mcp(self) -> Any:
        """The robot's MCP servers (connected lazily, per process)."""
        if self._mcp_manager is None:
            from robot_lab.runtime.mcp.servers import MCPManager

            self._mcp_manager = MCPManager(self.mcp_servers, owner=self.name)
        return self._mcp_manager

    def connect_mcp(self) -> Robot:
        """Connect every MCP server now instead of on the first run that asks for MCP."""
        self.mcp.ensure_connected("inherit")
        return self

    @property
    def failed_mcp_server_names(self) -> list[str]:
        return self.mcp.failed_server_names if self._mcp_manager is not None else []

    def mcp_client(self, server_name: str) -> Any:
        return self.mcp.client(server_name)

    def disconnect(self) -> None:
        """Close MCP connections (and the memory listener, if any)."""
        if self._mcp_manager is not None:
            self._mcp_manager.close()
        if self._memory is not None:
            self._memory.close()

    def _mcp_tools(self, mcp: Any, message: str | None, network_config: RunConfig | None) -> list[Tool]:
        """MCP tools for this run: runtime ``mcp`` none sends none; ``inherit`` takes the
        robot's setting, else the network's, else all its servers; failures never fail the run."""
        if _is_none_value(mcp) or not self.mcp_servers:
            return []
        if mcp == "inherit":
            mcp = self.config.mcp or (network_config.mcp if network_config else None) or "inherit"
        try:
            names = self.mcp.resolve(mcp)
            if names and self.mcp_discovery and not self._mcp_discovered and message:
                names = self.mcp.discover(message, names)
                self._mcp_discovered = True
            return [as_tool(t) for t in self.mcp.tools(names)] if names else []
        except ConfigurationError:
            raise
        except Exception as exc:  # robot_lab: MCP trouble is logged, the run goes on
            log.warning("mcp.unavailable", robot=self.name, error=f"{type(exc).__name__}: {exc}")
            return []

    def search_history(self, query: str, limit: int = 5) -> list[Any]:
        """robot_lab's ``search_history``: messages most similar to ``query`` (TF cosine)."""
        from robot_lab.runtime.history import search_history

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
        from robot_lab.runtime.history import compress_history

        ctx = CompactionHookContext(robot=self, messages_before=tuple(self.messages), config=self.config, strategy=strategy)

        def core() -> list[dict[str, Any]]:
            call_point_hook("on_compaction", ctx)
            if ctx.compacted_messages is None:
                ctx.compacted_messages = compress_history(
                    self.messages, recent_turns=recent_turns, keep_threshold=keep_threshold,
                    drop_threshold=drop_threshold, summarizer=summarizer,
                )
            return ctx.compacted_messages

        with hook_scope(self.hooks):
            self.messages = list(run_hooks("compaction", ctx, core))
        return self

    def _maybe_compact(self) -> None:
        mode = self.config.auto_compact
        if mode in (None, "none"):
            return
        if callable(mode):
            mode(self)
            return
        if mode != "context_window":
            log.warning("auto_compact.unknown_mode", robot=self.name, mode=str(mode))
            return
        from robot_lab.runtime.history import should_compact

        if should_compact(self.messages, context_window=self._context_window(), threshold=self.config.compact_threshold):
            self.compress_history(strategy="context_window")

    def _context_window(self) -> int | None:
        if self.model.startswith("scripted"):
            return None
        try:
            from robot_lab.runtime.llm.gateway import litellm_module

            info = litellm_module().get_model_info(self.model)
            return int(info.get("max_input_tokens") or info.get("max_tokens") or 0) or None
        except Exception:
            return None

    # ------------------------------------------------------------------ tools for a run
    def select_tools(
        self,
        tools: Any = "none",
        *,
        network_config: RunConfig | None = None,
        extra: Iterable[Tool] = (),
    ) -> list[Tool]:
        """Tools sent on this run. Runtime none sends zero; ``inherit`` sends the robot's
        allow-list (its build-time ``tools`` names, else the network's, else everything
        attached); a list sends those names. Capped at ``max_tools`` (128)."""
        attached = [*self.local_tools.values(), *extra]
        if _is_none_value(tools):
            return []
        from robot_lab.settings import get_settings

        parent_value = (network_config.tools if network_config else None) or get_settings().tools
        parent = resolve_tool_setting(parent_value, None)
        if parent == []:
            parent = None  # a global "none" means "no restriction at this level", not "no tools"
        build_value = self.config.tools
        allowed = parent if build_value is None else resolve_tool_setting(build_value, parent)
        runtime = resolve_tool_setting(tools, allowed)
        if runtime is None:
            selected = attached
        else:
            by_name = {t.name: t for t in attached}
            unknown = [n for n in runtime if n not in by_name]
            if unknown:
                log.warning("tools.unknown", robot=self.name, tools=unknown)
            selected = [by_name[n] for n in runtime if n in by_name]
        cap = self.config.max_tools if self.config.max_tools and self.config.max_tools > 0 else DEFAULT_MAX_TOOLS
        if len(selected) > cap:
            log.warning("tools.capped", robot=self.name, offered=len(selected), cap=cap)
            selected = selected[:cap]
        return selected

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
        **context: Any,
    ) -> RobotResult:
        """Send ``message`` and run the tool loop until the model answers with text.

        Extra keyword arguments are run-time template context and re-render the prompt.
        Raises on failure (use :meth:`run_safely` for robot_lab's network semantics).
        ``hooks`` are per-run handlers; ``network_hooks`` the enclosing network's registry.
        ``budgets`` are extra ledgers (a network run's, a tenant's ``RedisLedger``) checked
        beside the robot's own; ``doom_loop`` replaces the per-run detector (networks pass a
        ``RedisDoomLoopDetector`` so a loop bouncing between robots is seen).
        ``conversation_id`` loads that conversation's history from Redis first and saves it
        after, so any worker of this robot can continue it.
        """
        if conversation_id is not None:
            return self._run_in_conversation(
                conversation_id, message, tools=tools, mcp=mcp, network_config=network_config,
                on_content=on_content, extra_tools=extra_tools, hooks=hooks, network_hooks=network_hooks,
                network=network, task=task, memory=memory, run_id=run_id, budgets=budgets, doom_loop=doom_loop,
                **context,
            )
        per_run = HookRegistry([hooks] if hooks is not None and not isinstance(hooks, (list, tuple)) else hooks or [])
        with log_context(robot=self.name, run_id=run_id, task=task), hook_scope(network_hooks, self.hooks, per_run):
            net_config = (
                network_config
                if isinstance(network_config, RunConfig) or network_config is None
                else RunConfig(network_config)
            )
            ctx = RunHookContext(
                robot=self, network=network, task=task, memory=memory, config=self.config, request=message,
                run_id=run_id,
            )

            def core() -> RobotResult:
                if context or self._render_deferred:
                    self._apply_system_prompt(context)
                selected = self.select_tools(tools, network_config=net_config, extra=extra_tools)
                mcp_tools = self._mcp_tools(mcp, ctx.request, net_config)
                if isinstance(tools, (list, tuple)) and tools:
                    mcp_tools = [t for t in mcp_tools if t.name in tools]  # a name list filters MCP tools too
                taken = {t.name for t in selected}
                selected += [t for t in mcp_tools if t.name not in taken]
                gen_ctx = LlmGenerationHookContext(
                    robot=self, network=network, task=task, memory=memory, config=self.config,
                    request=ctx.request, run_id=run_id,
                )
                saved_prompt = self.instructions
                try:
                    offered = self._with_agent_skills(ctx.request, selected, saved_prompt)
                    return run_hooks(
                        "llm_generation",
                        gen_ctx,
                        lambda: self._tool_loop(
                            self._inject_learnings(gen_ctx.request),
                            offered,
                            on_content,
                            ledgers=[self.budget_ledger, *budgets],
                            doom=doom_loop,
                        ),
                    )
                finally:
                    self._set_system_message(saved_prompt)  # matched skills last one run only

            return run_hooks("run", ctx, core)

    def _run_in_conversation(self, conversation_id: str, message: str | None, **kwargs: Any) -> RobotResult:
        from robot_lab.runtime.conversations import ConversationStore

        store = ConversationStore()
        system = self.messages[:1] if self.instructions is not None else []
        saved = self.messages
        history = [m for m in store.load(self.name, conversation_id) if m.get("role") != "system"]
        self.messages = [*system, *history]
        try:
            result = self.run(message, **kwargs)
            store.save(self.name, conversation_id, [m for m in self.messages if m.get("role") != "system"])
            return result
        finally:
            self.messages = saved

    def _with_agent_skills(
        self, message: str | None, selected: list[Tool], base_prompt: str | None
    ) -> list[Tool] | Callable[[], list[Tool]]:
        """Apply this robot's AgentSkills for one run. Match mode: matched instructions are
        prepended and their script tools offered. Tool mode: the prompt lists the skills and
        a ``Skill`` tool activates one, so the offered tools are recomputed every round."""
        if not self.agent_skills:
            return selected
        from robot_lab.skills import SkillTool, default_catalog, default_matcher

        if self.skill_mode == "tool":
            skill_tool = SkillTool(default_catalog(), [s.name for s in self.agent_skills])
            self._set_system_message("\n\n".join(p for p in (base_prompt, skill_tool.listing()) if p))
            return lambda: [as_tool(t) for t in skill_tool.filter_tools(selected)]
        injection = default_matcher().prepare(message or "", self.agent_skills)
        if not injection:
            return selected
        self._set_system_message(injection.system_prompt(base_prompt))
        return [as_tool(t) for t in injection.filter_tools(selected)]

    def run_safely(self, message: str | None = None, **kwargs: Any) -> RobotResult:
        """robot_lab's ``Robot#call``: any exception becomes an error RobotResult."""
        started = time.monotonic()
        try:
            result = self.run(message, **kwargs)
        except Exception as exc:
            log.warning("robot.run_failed", robot=self.name, error=f"{type(exc).__name__}: {exc}")
            result = RobotResult.from_error(self.name, exc)
        result.duration = time.monotonic() - started
        return result

    def _call_model(
        self,
        specs: list[dict[str, Any]] | None,
        on_chunk: Callable[[Chunk], Any] | None,
        params: dict[str, Any],
        ledgers: list[Any],
    ) -> LLMResponse:
        """One model call inside the budget protocol: reserve what remains (BudgetExceeded
        before the call when spent), reconcile actual usage, then InferenceError on overrun."""
        if not ledgers:
            response = self.gateway.complete(self.model, self.messages, tools=specs, on_chunk=on_chunk, params=params)
            self._add_usage(response)
            return response
        caps = {budget_mod.TOKENS: float(self.config.max_tokens)} if self.config.max_tokens else None
        reservation = budget_mod.reserve_all_remaining(ledgers, caps=caps)
        try:
            response = self.gateway.complete(self.model, self.messages, tools=specs, on_chunk=on_chunk, params=params)
        except BaseException:
            budget_mod.release(reservation)
            raise
        budget_mod.reconcile(reservation, response.input_tokens + response.output_tokens, response.cost)
        self._add_usage(response)
        budget_mod.check_budgets(
            ledgers,
            tokens_used=self.total_input_tokens + self.total_output_tokens if self.config.token_budget else None,
            token_budget=self.config.token_budget,
        )
        return response

    def _tool_loop(
        self,
        message: str | None,
        tools: list[Tool] | Callable[[], list[Tool]],
        on_content: ContentCallback | None,
        *,
        ledgers: Sequence[Any] = (),
        doom: Any = None,
    ) -> RobotResult:
        started = time.monotonic()
        self._maybe_compact()
        active_ledgers = [ledger for ledger in ledgers if ledger is not None]
        detector = doom or DoomLoopDetector(self.config.doom_loop_threshold or DOOM_LOOP_THRESHOLD)
        if message is not None:
            self.messages.append({"role": "user", "content": message})
        offer = tools if callable(tools) else (lambda: tools)
        stored = self.config.on_content
        callbacks = [cb for cb in (stored, on_content) if cb is not None]
        on_chunk = (lambda chunk: [cb(chunk) for cb in callbacks]) if callbacks else None
        params = self.config.llm_params()
        max_rounds = self.config.max_tool_rounds
        output: list[Message] = []
        results: list[ToolResultMessage] = []
        input_tokens = output_tokens = 0
        cost = 0.0
        calls_made = 0
        while True:
            offered = offer()
            specs = [t.to_openai() for t in offered] or None
            by_name = {t.name: t for t in offered}
            response: LLMResponse = self._call_model(specs, on_chunk, params, active_ledgers)
            input_tokens += response.input_tokens
            output_tokens += response.output_tokens
            cost += response.cost
            self.messages.append(response.assistant_message())
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
                if self.config.on_tool_call:
                    self.config.on_tool_call(record)
                text = self._execute_tool(by_name, call.name, call.arguments)
                warning = detector.observe(call.name)
                if warning:
                    text = with_warning(text, warning)
                self.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})
                is_error = text.startswith(("Error (", "Error:"))
                result_msg = ToolResultMessage(tool=record, content={"error": text} if is_error else {"data": text})
                output.append(result_msg)
                results.append(result_msg)
                if self.config.on_tool_result:
                    self.config.on_tool_result(result_msg)
        return RobotResult(
            robot_name=self.name,
            output=output,
            tool_calls=results,
            stop_reason="stop",
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost=cost,
            duration=time.monotonic() - started,
        )

    def _execute_tool(self, by_name: Mapping[str, Tool], name: str, arguments: dict[str, Any]) -> str:
        tool = by_name.get(name)
        if tool is None:
            return f"Error: tool {name!r} is not available (offered: {', '.join(by_name) or 'none'})"
        ctx = ToolCallHookContext(tool=tool, tool_name=name, tool_args=dict(arguments), robot=self)

        def core() -> str:
            text = tool.call(arguments)
            if text.startswith(f"Error ({name})"):
                ctx.tool_error = RuntimeError(text)
            return text

        result = run_hooks("tool_call", ctx, core)
        return result if isinstance(result, str) else str(result)

    def _add_usage(self, response: LLMResponse) -> None:
        self.total_input_tokens += response.input_tokens
        self.total_output_tokens += response.output_tokens
        self.total_cost += response.cost

    # ------------------------------------------------------------------ learning, delegation
    @property
    def memory(self) -> Any:
        """The robot's inherent memory: scope ``robot:<name>`` in Redis (embedded or real),
        so every worker of this robot shares its learnings."""
        if self._memory is None:
            from robot_lab.memory.store import Memory

            self._memory = Memory.for_robot(self.name)
        return self._memory

    def learn(self, text: str) -> Robot:
        """Remember a lesson for later runs (robot_lab's dedupe: an existing entry contained
        in the new text is replaced; a new text contained in an existing one is dropped)."""
        text = (text or "").strip()
        if not text:
            return self
        ctx = LearnHookContext(robot=self, text=text, learnings_before=tuple(self.learnings))

        def core() -> bool:
            current = self._load_learnings()
            if any(text in existing for existing in current):
                return False
            updated = [existing for existing in current if existing not in text] + [text]
            self.learnings = updated
            self.memory.set("learnings", updated)
            ctx.stored = True
            call_point_hook("on_learn", ctx)
            return True

        with hook_scope(self.hooks):
            run_hooks("learn", ctx, core)
        return self

    def _load_learnings(self) -> list[str]:
        if self._memory is None and not self.learnings:
            from robot_lab import connection
            from robot_lab.settings import get_settings

            if get_settings().embedded and connection._embedded_server is None:
                return []  # no embedded store exists yet, so nothing can have been learned
        stored = self.memory.get("learnings")
        self.learnings = list(stored or self.learnings)
        return self.learnings

    def _inject_learnings(self, message: str | None) -> str | None:
        if message is None:
            return None
        learnings = self._load_learnings()
        if not learnings:
            return message
        return "LEARNINGS FROM PREVIOUS RUNS:\n" + "\n".join(f"- {item}" for item in learnings) + "\n\n" + message

    def delegate(self, to: Any, task: str, *, async_: bool = False, timeout: float = 120.0, **run_kwargs: Any) -> Any:
        """Hand ``task`` to another robot: a Robot here, or a robot name served by a worker.
        Returns its RobotResult, or a DelegationFuture with ``async_=True``."""
        from robot_lab.runtime.delegation import delegate

        return delegate(to, task, delegated_by=self.name, async_=async_, timeout=timeout, **run_kwargs)

    def spawn(self, name: str, **kwargs: Any) -> Any:
        """Create a new robot at run time for the generic worker pool (``robot-lab worker
        --spawned``); it inherits this robot's model and provider unless given. Returns a
        handle with ``send`` and ``ask``."""
        from robot_lab.runtime.spawn import spawn

        kwargs.setdefault("model", self.config.model)
        kwargs.setdefault("provider", self.provider)
        return spawn(Robot(name, **kwargs).to_spec())

    # ------------------------------------------------------------------ specs
    def to_spec(self) -> RobotSpec:
        """The robot as data. Every tool needs an import path (no lambdas or closures)."""
        paths = []
        for t in self.local_tools:
            if not t.import_path:
                raise ConfigurationError(
                    f"robot {self.name!r}: tool {t.name!r} has no import path, so it cannot be sent to a worker; "
                    "define it at module level"
                )
            paths.append(t.import_path)
        return RobotSpec(
            name=self.name,
            description=self.description,
            model=self.config.model,
            provider=self.provider,
            system_prompt=self.system_prompt,
            template=self.template,
            context=self.context if not callable(self._context_source) else {},
            local_tools=paths,
            skills=self.skills,
            mcp_servers=self.mcp_servers,
            config=RunConfig(self.config.to_json_dict()).merge({"model": None}).to_data(),
            hooks=self.hooks.import_paths(),
        )

    @classmethod
    def from_spec(cls, spec: RobotSpec, **overrides: Any) -> Robot:
        config = RunConfig.from_data(spec.config)
        kwargs: dict[str, Any] = {
            "template": spec.template,
            "system_prompt": spec.system_prompt,
            "context": spec.context,
            "description": spec.description,
            "local_tools": list(spec.local_tools),
            "model": spec.model,
            "provider": spec.provider,
            "mcp_servers": spec.mcp_servers,
            "skills": spec.skills,
            "config": config,
            "hooks": list(spec.hooks),
        }
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
    """robot_lab's ``RobotLab.build``: unknown keyword arguments raise TypeError."""
    return Robot(name, **kwargs)
