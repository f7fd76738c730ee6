"""What the Robot's collaborators read on the robot that owns them, as Protocols.

Each collaborator (:mod:`.plan`, :mod:`.prompt`, :mod:`.toolset`, :mod:`.serving`,
:mod:`.turn`, :mod:`.context`, :mod:`.loop`, :mod:`.drive`, :mod:`.streaming`,
:mod:`.learning`, :mod:`.compaction`, :mod:`.spec`) takes the Robot as an argument; these
Protocols list the attributes and methods they use, so the seam between the class and its
parts reads in one place. Typing only: the collaborators import this module under
``TYPE_CHECKING``, and it imports none of them (their objects the Robot holds -- the prompt
assembly, the MCP attachment, the learnings -- appear here as the small Protocols below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from robot_lab.llm.gateway import LLMGateway
    from robot_lab.runtime.rails.budget.ledger import Ledger
    from robot_lab.runtime.rails.hooks import HookRegistry
    from robot_lab.runtime.run_config import RunConfig
    from robot_lab.runtime.tools import Tool, ToolManifest
    from robot_lab.schemas.messages import RobotResult


class RunnableRobot(Protocol):
    """A robot :mod:`.drive` and :mod:`.streaming` run: ``run`` / ``arun`` with the
    Robot's arguments."""

    def run(self, *args: Any, **kwargs: Any) -> RobotResult: ...

    async def arun(self, *args: Any, **kwargs: Any) -> RobotResult: ...


class SkillPrompt(Protocol):
    """The Robot's prompt assembly (:class:`.prompt.PromptAssembly`), as a run uses it."""

    render_deferred: bool

    def skills_may_block(self, messages: list[dict[str, Any]], skill_mode: str, message: str | None,
                         selected: list[Tool], *args: Any, **kwargs: Any) -> bool: ...

    def with_agent_skills(
        self, messages: list[dict[str, Any]], skill_mode: str, message: str | None,
        selected: list[Tool], base_prompt: str | None, *, robot_name: str = ...,
        scope: str | None = ..., attachments: Iterable[Any] | None = ...,
    ) -> list[Tool] | Callable[[], list[Tool]]: ...


class TurnMCP(Protocol):
    """The Robot's MCP attachment (:class:`.mcp_attach.MCPAttachment`), as a run uses it."""

    def may_block(self, mcp: Any) -> bool: ...

    def tools_for_run(self, mcp: Any, message: str | None, robot_mcp: Any,
                      network_config: RunConfig | None) -> list[Tool]: ...


class Learner(Protocol):
    """The Robot's learnings (:class:`.learning.Learning`), as a run uses them."""

    def inject_may_block(self, message: str | None) -> bool: ...

    def inject(self, message: str | None) -> str | None: ...

    # turn.read_ahead: the stored learnings read with the run's first round trip
    @property
    def memory(self) -> Any: ...

    def preload(self, memory: Any, raw: bytes | str | None) -> None: ...

    def discard_preload(self) -> None: ...


class RobotParts(RunnableRobot, Protocol):
    """The Robot as its collaborators see it (the comment on each member names its readers)."""

    # identity and spec: plan, prompt, toolset, serving, spec, learning, loop, run
    name: str
    description: str | None  # prompt, spec
    provider: str | None  # plan, spec
    system_prompt: str | None  # spec
    template: str | None  # prompt, spec
    template_dirs: list[str] | None  # spec
    skills: list[str]  # prompt, spec
    skill_mode: str  # plan, spec
    serve_tools: Any  # serving, spec
    serve_mcp: Any  # serving, spec
    _name_from_constructor: bool  # prompt
    _context_source: Mapping[str, Any] | Callable[..., Mapping[str, Any]] | None  # spec

    # configuration, tools, hooks: nearly every collaborator
    config: RunConfig
    local_tools: ToolManifest  # prompt, toolset, spec
    hooks: HookRegistry  # run, learning, compaction, spec
    budget_ledger: Ledger | None  # plan

    # the conversation and its running totals: run, loop, compaction
    messages: list[dict[str, Any]]
    total_input_tokens: int  # loop
    total_output_tokens: int  # loop
    total_cost: float  # loop

    # the parts a run drives: run
    @property
    def _prompt(self) -> SkillPrompt: ...

    @property
    def _mcp(self) -> TurnMCP: ...

    @property
    def _learning(self) -> Learner: ...

    @property
    def context(self) -> dict[str, Any]: ...  # spec

    @property
    def instructions(self) -> str | None: ...  # run

    @property
    def model(self) -> str: ...  # compaction

    @property
    def gateway(self) -> LLMGateway: ...  # loop

    @property
    def mcp_servers(self) -> list[dict[str, Any]]: ...  # serving, spec

    @property
    def mcp_discovery(self) -> bool: ...  # spec

    @property
    def mcp(self) -> Any: ...  # serving

    @property
    def memory(self) -> Any: ...  # plan

    @property
    def _skill_scope(self) -> str | None: ...  # run

    def select_tools(self, tools: Any = ..., *, network_config: RunConfig | None = ...,
                     extra: Iterable[Tool] = ...) -> list[Tool]: ...  # run, serving

    def _apply_system_prompt(self, run_context: Mapping[str, Any] | None = ...) -> None: ...  # run

    def _maybe_compact(self) -> None: ...  # loop

    def _compaction_may_block(self) -> bool: ...  # loop

    def compress_history(self, recent_turns: int = ..., keep_threshold: float = ..., drop_threshold: float = ...,
                         summarizer: Callable[[str], str] | None = ..., *, strategy: str = ...) -> object: ...  # compaction
