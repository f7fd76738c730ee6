"""Networks as data: the task/group specs a run is made of, their validation, and the
compiled graph (dependencies expanded, routes inverted) that the run state machine uses.

Everything here is plain data so that a network defined in one process (or in YAML) can be
stored in Redis and advanced by any worker. Validation happens here, at definition or
submission time, so a bad network fails before a single job is enqueued.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from robot_lab.errors import ConfigurationError
from robot_lab.schemas import RunConfigData

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")
OPTIONAL = "optional"


class TaskSpec(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One step of a network: which robot runs, on what, after what.

    ``depends_on`` lists task or group names; ``optional`` tasks run only when a task that
    lists them in ``routes`` activates them. ``router`` is a Python router by import path
    (``pkg.mod:func``); without it, a task with ``routes`` lets its robot choose through a
    ``route`` tool call (or, failing that, by naming a route in its reply).
    """

    name: str
    robot: str
    depends_on: list[str] = msgspec.field(default_factory=list)
    optional: bool = False
    group: str | None = None
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    tools: str | list[str] | None = None
    config: RunConfigData | None = None
    routes: list[str] = msgspec.field(default_factory=list)
    router: str | None = None
    memory_key: str | None = None
    mcp: str | list[str] | None = None
    memory: str | None = None  # the scope of the task's active memory (default: the run's)
    timeout: float | None = None
    retries: int = 2


class GroupSpec(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A ``parallel`` group: its members share the group's dependencies and run together."""

    name: str
    depends_on: list[str] = msgspec.field(default_factory=list)
    members: list[str] = msgspec.field(default_factory=list)


class NetworkSpec(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A whole network as data (what is stored with each run)."""

    name: str
    tasks: list[TaskSpec] = msgspec.field(default_factory=list)
    groups: list[GroupSpec] = msgspec.field(default_factory=list)
    config: RunConfigData = msgspec.field(default_factory=RunConfigData)
    app: str | None = None
    description: str | None = None
    hooks: list[str] = msgspec.field(default_factory=list)


@dataclass
class Graph:
    """A validated network: dependencies expanded to task names, routes inverted."""

    spec: NetworkSpec
    order: list[str]
    tasks: dict[str, TaskSpec]
    deps: dict[str, list[str]]
    children: dict[str, list[str]]
    activators: dict[str, list[str]]
    levels: list[list[str]] = field(default_factory=list)

    def parents(self, name: str) -> list[str]:
        """The tasks whose ends decide when ``name`` runs: its activators for an optional
        task (it runs once one activates it, else is skipped once all ended), else its deps."""
        return self.activators.get(name, []) if self.tasks[name].optional else self.deps[name]

    def lua_graph(self) -> dict[str, dict[str, Any]]:
        """Per-task JSON the run-state scripts read (see run_state.py): ``i`` is the task's
        place in the order (ready tasks are queued in it), ``dependents`` the tasks whose
        :meth:`parents` include it (a result touches only those)."""
        dependents: dict[str, list[str]] = {name: [] for name in self.order}
        for name in self.order:
            for parent in self.parents(name):
                dependents[parent].append(name)
        return {
            name: {
                "deps": self.deps[name],
                "optional": self.tasks[name].optional,
                "activators": self.activators.get(name, []),
                "robot": self.tasks[name].robot,
                "i": i,
                "dependents": dependents[name],
            }
            for i, name in enumerate(self.order, 1)
        }

    def counts(self) -> dict[str, int]:
        """The run's ``R:counts`` at submit: each task's parents not ended (``l:``) and ended
        but not skipped (``r:``)."""
        out: dict[str, int] = {}
        for name in self.order:
            out[f"l:{name}"] = len(self.parents(name))
            out[f"r:{name}"] = 0
        return out

    def final_task_candidates(self) -> list[str]:
        """Sinks (no dependents, no routes), in definition order; the run's answer is the
        last one of them that ran."""
        return [name for name in self.order if not self.children[name] and not self.tasks[name].routes]


def _check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigurationError(
            f"{kind} name {name!r} is invalid: use letters, digits, '_' and '-' (it becomes part of rq job ids)"
        )
    return name


def _find_cycle(deps: dict[str, list[str]], order: list[str]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []
    for node in order:
        if node not in state:
            found = _visit(node, deps, state, stack)
            if found:
                return found
    return None


def _visit(node: str, deps: dict[str, list[str]], state: dict[str, int], stack: list[str]) -> list[str] | None:
    """The cycle check's depth-first step (a module function: a recursive closure would be a
    reference cycle, left for the collector at every compile)."""
    state[node] = 1
    stack.append(node)
    for dep in deps[node]:
        if state.get(dep) == 1:
            return stack[stack.index(dep):] + [dep]
        if dep not in state:
            found = _visit(dep, deps, state, stack)
            if found:
                return found
    stack.pop()
    state[node] = 2
    return None


def compile_network(spec: NetworkSpec) -> Graph:
    """Validate ``spec`` and build its :class:`Graph`; raises ConfigurationError naming the
    network and the offending task."""
    where = f"network {spec.name!r}"
    _check_name("network", spec.name)
    if not spec.tasks:
        raise ConfigurationError(f"{where} has no tasks")
    tasks: dict[str, TaskSpec] = {}
    for task in spec.tasks:
        _check_name("task", task.name)
        if task.name in tasks:
            raise ConfigurationError(f"{where}: task {task.name!r} is defined twice")
        if not isinstance(task.robot, str) or not task.robot:
            raise ConfigurationError(f"{where}: task {task.name!r} needs a robot name")
        tasks[task.name] = task
    groups: dict[str, GroupSpec] = {}
    for group in spec.groups:
        _check_name("group", group.name)
        if group.name in tasks or group.name in groups:
            raise ConfigurationError(f"{where}: group name {group.name!r} clashes with a task or another group")
        for member in group.members:
            if member not in tasks:
                raise ConfigurationError(f"{where}: group {group.name!r} lists unknown task {member!r}")
        groups[group.name] = group

    order = [t.name for t in spec.tasks]
    deps: dict[str, list[str]] = {}
    for task in spec.tasks:
        if task.optional and task.depends_on:
            raise ConfigurationError(
                f"{where}: task {task.name!r} is optional and also depends on {task.depends_on}; an optional "
                "task runs right after the task that activates it (depends_on='optional' only)"
            )
        expanded: list[str] = []
        for dep in task.depends_on:
            if dep in groups:
                members = groups[dep].members
                if task.name in members:
                    raise ConfigurationError(f"{where}: task {task.name!r} depends on its own group {dep!r}")
                if not members:
                    raise ConfigurationError(f"{where}: task {task.name!r} depends on empty group {dep!r}")
                expanded.extend(m for m in members if m not in expanded)
            elif dep in tasks:
                if dep == task.name:
                    raise ConfigurationError(f"{where}: task {task.name!r} depends on itself")
                if dep not in expanded:
                    expanded.append(dep)
            else:
                known = ", ".join(order + list(groups))
                raise ConfigurationError(
                    f"{where}: task {task.name!r} depends on unknown task or group {dep!r} (known: {known})"
                )
        deps[task.name] = expanded

    activators: dict[str, list[str]] = {}
    for task in spec.tasks:
        if task.router is not None and (":" not in task.router or task.router.count(":") != 1):
            raise ConfigurationError(
                f"{where}: task {task.name!r} router {task.router!r} must be an import path 'pkg.module:function'"
            )
        if task.router is not None and not task.routes:
            raise ConfigurationError(f"{where}: task {task.name!r} has a router but no routes to choose from")
        for route in task.routes:
            target = tasks.get(route)
            if target is None:
                raise ConfigurationError(f"{where}: task {task.name!r} routes to unknown task {route!r}")
            if not target.optional:
                raise ConfigurationError(
                    f"{where}: task {task.name!r} routes to {route!r}, which is not optional "
                    "(declare it with depends_on='optional')"
                )
            activators.setdefault(route, []).append(task.name)
    for task in spec.tasks:
        if task.optional and not activators.get(task.name):
            raise ConfigurationError(
                f"{where}: optional task {task.name!r} can never run: no task lists it in routes"
            )

    # An optional task runs after its activator, so activation edges count for cycles.
    edges = {name: deps[name] + activators.get(name, []) for name in order}
    cycle = _find_cycle(edges, order)
    if cycle:
        raise ConfigurationError(f"{where} has a cycle: {' -> '.join(reversed(cycle))}")

    children: dict[str, list[str]] = {name: [] for name in order}
    for name in order:
        for dep in deps[name]:
            children[dep].append(name)

    graph = Graph(spec=spec, order=order, tasks=tasks, deps=deps, children=children, activators=activators)
    graph.levels = _levels(graph, edges)
    return graph


def _levels(graph: Graph, edges: dict[str, list[str]]) -> list[list[str]]:
    depth: dict[str, int] = {}
    for name in graph.order:
        _level(name, edges, depth)
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for name in graph.order:
        out[depth[name]].append(name)
    return out


def _level(name: str, edges: dict[str, list[str]], depth: dict[str, int]) -> int:
    """A task's depth (a module function, as :func:`_visit`)."""
    if name not in depth:
        depth[name] = 1 + max((_level(d, edges, depth) for d in edges[name]), default=-1)
    return depth[name]


# ---------------------------------------------------------------------------------------
# Rendering (robot_lab delegates these to SimpleFlow)


def _label(graph: Graph, name: str) -> str:
    task = graph.tasks[name]
    extra = " (optional)" if task.optional else ""
    return f"{name} [{task.robot}]{extra}"


def visualize(graph: Graph) -> str:
    """An ASCII picture: one line per stage, each task with its robot and its inputs."""
    lines = [f"Network: {graph.spec.name}"]
    for index, stage in enumerate(graph.levels, 1):
        parallel = " (parallel)" if len(stage) > 1 else ""
        lines.append(f"Stage {index}{parallel}:")
        for name in stage:
            task = graph.tasks[name]
            inputs = graph.deps[name] or graph.activators.get(name, [])
            arrow = f" <- {', '.join(inputs)}" if inputs else " <- message"
            via = " (when activated)" if task.optional else ""
            routes = f"  routes: {', '.join(task.routes)}" if task.routes else ""
            lines.append(f"  - {_label(graph, name)}{arrow}{via}{routes}")
    return "\n".join(lines)


def to_mermaid(graph: Graph) -> str:
    lines = ["graph TD"]
    for name in graph.order:
        task = graph.tasks[name]
        shape = f'{name}{{{{"{_label(graph, name)}"}}}}' if task.optional else f'{name}["{_label(graph, name)}"]'
        lines.append(f"    {shape}")
    for group in graph.spec.groups:
        lines.append(f"    subgraph {group.name}")
        lines.extend(f"        {m}" for m in group.members)
        lines.append("    end")
    for name in graph.order:
        for dep in graph.deps[name]:
            lines.append(f"    {dep} --> {name}")
        for activator in graph.activators.get(name, []):
            lines.append(f"    {activator} -.->|route| {name}")
    return "\n".join(lines)


def to_dot(graph: Graph) -> str:
    lines = [f'digraph "{graph.spec.name}" {{', "    rankdir=TB;"]
    for name in graph.order:
        style = ", style=dashed" if graph.tasks[name].optional else ""
        lines.append(f'    "{name}" [label="{_label(graph, name)}"{style}];')
    for group in graph.spec.groups:
        lines.append(f'    subgraph "cluster_{group.name}" {{ label="{group.name}";')
        lines.extend(f'        "{m}";' for m in group.members)
        lines.append("    }")
    for name in graph.order:
        for dep in graph.deps[name]:
            lines.append(f'    "{dep}" -> "{name}";')
        for activator in graph.activators.get(name, []):
            lines.append(f'    "{activator}" -> "{name}" [style=dashed, label="route"];')
    lines.append("}")
    return "\n".join(lines)


def execution_plan(graph: Graph) -> list[dict[str, Any]]:
    """Stages in the order they can run; tasks within a stage may run concurrently."""
    return [
        {
            "stage": index,
            "tasks": [
                {
                    "name": name,
                    "robot": graph.tasks[name].robot,
                    "depends_on": graph.deps[name],
                    "optional": graph.tasks[name].optional,
                    "activated_by": graph.activators.get(name, []),
                }
                for name in stage
            ],
        }
        for index, stage in enumerate(graph.levels, 1)
    ]
