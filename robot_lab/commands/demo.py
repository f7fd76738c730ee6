"""``robot-lab demo``: the support-desk network with a live view of its DAG.

Without REDIS_URL everything runs here: embedded fakeredis, in-process rq workers, the
scripted model. With REDIS_URL the run goes to real workers (``honcho start`` with the
Procfile) and this command only submits and watches. The live view is shared with
``robot-lab watch``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from robot_lab.commands.run_wait import TIMEOUT_EXIT, WorkerNotes, exit_for_result, outstanding, timeout_line
from robot_lab.errors import AwaitTimeout

STYLE = {
    "pending": ("·", "dim"),
    "queued": ("◔", "yellow"),
    "running": ("▶", "bold cyan"),
    "done": ("✔", "green"),
    "failed": ("✘", "bold red"),
    "skipped": ("–", "dim"),
    "cancelled": ("⊘", "magenta"),
    "completed_with_errors": ("✘", "bold red"),
    "retrying": ("↻", "yellow"),
    "waiting": ("?", "bold yellow"),
}


class RunView:
    """Folds run events into per-task rows (state, robot, worker, time, reply)."""

    def __init__(self, graph: Any, title: str) -> None:
        self.graph = graph
        self.title = title
        self.state = {name: "pending" for name in graph.order}
        self.worker: dict[str, str] = {}
        self.started: dict[str, float] = {}
        self.elapsed: dict[str, float] = {}
        self.text: dict[str, str] = {}
        self.run_state = "running"
        self.t0: float | None = None

    def apply(self, event: Any) -> None:
        if self.t0 is None:
            self.t0 = event.ts
        task = event.task
        kind = event.event
        if kind in ("run.completed", "run.cancelled", "run.failed"):
            self.run_state = str(event.data.get("status") or kind.split(".")[1])
        if task is None or task not in self.state:
            return
        if kind == "task.queued":
            self.state[task] = "queued"
        elif kind == "task.started":
            self.state[task] = "running"
            self.worker[task] = str(event.data.get("worker", ""))
            self.started[task] = event.ts
            self.text[task] = ""
        elif kind == "text.delta":
            self.text[task] = self.text.get(task, "") + str(event.data.get("delta", ""))
        elif kind in ("task.completed", "task.failed"):
            self.state[task] = "done" if kind == "task.completed" else "failed"
            self.text[task] = str(event.data.get("reply") or event.data.get("error") or "")
            if task in self.started:
                self.elapsed[task] = event.ts - self.started[task]
        elif kind == "task.skipped":
            self.state[task] = "skipped"
        elif kind == "task.retrying":
            self.state[task] = "retrying"
        elif kind == "hitl.requested":  # parked until a person answers (robot-lab answer)
            self.state[task] = "waiting"
            self.text[task] = f"asks: {event.data.get('question', '')} (request {event.data.get('id', '?')})"

    def render(self) -> Any:
        from rich.table import Table  # lazy: start-up time

        table = Table(title=f"{self.title} — {self.run_state}", expand=True, show_lines=False)
        table.add_column("stage", justify="right", width=5)
        table.add_column("task")
        table.add_column("robot")
        table.add_column("state")
        table.add_column("time", justify="right", width=6)
        table.add_column("reply / progress", ratio=1, overflow="ellipsis", no_wrap=True)
        stage_of = {name: i for i, stage in enumerate(self.graph.levels, 1) for name in stage}
        for name in self.graph.order:
            state = self.state[name]
            icon, style = STYLE.get(state, ("?", ""))
            took = f"{self.elapsed[name]:.2f}s" if name in self.elapsed else ""
            text = " ".join(self.text.get(name, "").split())
            table.add_row(str(stage_of.get(name, "")), name, self.graph.tasks[name].robot,
                          f"[{style}]{icon} {state}[/]", took, text)
        return table


def network_models(network: Any) -> list[str] | None:
    """The models the network's robots call (None: not known here)."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    try:
        specs = [network.robot_spec(task.robot) for task in network.spec.tasks]
    except Exception:  # noqa: BLE001 - a robot known only to the registry: assume any model
        return None
    if any(spec is None for spec in specs):
        return None
    return [spec.model or get_settings().default_model() for spec in specs]


def print_event(event: Any) -> None:
    if event.event == "text.delta":
        return
    where = f" {event.task}" if event.task else ""
    extra = ""
    if event.data.get("reply"):
        extra = " " + " ".join(str(event.data["reply"]).split())[:100]
    elif event.data.get("error"):
        extra = " " + str(event.data["error"])
    elif event.event == "hitl.requested":
        extra = f" asks {event.data.get('question', '')!r} (robot-lab answer {event.data.get('id', '?')} ...)"
    click.echo(f"[{event.seq:>3}] {event.event}{where}{extra}")


def follow_live(handle: Any, *, title: str, timeout: float | None = None) -> RunView:
    """Render the run live until it ends; returns the final view."""
    from rich.console import Console  # lazy: start-up time
    from rich.live import Live  # lazy: start-up time

    from robot_lab.network.graphs import graph_for  # lazy: start-up time

    view = RunView(graph_for(handle.store), title)
    console = Console()
    with Live(view.render(), console=console, refresh_per_second=12, transient=False) as live:
        for event in handle.follow(timeout=timeout, block_ms=100):
            view.apply(event)
            live.update(view.render())
    return view


@click.command("demo")
@click.option("--message", "-m", default=None, help="The customer message (default: a billing complaint)")
@click.option("--delay-ms", type=int, default=None,
              help="Scripted model delay per call, in either mode (default 400)")
@click.option("--plain", is_flag=True, help="Print events as lines instead of the live view")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait (exit 124 past it)")
def demo(message: str | None, delay_ms: int | None, plain: bool, timeout: float) -> None:
    """Run the support-desk network (classifier -> billing/technical/general -> parallel
    analysis -> summary) and show its DAG live.

    Without REDIS_URL everything runs in this process; with it, the run goes to the
    workers of the Procfile (`honcho start`), and a note names any queue no live worker
    serves.
    """
    from rich.console import Console  # lazy: start-up time
    from rich.panel import Panel  # lazy: start-up time

    from robot_lab import demo as demo_app  # lazy: start-up time
    from robot_lab.memory.store import Memory  # lazy: start-up time
    from robot_lab.network.coordinator import Coordinator, is_embedded  # lazy: start-up time
    from robot_lab.workers.process import warm_up  # lazy: start-up time

    if delay_ms is not None and delay_ms < 0:
        raise click.BadParameter("must be >= 0", param_hint="--delay-ms")
    network = demo_app.support if delay_ms is None else demo_app.build_app(delay_ms).networks["support"]
    message = message or demo_app.SAMPLE_MESSAGES[0]
    console = Console()
    coordinator = Coordinator()
    embedded = is_embedded(coordinator.connection)
    pool = None
    if embedded:
        from robot_lab.network.embedded import EmbeddedWorkers  # lazy: start-up time

        pool = EmbeddedWorkers(coordinator.connection, sorted({t.robot for t in network.spec.tasks}),
                               threads=4).start()
        console.print("[dim]embedded mode: in-process Redis (fakeredis), 4 in-process workers, scripted model[/]")
    console.print(Panel(message, title="customer message"))
    console.print(network.visualize(), style="dim", markup=False, highlight=False)
    with console.status("warming up the robots' models..."):
        warm_up(network_models(network))  # litellm only for a provider model, as a worker does
    started = time.monotonic()
    handle = coordinator.submit(network, message)
    notes = None if embedded else WorkerNotes(
        handle, lambda line: console.print(f"[yellow]note: {line}[/]", highlight=False, soft_wrap=True))
    try:
        if notes is not None:
            notes.start()
        if plain:
            for event in handle.follow(timeout=timeout):
                print_event(event)
        else:
            follow_live(handle, title=f"network support (run {handle.run_id})", timeout=timeout)
    except AwaitTimeout:
        phrases = [] if embedded else outstanding(handle)
        if notes is not None:
            notes.stop()
        click.echo(f"Error: {timeout_line(handle.run_id, timeout, phrases, embedded=embedded)}", err=True)
        sys.exit(TIMEOUT_EXIT)
    finally:
        if notes is not None:
            notes.stop()
        if pool is not None:
            pool.stop(wait=False)
    result = handle.result()
    memory = Memory.for_run(result.run_id, redis=coordinator.connection, keys=coordinator.keys)
    found = {k: memory.get(k) for k in ("sentiment", "urgency")}
    routed = ", ".join(sorted(result.activated)) or "none"
    console.print()
    console.print(f"routed to: [bold]{routed}[/]   shared memory: {found}   "
                  f"wall time: {time.monotonic() - started:.2f}s")
    console.print(Panel(result.reply or "(no reply)", title=f"final answer ({result.final_task})",
                        border_style="green" if result.ok else "red"))
    exit_for_result(result)
