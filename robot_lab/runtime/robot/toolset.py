"""Which tools a run offers: the Ruby gem's ToolConfig resolution (``none`` / ``inherit`` / a
name list) along the cascade settings -> network -> robot -> run, and the ``max_tools`` cap.

Kept apart from the Robot so the selection rules read in one place; it needs only the
robot's attached tools and its config, never the tool loop or the prompt.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.tools import Tool
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

log = get_logger("robot_lab.robot")

DEFAULT_MAX_TOOLS = 128
NONE_VALUES: tuple[Any, ...] = (None, "none", ())


def is_none_value(value: Any) -> bool:
    """The Ruby gem's ``:none`` in every spelling: None, ``"none"``, an empty list."""
    return value is None or value == "none" or (isinstance(value, (list, tuple)) and not value)


def resolve_tool_setting(value: Any, parent: Any) -> list[str] | None:
    """The Ruby gem's ToolConfig.resolve: ``inherit`` -> parent; none -> []; else the list.
    ``None`` as a result means "no restriction" (all attached)."""
    if value == "inherit":
        return parent
    if is_none_value(value):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def select_tools(
    robot: RobotParts,
    tools: Any = "none",
    *,
    network_config: RunConfig | None = None,
    extra: Iterable[Tool] = (),
) -> list[Tool]:
    """Tools sent on this run of ``robot`` (the owning Robot). Runtime none sends zero;
    ``inherit`` sends the robot's allow-list (its build-time ``tools`` names, else the
    network's, else everything attached); a list sends those names. Capped at ``max_tools``."""
    attached = [*robot.local_tools.values(), *getattr(robot, "a2a_tools", ()), *extra]
    if is_none_value(tools):
        return []

    parent_value = (network_config.tools if network_config else None) or get_settings().tools
    parent = resolve_tool_setting(parent_value, None)
    if parent == []:
        parent = None  # a global "none" means "no restriction at this level", not "no tools"
    build_value = robot.config.tools
    allowed = parent if build_value is None else resolve_tool_setting(build_value, parent)
    runtime = resolve_tool_setting(tools, allowed)
    if runtime is None:
        selected = attached
    else:
        by_name = {t.name: t for t in attached}
        unknown = [n for n in runtime if n not in by_name]
        if unknown:
            log.warning("tools.unknown", robot=robot.name, tools=unknown)
        selected = [by_name[n] for n in runtime if n in by_name]
    max_tools = robot.config.max_tools
    cap = max_tools if max_tools and max_tools > 0 else DEFAULT_MAX_TOOLS
    if len(selected) > cap:
        log.warning("tools.capped", robot=robot.name, offered=len(selected), cap=cap)
        selected = selected[:cap]
    return selected


def validate_tools_filter(tools: Any) -> None:
    """``tools:`` takes names; a tool object there is a mistake worth a clear error."""
    if is_none_value(tools) or tools == "inherit":
        return
    entries = [tools] if isinstance(tools, str) else tools
    for entry in entries:
        if not isinstance(entry, str):
            raise ConfigurationError(
                f"`tools:` expects tool names (strings), got {entry!r}; pass tool objects as `local_tools:`"
            )
