"""Hooks: robot_lab's hook families (run, llm_generation, tool_call, network_run, task, ...)
as classmethods of a Hook subclass -- here an audit trail, a guard that short-circuits a
dangerous tool call, and a timing `around` hook.

    python examples/12_hooks.py
"""

import time

import robot_lab
from robot_lab import Hook

TRAIL: list[str] = []


class Audit(Hook):
    @classmethod
    def before_run(cls, ctx):
        TRAIL.append(f"run {ctx.robot.name}: {ctx.request!r}")

    @classmethod
    def before_tool_call(cls, ctx):
        TRAIL.append(f"tool {ctx.tool_name}({ctx.tool_args})")

    @classmethod
    def after_run(cls, ctx):
        TRAIL.append(f"done: {ctx.response.reply[:40]!r}")


class Guard(Hook):
    """Refuses to delete anything: sets the tool result without calling the tool."""

    @classmethod
    def around_tool_call(cls, ctx, call_next):
        if ctx.tool_name == "delete_account":
            ctx.tool_result = "refused by policy"
            return ctx.tool_result
        return call_next()


class Timer(Hook):
    @classmethod
    def around_llm_generation(cls, ctx, call_next):
        started = time.perf_counter()
        try:
            return call_next()
        finally:
            ctx.local.ms = (time.perf_counter() - started) * 1000
            TRAIL.append(f"model call {ctx.iteration}")


def delete_account(user: str) -> str:
    """Delete a user's account."""
    raise RuntimeError("this must never run in the example")


def account_info(user: str) -> str:
    """Show a user's account."""
    return f"{user}: premium plan"


offline = robot_lab.get_settings().default_model().startswith("scripted/")
robot = robot_lab.build(name="admin12", model="scripted/echo" if offline else None,
                        local_tools=[account_info, delete_account], hooks=[Audit, Guard, Timer])
result = robot.run("Show the account of 'ann', then delete it.", tools="inherit")
for line in TRAIL:
    print(line)
print("tool results:", {c.tool.name: c.data or c.error for c in result.tool_calls})
