"""robot-lab: teams of LLM robots as distributed worker processes on Redis.

The public API is exported lazily (PEP 562) so that ``import robot_lab`` and
``robot-lab --help`` stay fast: litellm, rq and fastembed load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from robot_lab.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "RobotLabError": "robot_lab.errors",
    "Error": "robot_lab.errors",
    "ConfigurationError": "robot_lab.errors",
    "DependencyError": "robot_lab.errors",
    "InferenceError": "robot_lab.errors",
    "ToolLoopError": "robot_lab.errors",
    "ToolNotFoundError": "robot_lab.errors",
    "MCPError": "robot_lab.errors",
    "ToolError": "robot_lab.errors",
    "BusError": "robot_lab.errors",
    "BudgetExceeded": "robot_lab.errors",
    "AwaitTimeout": "robot_lab.errors",
    "DelegationTimeout": "robot_lab.errors",
    "SchemaError": "robot_lab.errors",
    "InputRequired": "robot_lab.errors",
    "InputTimeout": "robot_lab.errors",
    "StepDivergence": "robot_lab.errors",
    "SandboxError": "robot_lab.errors",
    "RemoteError": "robot_lab.errors",
    # wire types
    "RobotMessage": "robot_lab.schemas",
    "RobotResult": "robot_lab.schemas",
    "RobotSpec": "robot_lab.schemas",
    "RunEvent": "robot_lab.schemas",
    "MemoryChange": "robot_lab.schemas",
    "TextMessage": "robot_lab.schemas",
    "ToolCallMessage": "robot_lab.schemas",
    "ToolResultMessage": "robot_lab.schemas",
    "ToolCall": "robot_lab.schemas",
    # settings and plumbing
    "Settings": "robot_lab.settings",
    "get_settings": "robot_lab.settings",
    "configure": "robot_lab.settings",
    "reload_settings": "robot_lab.settings",
    "get_redis": "robot_lab.connection",
    "aconnect": "robot_lab.connection",
    "async_client_for": "robot_lab.connection",
    "parse_redis_url": "robot_lab.connection",
    "redact_url": "robot_lab.connection",
    "collect_status": "robot_lab.workers.fleet_status",
    "recent_runs": "robot_lab.workers.fleet_status",
    "RobotPool": "robot_lab.workers.inflight",
    "Keys": "robot_lab.keys",
    "configure_logging": "robot_lab.logging",
    # bus
    "build_a2a_app": "robot_lab.a2a.asgi",
    "Bus": "robot_lab.bus",
    "BusPoller": "robot_lab.bus",
    "Delivery": "robot_lab.bus",
    "DeadLetter": "robot_lab.bus",
    "OutboxEntry": "robot_lab.bus",
    "Keyring": "robot_lab.bus",
    "sign_message": "robot_lab.schemas.signing",
    "acl_users": "robot_lab.workers.acl_users",
    "InboxStats": "robot_lab.bus",
    # skills
    "AgentSkill": "robot_lab.skills",
    "SkillCatalog": "robot_lab.skills",
    "SkillMatcher": "robot_lab.skills",
    "SkillTool": "robot_lab.skills",
    "ScriptTool": "robot_lab.skills",
    "Capabilities": "robot_lab.skills",
    "TrustReview": "robot_lab.skills",
    # runtime
    "Robot": "robot_lab.runtime.robot",
    "build": "robot_lab.runtime.robot",
    "current_turn": "robot_lab.runtime.robot.context",
    "current_run": "robot_lab.runtime.robot.context",  # current_turn's first name, kept as an alias
    "current_memory": "robot_lab.runtime.robot.context",
    "current_step": "robot_lab.runtime.durable",  # durable runs and human input (docs/durable.md)
    "ask_user": "robot_lab.runtime.durable",
    "AskUser": "robot_lab.runtime.durable",
    "Answer": "robot_lab.runtime.durable",
    "TurnContext": "robot_lab.runtime.robot.context",
    "TurnStream": "robot_lab.runtime.robot.streaming",
    "TurnPlan": "robot_lab.runtime.robot.plan",
    "Tool": "robot_lab.runtime.tools",
    "tool": "robot_lab.runtime.tools",
    "RunConfig": "robot_lab.runtime.run_config",
    "App": "robot_lab.app",
    "load_app": "robot_lab.app",
    "Network": "robot_lab.network.dsl",
    "create_network": "robot_lab.network.dsl",
    "Coordinator": "robot_lab.network.coordinator",
    "NetworkResult": "robot_lab.network.coordinator",
    "RunHandle": "robot_lab.network.coordinator",
    "Hook": "robot_lab.runtime.rails.hooks",
    "HookRegistry": "robot_lab.runtime.rails.hooks",
    "Narrator": "robot_lab.runtime.rails.hooks",
    "DelegationFuture": "robot_lab.runtime.delegation",
    "Memory": "robot_lab.memory.store",
    "MemoryValueError": "robot_lab.memory.store",
    "ReservedKeyError": "robot_lab.memory.store",
    "resolve_memory": "robot_lab.memory.store",
    # safety: budgets, doom loops, history
    "BudgetLedger": "robot_lab.runtime.rails.budget",
    "Ledger": "robot_lab.runtime.rails.budget",
    "RedisLedger": "robot_lab.runtime.rails.budget",
    "Reservation": "robot_lab.runtime.rails.budget",
    "check_budgets": "robot_lab.runtime.rails.budget",
    "DoomLoopDetector": "robot_lab.runtime.rails.doom_loop",
    "RedisDoomLoopDetector": "robot_lab.runtime.rails.doom_loop",
    "HistoryCompressor": "robot_lab.runtime.history",
    "HistoryResult": "robot_lab.runtime.history",
    "Convergence": "robot_lab.runtime.history",
    "search_history": "robot_lab.runtime.history",
    "compress_history": "robot_lab.runtime.history",
    "TfidfModel": "robot_lab.text.analysis",
    "tf_cosine_similarity": "robot_lab.text.analysis",
    # MCP
    "MCPServerConfig": "robot_lab.runtime.mcp.servers",
    "MCPClient": "robot_lab.runtime.mcp.servers",
    "MCPManager": "robot_lab.runtime.mcp.servers",
    "MCPTool": "robot_lab.runtime.mcp.servers",
    "ServerDiscovery": "robot_lab.runtime.mcp.servers",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports("robot_lab", _EXPORTS, globals(), __all__)


if TYPE_CHECKING:  # pragma: no cover
    from robot_lab.errors import *  # noqa: F401,F403
    from robot_lab.schemas import RobotMessage, RobotResult, RobotSpec  # noqa: F401
