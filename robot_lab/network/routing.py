"""Routing: how a task activates optional tasks (the Ruby gem's ``result.activate(:name)``).

Three ways, in this order, all limited to the task's declared ``routes``:

1. a Python router by import path (``router="pkg.mod:func"``): ``func(result, routes)``
   returns a route name, a list of names, or None;
2. the LLM router: the robot is offered a ``route`` tool whose ``to`` parameter is an enum of
   the allowed routes; the arguments of its calls are the choice;
3. otherwise the reply text: ``ROUTE: a, b`` or, failing that, every route named in it as a
   whole word. ``RobotResult.activate`` set by the robot itself is honoured too.
"""

from __future__ import annotations

import re
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.tools import Tool, import_object
from robot_lab.schemas import RobotResult

ROUTE_TOOL = "route"


def route_tool_for(routes: list[str]) -> Any:
    """A ``route`` tool for this task's allowed routes (built per task: the enum differs)."""
    class RouteTool(Tool):
        name = ROUTE_TOOL
        description = (
            "Choose which task(s) handle this request next. Call it once with the best route(s)."
        )
        parameters = {
            "type": "object",
            "properties": {
                "to": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(routes)},
                    "minItems": 1,
                    "description": "route name(s): " + ", ".join(routes),
                }
            },
            "required": ["to"],
        }

        def execute(self, **arguments: Any) -> Any:
            chosen = _as_list(arguments.get("to"))
            unknown = [c for c in chosen if c not in routes]
            if unknown:
                return f"unknown route(s) {unknown}; choose from {routes}"
            return f"routing to {', '.join(chosen)}"

    return RouteTool()


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _from_text(text: str, routes: list[str]) -> list[str]:
    match = re.search(r"ROUTE:\s*(.+)", text)
    if match:
        named = [p.strip() for p in re.split(r"[,\s]+", match.group(1)) if p.strip()]
        picked = [r for r in named if r in routes]
        if picked:
            return picked
    lowered = text.lower()
    hits = []
    for route in routes:
        found = re.search(rf"(?<![\w-]){re.escape(route.lower())}(?![\w-])", lowered)
        if found:
            hits.append((found.start(), route))
    return [route for _, route in sorted(hits)]


def choose_routes(task: Any, result: RobotResult, *, message: str = "", run_id: str = "") -> list[str]:
    """The optional tasks ``task`` activates, given its robot's result."""
    routes: list[str] = list(task.routes)
    chosen: list[str] = list(result.activate)
    if not routes:
        return chosen
    if result.failed:
        return chosen
    if task.router:
        fn = import_object(task.router)
        if not callable(fn):
            raise ConfigurationError(f"router {task.router!r} is not callable")
        picked = _as_list(fn(result, routes))
    else:
        picked = []
        for call in result.tool_calls:
            if call.tool.name == ROUTE_TOOL:
                picked.extend(c for c in _as_list(call.tool.input.get("to")) if c in routes)
        if not picked:
            picked = _from_text(result.reply or "", routes)
    for name in picked:
        if name not in chosen:
            chosen.append(name)
    return chosen
