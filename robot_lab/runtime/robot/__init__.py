"""The Robot and its collaborators, one concern each.

``core`` (the Robot class and ``build``), ``plan`` (the run plan: one cascade for every
run, wherever it runs), ``prompt`` (templates, skills, the system prompt), ``toolset``
(which tools a run offers), ``serving`` (what a served robot offers), ``mcp_attach`` (MCP
servers of a robot), ``turn`` (one turn: hooks, prompt, tools, learnings), ``context``
(``current_turn()`` for tools), ``loop`` (the tool loop and the budget protocol of each
model call), ``drive`` (the sync and async drivers of that one loop), ``streaming``
(``astream``), ``learning``, ``compaction`` and ``spec`` (the robot as data).
``robot_lab.runtime.robot`` keeps exporting what the single module did.
"""

from robot_lab.runtime.robot.core import Robot, build
from robot_lab.runtime.robot.loop import ContentCallback
from robot_lab.runtime.robot.streaming import TurnStream
from robot_lab.runtime.robot.toolset import DEFAULT_MAX_TOOLS, NONE_VALUES, resolve_tool_setting

__all__ = ["DEFAULT_MAX_TOOLS", "NONE_VALUES", "ContentCallback", "Robot", "TurnStream", "build",
           "resolve_tool_setting"]
