"""The network DSL (the Ruby gem's ``create_network`` / SimpleFlow pipeline), distributed.

A :class:`Network` is a DAG of tasks. Each task names a robot; it runs after the tasks it
``depends_on`` (a list of task or ``parallel`` group names), or -- for
``depends_on="optional"`` -- only when a routing task activates it. ``network.run()``
hands the DAG to the :mod:`coordinator <robot_lab.network.coordinator>`, which stores the run
in Redis and enqueues each ready task as an rq job on ``robot:<robot>``.

Data flow (the Ruby gem's ``extract_run_context``): an entry task gets the run's message; a
task with one parent gets that parent's reply (``RobotResult.reply``); a task with several
parents gets their replies as sections (``## <task>`` + reply, in ``depends_on`` order,
skipped parents left out); an optional task gets its activator's reply. Run context
(``run(**context)``) deep-merged with the task's ``context`` becomes template context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgspec

from robot_lab.errors import ConfigurationError
from robot_lab.network import dag
from robot_lab.network.dag import OPTIONAL, GroupSpec, NetworkSpec, TaskSpec
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.observability import instrument as observe
from robot_lab.runtime.rails.hooks import HookRegistry, NetworkRunHookContext, hook_scope, run_hooks
from robot_lab.schemas import RobotSpec, RunConfigData
from robot_lab.schemas.validation import convert

if TYPE_CHECKING:  # pragma: no cover
    from robot_lab.connection import RedisClient
    from robot_lab.network.coordinator import NetworkResult, RunHandle
    from robot_lab.runtime.registry import RobotSource as App  # the App, seen from below: a robot source
    from robot_lab.runtime.robot import Robot


def _config_data(config: Any) -> RunConfigData | None:
    if config is None:
        return None
    if isinstance(config, RunConfigData):
        return config
    to_data = getattr(config, "to_data", None)
    if callable(to_data):
        return to_data()
    return convert(dict(config), RunConfigData)


class Network:
    """A named DAG of robot tasks. Build with :func:`create_network`."""

    def __init__(self, name: str, *, app: App | None = None, config: Any = None,
                 description: str | None = None) -> None:
        dag._check_name("network", name)

        self.hooks = HookRegistry()
        self.name = name
        self.app = app
        self.description = description
        self.config = _config_data(config) or RunConfigData()
        self.robots: dict[str, Robot | RobotSpec] = {}
        self._tasks: list[TaskSpec] = []
        self._groups: list[GroupSpec] = []
        self._group_stack: list[GroupSpec] = []
        self._graph: dag.Graph | None = None

    # --- DSL -----------------------------------------------------------------------------
    def task(
        self,
        name: str,
        robot: Robot | RobotSpec | str,
        *,
        depends_on: str | list[str] | None = None,
        context: dict[str, Any] | None = None,
        tools: str | list[str] | None = None,
        config: Any = None,
        routes: list[str] | None = None,
        router: str | None = None,
        memory_key: str | None = None,
        timeout: float | None = None,
        retries: int = 2,
        mcp: str | list[str] | None = None,
        memory: str | None = None,
    ) -> Network:
        """Add a task. ``depends_on``: None (entry, or the enclosing group's dependencies),
        a task/group name or list of them, or ``"optional"`` (runs only when activated).
        ``routes``: optional tasks this task may activate -- its robot chooses through a
        ``route`` tool call unless ``router`` (``pkg.mod:func``) decides in Python.
        ``memory_key``: also store the reply in the run's shared memory under that key.
        ``mcp``: the task's MCP servers (``none`` default, ``inherit``, or names), like ``tools``.
        ``memory``: the scope name of the task robot's active memory (default: the run's
        shared memory, ``run:<id>``)."""
        dag._check_name("task", name)
        if any(t.name == name for t in self._tasks):
            raise ConfigurationError(f"network {self.name!r}: task {name!r} is defined twice")
        robot_name = self._register_robot(name, robot)
        optional = False
        deps: list[str]
        if depends_on is None or depends_on == "none":
            deps = list(self._group_stack[-1].depends_on) if self._group_stack else []
        elif depends_on == OPTIONAL:
            if self._group_stack:
                raise ConfigurationError(f"network {self.name!r}: optional task {name!r} cannot be in a parallel group")
            optional, deps = True, []
        elif isinstance(depends_on, str):
            deps = [depends_on]
        elif isinstance(depends_on, (list, tuple)) and all(isinstance(d, str) for d in depends_on):
            deps = list(depends_on)
        else:
            raise ConfigurationError(
                f"network {self.name!r}: task {name!r} depends_on must be None, 'optional', a name or a list "
                f"of names, got {depends_on!r}"
            )
        if tools is not None and not (tools in ("none", "inherit") or isinstance(tools, list)):
            raise ConfigurationError(
                f"network {self.name!r}: task {name!r} tools must be 'none', 'inherit' or a list of names"
            )
        if mcp is not None and not (mcp in ("none", "inherit") or isinstance(mcp, list)):
            raise ConfigurationError(
                f"network {self.name!r}: task {name!r} mcp must be 'none', 'inherit' or a list of server names"
            )
        if memory is not None and (not isinstance(memory, str) or not memory.strip()):
            raise ConfigurationError(
                f"network {self.name!r}: task {name!r} memory must be a scope name (a non-empty string), "
                f"got {memory!r}"
            )
        spec = TaskSpec(
            name=name,
            robot=robot_name,
            depends_on=deps,
            optional=optional,
            group=self._group_stack[-1].name if self._group_stack else None,
            context=dict(context or {}),
            tools=tools,
            config=_config_data(config),
            routes=list(routes or []),
            router=router,
            memory_key=memory_key,
            timeout=timeout,
            retries=retries,
            mcp=mcp,
            memory=memory,
        )
        self._tasks.append(spec)
        if self._group_stack:
            self._group_stack[-1].members.append(name)
        self._graph = None
        return self

    @contextmanager
    def parallel(self, name: str, *, depends_on: str | list[str] | None = None) -> Iterator[Network]:
        """A group whose tasks share ``depends_on`` and run concurrently; later tasks may
        depend on the group by name."""
        dag._check_name("group", name)
        if self._group_stack:
            raise ConfigurationError(f"network {self.name!r}: parallel group {name!r} cannot be nested")
        deps = [depends_on] if isinstance(depends_on, str) else list(depends_on or [])
        group = GroupSpec(name=name, depends_on=deps)
        self._groups.append(group)
        self._group_stack.append(group)
        try:
            yield self
        finally:
            self._group_stack.pop()
            self._graph = None

    def _register_robot(self, task: str, robot: str | RobotSpec | Robot) -> str:
        if isinstance(robot, str):
            if not robot:
                raise ConfigurationError(f"network {self.name!r}: task {task!r} needs a robot")
            return robot
        name = getattr(robot, "name", None)
        if not isinstance(name, str) or not (isinstance(robot, RobotSpec) or hasattr(robot, "to_spec")):
            raise ConfigurationError(
                f"network {self.name!r}: task {task!r} robot must be a Robot, a RobotSpec or a robot name, "
                f"got {type(robot).__name__}"
            )
        known = self.robots.get(name)
        if known is not None and known is not robot:
            raise ConfigurationError(
                f"network {self.name!r}: two different robots are named {name!r}; robot names must be unique"
            )
        self.robots[name] = robot
        return name

    # --- data ----------------------------------------------------------------------------
    @property
    def spec(self) -> NetworkSpec:
        return NetworkSpec(
            name=self.name,
            tasks=list(self._tasks),
            groups=[GroupSpec(name=g.name, depends_on=list(g.depends_on), members=list(g.members))
                    for g in self._groups],
            config=self.config,
            app=self.app.import_path if self.app is not None else None,
            description=self.description,
            hooks=self.hooks.import_paths(),
        )

    def validate(self) -> dag.Graph:
        """Check the DAG (cycles, unknown dependencies, unreachable optional tasks)."""
        if self._graph is None:
            self._graph = dag.compile_network(self.spec)
        return self._graph

    graph = property(validate)

    @property
    def tasks(self) -> list[str]:
        return [t.name for t in self._tasks]

    def robot_spec(self, name: str) -> RobotSpec | None:
        robot = self.robots.get(name)
        if robot is None:
            return None
        return robot if isinstance(robot, RobotSpec) else robot.to_spec()

    def visualize(self) -> str:
        return dag.visualize(self.validate())

    def to_mermaid(self) -> str:
        return dag.to_mermaid(self.validate())

    def to_dot(self) -> str:
        return dag.to_dot(self.validate())

    def execution_plan(self) -> list[dict[str, Any]]:
        return dag.execution_plan(self.validate())

    def to_dict(self) -> dict[str, Any]:
        """The Ruby gem's ``to_h``: name, robots, tasks, optional tasks, config."""
        return {
            "name": self.name,
            "robots": sorted({t.robot for t in self._tasks}),
            "tasks": self.tasks,
            "optional_tasks": [t.name for t in self._tasks if t.optional],
            "config": msgspec.to_builtins(self.config),
        }

    @classmethod
    def from_spec(cls, spec: NetworkSpec, *, app: App | None = None) -> Network:
        net = cls(spec.name, app=app, config=spec.config, description=spec.description)
        net._tasks = list(spec.tasks)
        net._groups = list(spec.groups)
        return net

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, app: App | None = None) -> Network:
        """The YAML form: ``name``, ``config``, ``tasks`` (each like :meth:`task`'s
        arguments) and ``parallel`` groups (``name``, ``depends_on``, ``tasks``)."""
        if not isinstance(data, dict) or "name" not in data:
            raise ConfigurationError("a network needs a mapping with at least 'name' and 'tasks'")
        unknown = set(data) - {"name", "description", "config", "tasks", "parallel"}
        if unknown:
            raise ConfigurationError(f"network {data['name']!r}: unknown keys {sorted(unknown)}")
        net = cls(data["name"], app=app, config=data.get("config"), description=data.get("description"))

        def add(raw: Any, where: str) -> None:
            if not isinstance(raw, dict) or "name" not in raw or "robot" not in raw:
                raise ConfigurationError(f"network {net.name!r}: {where} needs 'name' and 'robot'")
            allowed = {"name", "robot", "depends_on", "context", "tools", "config", "routes", "router",
                       "memory_key", "timeout", "retries", "mcp", "memory"}
            extra = set(raw) - allowed
            if extra:
                raise ConfigurationError(f"network {net.name!r}: {where} has unknown keys {sorted(extra)}")
            args = dict(raw)
            net.task(args.pop("name"), args.pop("robot"), **args)

        for index, raw in enumerate(data.get("tasks") or []):
            add(raw, f"tasks[{index}]")
        for index, group in enumerate(data.get("parallel") or []):
            if not isinstance(group, dict) or "name" not in group:
                raise ConfigurationError(f"network {net.name!r}: parallel[{index}] needs a name")
            with net.parallel(group["name"], depends_on=group.get("depends_on")):
                for j, raw in enumerate(group.get("tasks") or []):
                    add(raw, f"parallel[{index}].tasks[{j}]")
        # Groups may be listed after tasks that depend on them: order tasks by the graph.
        net._tasks = _definition_order(net._tasks, net._groups)
        return net

    # --- running ---------------------------------------------------------------------------
    def submit(self, message: Any = None, *, connection: RedisClient | None = None, max_concurrent: int | None = None,
               stream: bool = True, run_id: str | None = None, **context: Any) -> RunHandle:
        """Store the run in Redis and enqueue its first tasks; returns at once."""
        from robot_lab.network.coordinator import Coordinator  # lazy: start-up time

        return Coordinator(connection=connection).submit(
            self, message, context=context, max_concurrent=max_concurrent, stream=stream, run_id=run_id
        )

    @observe.network_run
    def run(self, message: Any = None, *, wait: bool = True, timeout: float | None = None,
            connection: RedisClient | None = None, max_concurrent: int | None = None, stream: bool = True,
            workers: int | None = None, **context: Any) -> NetworkResult | RunHandle:
        """Run the network. With ``wait`` (default) block until it finishes and return a
        :class:`NetworkResult`; else return the :class:`RunHandle`.

        Embedded mode (no REDIS_URL, or a fakeredis ``connection``): in-process workers
        (``workers`` threads, default 4) execute the tasks for the duration of the call.
        """
        ctx = NetworkRunHookContext(network=self, config=self.config, context=dict(context))
        with hook_scope(self.hooks):
            return run_hooks(
                "network_run",
                ctx,
                lambda: self._run(message, wait=wait, timeout=timeout, connection=connection,
                                  max_concurrent=max_concurrent, stream=stream, workers=workers, **ctx.context),
            )

    def _run(self, message: Any, *, wait: bool, timeout: float | None, connection: RedisClient | None,
             max_concurrent: int | None, stream: bool, workers: int | None, **context: Any
             ) -> NetworkResult | RunHandle:
        from robot_lab.network.coordinator import Coordinator, is_embedded  # lazy: start-up time

        coordinator = Coordinator(connection=connection)
        if is_embedded(coordinator.connection):
            pool = EmbeddedWorkers(
                coordinator.connection,
                queues=sorted({t.robot for t in self._tasks}),
                threads=workers or 4,
            )
            pool.start()
            try:
                handle = coordinator.submit(self, message, context=context, max_concurrent=max_concurrent,
                                            stream=stream)
                return handle.wait(timeout=timeout)
            finally:
                pool.stop(wait=False)
        handle = coordinator.submit(self, message, context=context, max_concurrent=max_concurrent, stream=stream)
        return handle.wait(timeout=timeout) if wait else handle

    def on(self, handler: Any, context: dict[str, Any] | None = None) -> Network:
        """Register a network-scoped hook (a Hook subclass defined at module level, or its
        import path): ``network_run`` fires here, ``task``/``run``/``llm_generation``/
        ``tool_call`` fire in the worker that runs each task."""
        self.hooks.on(handler, context)
        return self

    def attach(self, run_id: str, *, connection: RedisClient | None = None) -> RunHandle:
        """Follow a run submitted elsewhere (e.g. by a coordinator that died)."""
        from robot_lab.network.coordinator import Coordinator  # lazy: start-up time

        return Coordinator(connection=connection).attach(run_id)

    def __repr__(self) -> str:
        return f"<Network {self.name} tasks={self.tasks}>"


def _definition_order(tasks: list[TaskSpec], groups: list[GroupSpec]) -> list[TaskSpec]:
    """Keep the written order but never place a task before what it depends on."""
    members = {g.name: g.members for g in groups}
    by_name = {t.name: t for t in tasks}
    done: set[str] = set()
    visiting: set[str] = set()
    out: list[TaskSpec] = []

    def visit(task: TaskSpec) -> None:
        if task.name in done or task.name in visiting:
            return  # cycles are reported by compile_network
        visiting.add(task.name)
        for dep in task.depends_on:
            for name in members.get(dep, [dep]):
                if name in by_name:
                    visit(by_name[name])
        visiting.discard(task.name)
        done.add(task.name)
        out.append(task)

    for task in tasks:
        visit(task)
    return out


def create_network(name: str, *, app: App | None = None, config: Any = None,
                   description: str | None = None) -> Network:
    """The Ruby gem's ``RobotLab.create_network``: an empty network to add tasks to."""
    return Network(name, app=app, config=config, description=description)
