"""The run plan: everything a run of a robot uses, resolved in one place.

robot_lab documents the cascade as settings -> network -> robot -> template front matter ->
task -> the run call, the later winning. As in the Ruby gem's implementation (and this
project's tests), a template's front matter is the base of the robot layer, under the
robot's constructor arguments; so the layers here are::

    settings  ->  network  ->  robot (front matter < constructor)  ->  task  ->  run call

In-process ``Robot.run``, the bus serve path, network tasks (``network/task_job.py``),
delegation and spawn all go through :func:`resolve_plan`, so a robot behaves the same
wherever it runs. :meth:`TurnPlan.describe` is the "config in effect" of a run, with the
layer each value came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.robot.own_memory import own_memory
from robot_lab.runtime.run_config import RunConfig
from robot_lab.settings import get_settings

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

LAYERS = ("settings", "network", "robot", "task", "run")
SKILL_MODES = ("match", "tool")
# RunConfig fields that are not run parameters but tool policy, resolved by the toolset.
POLICY_FIELDS = ("tools", "mcp")


def as_config(value: RunConfig | Mapping[str, Any] | Any | None) -> RunConfig | None:
    """A RunConfig from a RunConfig, a mapping or RunConfigData (None stays None)."""
    if value is None or isinstance(value, RunConfig):
        return value
    if isinstance(value, Mapping):
        return RunConfig(value)
    return RunConfig.from_data(value)


def settings_layer() -> RunConfig:
    """The bottom layer: ``model`` (``ROBOT_LAB_MODEL``, a provider key's model, else the
    scripted model) and ``max_tool_rounds`` (finite by default)."""
    s = get_settings()
    return RunConfig(model=s.default_model(), max_tool_rounds=s.max_tool_rounds)


@dataclass
class TurnPlan:
    """The resolved configuration of one run. ``config`` is the merged RunConfig (LLM
    fields, loop guards, budgets, callbacks); ``sources`` names the layer of each field."""

    robot: str
    config: RunConfig
    sources: dict[str, str]
    provider: str | None
    provider_source: str | None
    skill_mode: str
    tools: Any = "none"
    mcp: Any = "none"
    network_config: RunConfig | None = None
    memory: Any = None
    ledgers: list[Any] = field(default_factory=list)
    doom_loop: Any = None

    @property
    def model(self) -> str:
        return str(self.config.model)

    @property
    def max_tool_rounds(self) -> int:
        return int(self.config.max_tool_rounds)

    def llm_params(self) -> dict[str, Any]:
        """Provider parameters for litellm (model excluded)."""
        return self.config.llm_params()

    def describe(self) -> dict[str, Any]:
        """The config in effect, serializable: each field's value and the layer it came from."""
        values = {k: v for k, v in self.config.to_json_dict().items() if k not in POLICY_FIELDS}
        out: dict[str, Any] = {k: {"value": v, "from": self.sources.get(k)} for k, v in sorted(values.items())}
        if self.provider:
            out["provider"] = {"value": self.provider, "from": self.provider_source}
        out["skill_mode"] = {"value": self.skill_mode, "from": "robot"}
        out["tools"] = {"value": self.tools, "from": "run"}
        out["mcp"] = {"value": self.mcp, "from": "run"}
        if self.memory is not None:
            out["memory"] = {"value": getattr(self.memory, "scope", str(self.memory)), "from": "run"}
        return out


def resolve_config(
    robot_config: RunConfig,
    *,
    network: RunConfig | None = None,
    task: RunConfig | None = None,
    run: RunConfig | None = None,
) -> tuple[RunConfig, dict[str, str]]:
    """Merge the layers (later wins) and remember where each value came from."""
    layers = (("settings", settings_layer()), ("network", network), ("robot", robot_config),
              ("task", task), ("run", run))
    merged = RunConfig()
    sources: dict[str, str] = {}
    for name, layer in layers:
        if layer is None:
            continue
        for key, value in layer.to_dict().items():
            if value is not None:
                sources[key] = name
        merged = merged.merge(layer)
    if merged.max_tool_rounds is None:
        raise ConfigurationError("max_tool_rounds must be set (the settings default keeps the tool loop finite)")
    return merged, sources


def resolve_plan(
    robot: RobotParts,
    *,
    tools: Any = "none",
    mcp: Any = "none",
    network_config: RunConfig | Mapping[str, Any] | None = None,
    task_config: RunConfig | Mapping[str, Any] | None = None,
    run_config: RunConfig | Mapping[str, Any] | None = None,
    memory: Any = None,
    network: Any = None,
    budgets: Iterable[Any] = (),
    doom_loop: Any = None,
) -> TurnPlan:
    """The plan of one run of ``robot`` (the owning Robot). ``memory`` is the Ruby gem's
    binding: the run's argument (a Memory, a scope name, or a mapping merged into the
    active memory), else the network's memory, else the robot's own."""
    net = as_config(network_config)
    task = as_config(task_config)
    run = as_config(run_config)
    config, sources = resolve_config(robot.config, network=net, task=task, run=run)
    parent = net  # the parent of "inherit" for tools/mcp: the task's policy, else the network's
    if task is not None and (task.tools is not None or task.mcp is not None):
        parent = (net or RunConfig()).merge({"tools": task.tools, "mcp": task.mcp})
    provider, provider_source = robot.provider, "robot"
    if not provider:
        provider, provider_source = get_settings().provider, "settings"
    return TurnPlan(
        robot=robot.name,
        config=config,
        sources=sources,
        provider=provider or None,
        provider_source=provider_source if provider else None,
        skill_mode=robot.skill_mode,
        tools=tools,
        mcp=mcp,
        network_config=parent,
        memory=bind_memory(robot, memory, network),
        ledgers=[robot.budget_ledger, *budgets],
        doom_loop=doom_loop,
    )


def bind_memory(robot: RobotParts, memory: Any, network: Any = None) -> Any:
    """the Ruby gem's ``run_memory``: the argument, else the network's, else the robot's own
    (opened when first used: :mod:`.own_memory`)."""
    default = getattr(network, "memory", None) if network is not None else None
    if default is not None:
        from robot_lab.memory.store import Memory  # lazy: start-up time (redis-py)

        if not isinstance(default, Memory):
            default = None
    if memory is None:
        return default if default is not None else own_memory(robot)
    from robot_lab.memory.store import Memory, resolve_memory  # lazy: start-up time (redis-py)

    if isinstance(memory, Memory):  # it replaces the default (a network task's run memory): the
        return memory  # robot's own is not opened for nothing (a Memory per task, on a worker)
    return resolve_memory(memory, default if default is not None else robot.memory)
