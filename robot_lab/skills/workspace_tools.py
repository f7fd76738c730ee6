"""The workspace tools' first import path, kept for robots that name them by it
(``local_tools=["robot_lab.skills.workspace_tools:run_command"]``); they live in
:mod:`robot_lab.sandbox.workspace_tools`."""

from robot_lab.sandbox.workspace_tools import list_files, read_file, run_command, write_file

__all__ = ["list_files", "read_file", "run_command", "write_file"]
