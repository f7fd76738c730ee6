"""``robot-lab runs``: recent network runs from the run records in Redis."""

from __future__ import annotations

import datetime as dt
import json
import sys

import click

from robot_lab.commands.plain import Table, use_color
from robot_lab.commands.status import EMBEDDED_NOTE


@click.command("runs")
@click.option("--limit", "-n", type=int, default=20, show_default=True)
@click.option("--status", "status_filter", default=None,
              type=click.Choice(["running", "completed", "completed_with_errors", "cancelled"]),
              help="Only runs in this status (completed_with_errors: finished, but a task failed)")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON")
def runs(limit: int, status_filter: str | None, as_json: bool) -> None:
    """Recent runs: status, duration, tasks, tokens and cost (newest first)."""
    from robot_lab.workers.fleet_status import recent_runs  # lazy: start-up time

    rows = recent_runs(limit=limit, status=status_filter)
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        from robot_lab.settings import get_settings  # lazy: start-up time

        which = f"{status_filter} runs" if status_filter else "runs"
        click.echo(f"no {which} yet")
        if get_settings().embedded:
            click.echo(EMBEDDED_NOTE)
        return

    table = Table(f"recent runs ({len(rows)})", [
        ("run", "left"), ("network", "left"), ("status", "left"), ("started", "left"), ("duration", "right"),
        ("tasks d/f/s", "right"), ("tokens", "right"), ("cost $", "right")])
    style = {"completed": "green", "running": "cyan", "cancelled": "magenta", "completed_with_errors": "red"}
    for row in rows:
        started = dt.datetime.fromtimestamp(row["created_at"]).strftime("%Y-%m-%d %H:%M:%S") if row["created_at"] else ""
        duration = f"{row['duration']:.2f}s" if row["duration"] is not None else ""
        shown = "waiting" if row["status"] == "running" and row.get("waiting") else row["status"]  # a person must answer
        table.add_row(row["run_id"], row["network"], (shown, style.get(shown, "yellow")), started,
                      duration, f"{row['done']}/{row['failed']}/{row['skipped']} of {row['tasks']}",
                      str(row["tokens"]), f"{row['cost']:.4f}")
    click.echo(table.render(use_color(sys.stdout)))
