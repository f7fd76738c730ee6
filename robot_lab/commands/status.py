"""``robot-lab status`` (queues, workers, bus, DLQ, active runs; ``--json`` for scripts) and
``robot-lab health`` (the worker liveness / readiness probe)."""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import click

from robot_lab.commands.plain import Table, style, use_color
from robot_lab.keys import default_keys


def _fmt_age(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"


def render_status(data: dict[str, Any]) -> None:
    """The status document as plain lines and tables (colour on a terminal: commands/plain.py)."""
    color = use_color(sys.stdout)
    out: list[str] = [f"{style('robot-lab', 'bold', color)} prefix {style(data['prefix'], 'cyan', color)} "
                      f"on {data['redis']}"]
    if data["redis"] == "embedded":
        out.append(style(EMBEDDED_NOTE, "yellow", color))
    if not data["robots"] and not data["unknown"]:  # (a typo gets its problem line instead)
        out.append(style("no robots yet: no inbox, queue, worker or run under this prefix", "dim", color))
    else:
        out.append(_robots_table(data).render(color))
    for server in data.get("a2a") or []:
        out.append(f"A2A {style(server['name'], 'cyan', color)} at {server['url']} ({server['host']} pid "
                   f"{server['pid']}): {', '.join(server['agents'])}")
    if data["runs"]:
        runs = Table("active runs", [(col, "left") for col in
                                     ("run", "network", "age", "progress", "running", "abandoned / lost")])
        for run in data["runs"]:
            bar = int(run["progress"] * 20)
            runs.add_row(run["run_id"], run["network"], _fmt_age(run["age"]),
                         f"{'█' * bar}{'░' * (20 - bar)} {run['finished']}/{run['tasks']}",
                         ", ".join([f"{t['task']}@{t['robot']}" for t in run["running"]]
                                   + [f"{t} (waiting)" for t in run.get("waiting", [])]) or "-",
                         ", ".join(t["task"] for t in run["abandoned"] + run["lost"]) or "-")
        out.append(runs.render(color))
    else:
        out.append(style("no active runs", "dim", color))
    out.extend(style(f"! {problem}", "yellow", color) for problem in data["problems"])
    click.echo("\n".join(out))


PROBLEMS_EXIT = 3  # `status --check`: something needs a human (the problem lines say what)

EMBEDDED_NOTE = ("embedded mode (no REDIS_URL): this command sees only its own in-process Redis, which is "
                 "empty; set REDIS_URL to the Redis your workers use")


def _robots_table(data: dict[str, Any]) -> Any:
    # "bus pending", not "pending": beside the queue's counts a bare "pending" read as the task
    # state or as `robot-lab pending`'s input requests; it is the inbox's XPENDING (Words,
    # docs/architecture.md), as the JSON key `bus_pending` says
    table = Table("robots", [("robot", "left")] + [(col, "right") for col in (
        "queued", "started", "failed", "workers", "rq workers", "running", "abandoned", "bus lag", "bus pending",
        "DLQ")])
    for row in data["robots"]:
        workers = ("0", "red") if not row["workers"] and (row["queued"] or row["running"]) else str(row["workers"])
        abandoned = (str(row["abandoned"]), "bold red") if row["abandoned"] else "0"
        dlq = (str(row["dlq"]), "yellow") if row["dlq"] else "0"
        stale = len(row.get("stale_rq_workers") or [])
        rq_workers = f"{row['rq_workers']} (+{stale} stale)" if stale else str(row["rq_workers"])
        table.add_row(row["robot"], str(row["queued"]), str(row["started"]), str(row["failed"]), workers,
                      (rq_workers, "yellow") if stale else rq_workers, str(row["running"]), abandoned,
                      "-" if row["bus_lag"] is None else str(row["bus_lag"]), str(row["bus_pending"]), dlq)
    return table


@click.command("status")
@click.argument("robots", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON")
@click.option("--check", is_flag=True, help="Exit 3 when there is any problem line (for cron, CI and probes)")
@click.option("--builds", "builds", is_flag=True,
              help="Per build: live workers, open runs pinned to it, stalled / drained (docs/operations.md)")
def status(robots: tuple[str, ...], as_json: bool, check: bool, builds: bool) -> None:
    """Queues, workers, bus lag, dead letters and active runs of ROBOTS (default: every
    robot this key prefix knows), and a problem line for each thing that needs a human.
    Exit 1 when a named robot is unknown; with --check, 3 when there is any problem line.
    It never requeues anything; it only drops rq's registrations of workers that are
    certainly dead."""
    if builds:
        return builds_status(as_json, check)
    from robot_lab.workers.fleet_status import collect_status  # lazy: start-up time

    data = collect_status(robots=list(robots) or None)
    if as_json:
        click.echo(json.dumps(data, default=str))
    else:
        render_status(data)
    if data["unknown"]:  # the user named a robot that does not exist: a mistake, not a state
        sys.exit(1)
    if check and data["problems"]:
        sys.exit(PROBLEMS_EXIT)


def builds_status(as_json: bool, check: bool) -> None:
    """``robot-lab status --builds``: one row per build (network/builds.py); with --check,
    exit 3 while a build has runs stalled on it."""
    from robot_lab.connection import get_redis  # lazy: start-up time
    from robot_lab.network.builds import build_report  # lazy: start-up time

    report = build_report(get_redis(), default_keys())
    if as_json:
        click.echo(json.dumps({"builds": list(report.values())}))
    elif not report:
        click.echo("no builds: no live worker and no open pinned run under this prefix")
    else:
        table = Table("builds", [("build", "left"), ("workers", "right"), ("pinned runs", "right"), ("state", "left")])
        for row in report.values():
            state = ("stalled", "bold red") if row["stalled"] else "drained" if row["drained"] else "serving"
            table.add_row(row["build"], str(len(row["workers"])), str(len(row["runs"])), state)
        click.echo(table.render(use_color(sys.stdout)))
    if check and any(row["stalled"] for row in report.values()):
        sys.exit(PROBLEMS_EXIT)


@click.command("health")
@click.option("--worker", default=None, help="Only heartbeats whose worker name contains this")
@click.option("--max-age", type=float, default=None, help="Seconds a heartbeat may be old (default 6 beats, >= 30)")
@click.option("--ready", is_flag=True, help="Readiness: also require Redis to answer and the worker's beat in Redis")
def health(worker: str | None, max_age: float | None, ready: bool) -> None:
    """Probe for the workers of this machine/pod: exit 0 when every `robot-lab worker`
    process beats (its rq loop makes progress, its bus pollers live), 1 otherwise.

    Liveness reads only the local heartbeat files (a Redis outage must not restart every
    worker); --ready also checks Redis.
    """
    from robot_lab.workers.health import check_health, health_dir  # lazy: start-up time

    ok, lines = check_health(worker=worker, max_age=max_age)
    if ok and ready:
        from robot_lab.connection import get_redis  # lazy: start-up time

        try:
            client = get_redis()
            client.ping()
            keys = default_keys()
            for path in sorted(health_dir().glob("*.json")):
                data = json.loads(path.read_text())
                if worker and worker not in data.get("name", ""):
                    continue
                if data.get("host") == socket.gethostname() and not client.exists(keys.worker(data["name"])):
                    ok = False
                    why = "redis: out of memory" if data.get("redis") == "out of memory" else "no heartbeat in Redis"
                    lines.append(f"{data['name']}: {why}")
        except Exception as exc:
            ok = False
            lines.append(f"redis: {type(exc).__name__}: {exc}")
    for line in lines:
        click.echo(line)
    sys.exit(0 if ok else 1)
