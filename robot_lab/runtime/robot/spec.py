"""A robot as data: the RobotSpec that crosses process boundaries (the bus, network
tasks, the registry, spawn). Live objects (lambdas, connections, callbacks) never cross,
so a tool without an import path is refused here rather than failing in a worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.run_config import RunConfig
from robot_lab.schemas.messages import RobotSpec

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts


def to_spec(robot: RobotParts) -> RobotSpec:
    """``robot`` (a Robot) as a RobotSpec. Every tool needs an import path."""
    paths = []
    for t in robot.local_tools:
        if not t.import_path:
            raise ConfigurationError(
                f"robot {robot.name!r}: tool {t.name!r} has no import path, so it cannot be sent to a worker; "
                "define it at module level"
            )
        paths.append(t.import_path)
    return RobotSpec(
        name=robot.name,
        description=robot.description,
        model=robot.config.model,
        provider=robot.provider,
        system_prompt=robot.system_prompt,
        template=robot.template,
        context=robot.context if not callable(robot._context_source) else {},
        local_tools=paths,
        skills=robot.skills,
        mcp_servers=robot.mcp_servers,
        config=RunConfig(robot.config.to_json_dict()).merge({"model": None}).to_data(),
        hooks=robot.hooks.import_paths(),
        skill_mode=robot.skill_mode,
        mcp_discovery=robot.mcp_discovery,
        template_dirs=robot.template_dirs,
        serve_tools=robot.serve_tools,
        serve_mcp=robot.serve_mcp,
        a2a_agents=list(robot.a2a_agents),
    )


def spec_kwargs(spec: RobotSpec) -> dict[str, Any]:
    """The Robot constructor arguments that rebuild ``spec`` (name excluded)."""
    return {
        "template": spec.template,
        "system_prompt": spec.system_prompt,
        "context": spec.context,
        "description": spec.description,
        "local_tools": list(spec.local_tools),
        "model": spec.model,
        "provider": spec.provider,
        "mcp_servers": spec.mcp_servers,
        "skills": spec.skills,
        "config": RunConfig.from_data(spec.config),
        "hooks": list(spec.hooks),
        "skill_mode": spec.skill_mode,
        "mcp_discovery": spec.mcp_discovery,
        "template_dirs": spec.template_dirs,
        "serve_tools": spec.serve_tools,
        "serve_mcp": spec.serve_mcp,
        "a2a_agents": list(spec.a2a_agents),
    }


def check_bus(bus: Any) -> Any:
    """A robot's ``bus`` (used for delegation by name and spawn) must be a Bus."""
    if bus is not None and not (hasattr(bus, "request") and hasattr(bus, "publish") and hasattr(bus, "redis")):
        raise ConfigurationError(f"bus must be a robot_lab.Bus, got {type(bus).__name__}")
    return bus
