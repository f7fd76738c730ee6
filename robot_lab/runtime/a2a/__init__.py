"""Remote A2A agents as a robot's tools (``a2a_agents=[...]``, like ``mcp_servers``)."""

from robot_lab.runtime.a2a.tool import A2AAgentTool, agent_tools

__all__ = ["A2AAgentTool", "agent_tools"]
