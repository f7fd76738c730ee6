"""Agent cards: what a robot or a network tells an A2A client about itself.

A robot's skills are its tools and AgentSkills (what it can do when served: a served robot
offers what it was built with, docs/run-plan.md); a network's are its tasks. Every card
declares streaming and the security scheme the server enforces (:mod:`.auth`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
)

from robot_lab import __version__
from robot_lab.a2a.auth import security_fields
from robot_lab.settings import A2ASettings
from robot_lab.text.frontmatter import split_front_matter

OUTPUT_MODES = ["text/plain"]


def _version() -> str:
    return __version__


def _card(name: str, description: str, url: str, skills: list[AgentSkill], settings: A2ASettings) -> AgentCard:
    schemes, requirements = security_fields(settings)
    return AgentCard(
        name=name,
        description=description,
        version=_version(),
        provider=AgentProvider(organization="robot-lab", url="https://github.com/robot-lab"),
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=version)
                              for version in (["1.0", "0.3"] if settings.card_v03 else ["1.0"])],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False, extended_agent_card=False),
        security_schemes=schemes,
        security_requirements=requirements,
        default_input_modes=settings.input_modes,
        default_output_modes=OUTPUT_MODES,
        skills=skills,
    )


def robot_card(robot: Any, url: str, settings: A2ASettings) -> AgentCard:
    """``robot`` is a Robot (its tools are read) or a RobotSpec (tool import paths)."""
    skills: list[AgentSkill] = []
    tools = [*getattr(robot, "local_tools", []), *getattr(robot, "a2a_tools", [])]
    for tool in tools:
        if isinstance(tool, str):  # a spec's import path
            name = tool.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
            skills.append(AgentSkill(id=f"tool:{name}", name=name, description=f"tool {tool}", tags=["tool"]))
        else:
            skills.append(AgentSkill(id=f"tool:{tool.name}", name=tool.name,
                                     description=tool.description or tool.name, tags=["tool"]))
    for path in getattr(robot, "skills", []) or []:
        name = Path(str(path)).name
        skills.append(AgentSkill(id=f"skill:{name}", name=name, description=_skill_description(path) or name,
                                 tags=["agent-skill"]))
    description = robot.description or f"robot-lab robot {robot.name}"
    if not skills:
        skills.append(AgentSkill(id="chat", name=robot.name, description=description, tags=["chat"]))
    return _card(robot.name, description, url, skills, settings)


def _skill_description(path: Any) -> str | None:
    """The ``description`` of an AgentSkill's SKILL.md front matter, when it can be read."""
    try:
        file = Path(str(path)) / "SKILL.md"
        meta, _ = split_front_matter(file.read_text(), str(file))
        value = meta.get("description") if isinstance(meta, dict) else None
        return str(value) if value else None
    except Exception:  # a skill that does not load still gets a card entry by name
        return None


def network_card(network: Any, url: str, settings: A2ASettings) -> AgentCard:
    graph = network.validate()
    skills = [AgentSkill(id=f"task:{name}", name=name, description=f"task {name} (robot {graph.tasks[name].robot})",
                         tags=["network-task"]) for name in graph.order]
    description = getattr(network, "description", None) or f"robot-lab network {network.name}: {' -> '.join(graph.order)}"
    return _card(network.name, description, url, skills, settings)
