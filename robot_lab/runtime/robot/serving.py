"""The serving policy: what a robot offers when it runs for someone else -- a bus message
(``robot-lab worker``, ``BusPoller.serve``), a delegation, a spawned robot.

A served robot uses what it was built with: its tools (``tools="inherit"``: its allow-list,
else everything attached), its MCP servers and its skills, unless its spec says otherwise
(``serve_tools`` / ``serve_mcp``). A message may narrow what is offered, never widen it:
header ``tools`` (``none`` or comma-separated tool names) and header ``mcp`` (``none`` or
comma-separated server names) are intersected with the policy.

A bare in-process ``robot.run(...)`` keeps the Ruby gem's default, ``tools="none"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.logging import get_logger
from robot_lab.runtime.robot.toolset import is_none_value

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

log = get_logger("robot_lab.robot")

SERVE_DEFAULT = "inherit"


def _header_names(value: str) -> list[str] | None:
    """A header's names: None for "no narrowing" (``inherit``/``all``/empty), [] for none."""
    value = value.strip()
    if value in ("", "inherit", "all", "*"):
        return None
    if value == "none":
        return []
    return [n.strip() for n in value.split(",") if n.strip()]


def narrow(policy: Any, allowed: list[str], header: str | None, *, what: str, robot: str) -> Any:
    """``policy`` narrowed by a header: only names the policy already allows survive."""
    if header is None or is_none_value(policy):
        return policy
    wanted = _header_names(header)
    if wanted is None:
        return policy
    kept = [n for n in wanted if n in allowed]
    dropped = [n for n in wanted if n not in allowed]
    if dropped:
        log.warning("serve.header_not_widened", robot=robot, kind=what, names=dropped)
    return kept or "none"


def serve_kwargs(robot: RobotParts, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``tools``/``mcp`` run arguments of a served run of ``robot``."""
    headers = headers or {}
    tools = robot.serve_tools
    if "tools" in headers and not is_none_value(tools):
        allowed = [t.name for t in robot.select_tools(tools)]
        tools = narrow(tools, allowed, headers["tools"], what="tools", robot=robot.name)
    mcp = robot.serve_mcp
    if "mcp" in headers and not is_none_value(mcp) and robot.mcp_servers:
        allowed = robot.mcp.resolve(robot.config.mcp or "inherit" if mcp == "inherit" else mcp)
        mcp = narrow(mcp, allowed, headers["mcp"], what="mcp", robot=robot.name)
    return {"tools": tools, "mcp": mcp}
