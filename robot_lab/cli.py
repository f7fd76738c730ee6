"""The ``robot-lab`` command.

Subcommands live in ``robot_lab.commands.*`` and load only when invoked (click's lazy-group
pattern), so ``robot-lab --help`` never imports litellm, rq or fastembed.

Two things every subcommand gets from the group:

* quiet logs on human paths: interactive commands log at WARNING unless ``-v`` (INFO),
  ``--debug`` (DEBUG) or ``ROBOT_LAB_LOG_LEVEL`` says otherwise; ``worker`` and
  ``watch --all`` keep the configured level (JSON lines for a log collector);
* one line per failure: any error a user can cause (a bad Redis URL, an unreachable or
  refusing Redis, an unknown robot, a bad app path, ...) prints ``Error: <what> (<hint>)``
  and exits 1 -- the traceback only with ``--debug`` (:mod:`robot_lab.commands.error_lines`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import click

from robot_lab import __version__

# command name -> "module:attribute" of a click.Command; one line per command.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "acl": ("robot_lab.commands.acl:acl", "Redis ACL users per robot worker and publisher (print or --apply)."),
    "schema": ("robot_lab.commands.schema:schema", "Print the JSON Schema of a wire type."),
    "chat": ("robot_lab.commands.chat:chat", "Run one robot on a message, streamed to the terminal."),
    "skills": ("robot_lab.commands.skills:skills", "AgentSkills: list, show, validate, create, match, eval, doctor."),
    "send": ("robot_lab.commands.bus:send", "Publish a message to a robot's inbox (--wait for the reply)."),
    "files": ("robot_lab.commands.files:files_group", "Files robots wrote, carried back in replies (files get REF)."),
    "tail": ("robot_lab.commands.bus:tail", "Follow a robot's inbox live."),
    "bus": ("robot_lab.commands.bus:bus_group", "Inspect robot inboxes (bus stats, bus remove)."),
    "dlq": ("robot_lab.commands.bus:dlq_group", "Dead letters of a robot: list, show, replay, purge."),
    "worker": ("robot_lab.commands.worker:worker", "Run robots' tasks (rq queues robot:<name>) and bus inboxes."),
    "run": ("robot_lab.commands.run:run", "Run a network (APP:NETWORK) on a message."),
    "watch": ("robot_lab.commands.run:watch", "Follow a network run live (or --all: coordinator mode)."),
    "cancel": ("robot_lab.commands.run:cancel", "Cancel a network run."),
    "pending": ("robot_lab.commands.answer:pending", "Input requests of parked runs waiting for an answer (--json)."),
    "answer": ("robot_lab.commands.answer:answer", "Answer a parked run's question (TEXT, --approve, --deny WHY)."),
    "demo": ("robot_lab.commands.demo:demo", "The support-desk network, live, with no setup."),
    "status": ("robot_lab.commands.status:status", "Queues, workers, bus lag, DLQ and active runs (--json)."),
    "health": ("robot_lab.commands.status:health", "Worker liveness/readiness probe (exit 0 = healthy)."),
    "runs": ("robot_lab.commands.runs:runs", "Recent network runs: status, duration, tokens, cost."),
    "metrics": ("robot_lab.commands.observe:metrics_cmd", "Prometheus exporter of queue, lag and budget gauges."),
    "dashboard": ("robot_lab.commands.observe:dashboard", "Web view of robots, queues, DLQ and live runs."),
    "a2a": ("robot_lab.commands.a2a:a2a", "Serve robots and networks as Agent2Agent (A2A) agents over HTTP."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            path = self.lazy[cmd_name][0]
            module_name, attr = path.split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            from robot_lab.commands.error_lines import one_line  # lazy: start-up time

            raise click.ClickException(one_line(exc)) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Show help lines without importing every command module.
        rows = [(name, self.lazy[name][1]) for name in sorted(self.lazy)]
        rows += [
            (name, cmd.get_short_help_str())
            for name, cmd in sorted(self.commands.items())
            if name not in self.lazy
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))


# Commands that are services, not conversations: their logs are their output.
SERVICE_COMMANDS = frozenset({"worker", "a2a"})


@click.group(cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="robot-lab")
@click.option("-v", "--verbose", count=True, help="More log lines on stderr (-v: info, -vv: debug).")
@click.option("--debug", is_flag=True, help="Debug log lines, and a full traceback when a command fails.")
@click.pass_context
def main(ctx: click.Context, verbose: int, debug: bool) -> None:
    """robot-lab: teams of LLM robots as worker processes on Redis.

    With no REDIS_URL everything runs in this process on an embedded fakeredis and, with no
    provider key, on the offline scripted model. Start with `robot-lab demo`.

    Exit status: 0 done, 1 failed (one line `Error: ...` on stderr; --debug shows the
    traceback), 2 a usage error, 124 a wait (run, demo) timed out while the run goes on,
    130 interrupted (Ctrl-C).
    """
    level = "DEBUG" if debug or verbose > 1 else "INFO" if verbose else None
    if level is None and (ctx.invoked_subcommand in SERVICE_COMMANDS or "ROBOT_LAB_LOG_LEVEL" in os.environ):
        return
    from robot_lab.logging import configure_logging  # lazy: start-up time

    configure_logging(level=level or "WARNING", force=True)
