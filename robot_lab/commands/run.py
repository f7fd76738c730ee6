"""``robot-lab run APP:NETWORK "message"``, ``robot-lab watch RUN_ID`` and
``robot-lab cancel RUN_ID``."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from robot_lab.commands.demo import follow_live, print_event
from robot_lab.commands.run_wait import TIMEOUT_EXIT, WorkerNotes, exit_for_result, outstanding, timeout_line
from robot_lab.errors import AwaitTimeout, ConfigurationError


def resolve_target(target: str) -> Any:
    """``pkg.mod:network``, ``pkg.mod:app`` (its only network), ``pkg.mod:<network name>``
    (of the module's ``app``) or ``file.yml[:network]``."""
    from robot_lab.app import App, load_app  # lazy: start-up time
    from robot_lab.network.dsl import Network  # lazy: start-up time

    if ".yml" in target or ".yaml" in target:
        path, _, name = target.partition(".yml") if ".yml" in target else target.partition(".yaml")
        suffix = ".yml" if ".yml" in target else ".yaml"
        return load_app(path + suffix).get_network(name.lstrip(":") or None)
    module_name, sep, attr = target.rpartition(":")
    if not sep:
        raise ConfigurationError(f"target {target!r} must look like 'package.module:network'")
    from robot_lab.runtime.registry import import_user_module  # lazy: start-up time

    module = import_user_module(module_name, repr(module_name))
    obj = getattr(module, attr, None)
    if isinstance(obj, Network):
        return obj
    if isinstance(obj, App):
        return obj.get_network()
    app = getattr(module, "app", None)
    if isinstance(app, App):
        return app.get_network(attr)
    raise ConfigurationError(f"{target!r}: {module_name} has no network or app named {attr!r}")


def _context(pairs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint="--context")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "run_id": result.run_id, "status": result.status, "final_task": result.final_task,
            "reply": result.reply, "states": result.states,
            "results": {k: v.export() for k, v in result.context.items()},
        }, default=str))
        return
    click.echo(f"run {result.run_id}: {result.status}")
    for task, state in result.states.items():
        click.echo(f"  {task:<20} {state}")
    click.echo("")
    click.echo(result.reply or "(no reply)")


@click.command("run")
@click.argument("target")
@click.argument("message", required=False)
@click.option("--context", "-c", "context", multiple=True, help="key=value run context (repeatable)")
@click.option("--no-wait", is_flag=True, help="Submit and print the run id (needs REDIS_URL)")
@click.option("--timeout", type=float, default=None, help="Seconds to wait for the result (exit 124 past it)")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON")
def run(target: str, message: str | None, context: tuple[str, ...], no_wait: bool, timeout: float | None,
        as_json: bool) -> None:
    """Run network TARGET (package.module:network) on MESSAGE.

    With REDIS_URL the tasks go to `robot-lab worker` / `rq worker` processes (while a task
    waits on a queue that no live worker serves, a note says so every few seconds); without,
    they run in this process.

    Exit status: 0 completed; 3 completed_with_errors (a task failed, the run went on);
    1 cancelled or an error; 124 --timeout passed; 130 interrupted.
    """
    from robot_lab.network.coordinator import Coordinator, is_embedded  # lazy: start-up time

    if message is None and no_wait:
        raise click.UsageError("--no-wait needs a MESSAGE: the run would start on an empty message "
                               "(pass '' to mean that)")
    network = resolve_target(target)
    ctx = _context(context)
    coordinator = Coordinator()
    if is_embedded(coordinator.connection):
        if no_wait:
            raise click.UsageError("--no-wait needs REDIS_URL: an embedded run lives only as long as this "
                                   "command (its in-process workers stop with it)")
        try:
            result = network.run(message, timeout=timeout, **ctx)
        except AwaitTimeout as exc:
            run_id = str(exc).split()[1] if str(exc).startswith("run ") else "?"
            click.echo(f"Error: {timeout_line(run_id, timeout, [], embedded=True)}", err=True)
            sys.exit(TIMEOUT_EXIT)
    else:
        from robot_lab.observability import otel  # lazy: start-up time

        # the trace's root, as in Network.run: network.run > network.submit > task ...
        with otel.span("network.run", {"network": network.spec.name}):
            handle = coordinator.submit(network, message, context=ctx)
            if no_wait:
                click.echo(handle.run_id)
                return
            click.echo(f"run {handle.run_id} submitted", err=True)
            with WorkerNotes(handle, lambda line: click.echo(f"note: {line}", err=True)):
                try:
                    result = handle.wait(timeout=timeout)  # rides out a Redis outage, result included
                except AwaitTimeout:
                    click.echo(f"Error: {timeout_line(handle.run_id, timeout, outstanding(handle))}", err=True)
                    sys.exit(TIMEOUT_EXIT)
                except KeyboardInterrupt:
                    click.echo(f"\nstopped waiting; run {handle.run_id} goes on: `robot-lab watch {handle.run_id}` "
                               f"or `robot-lab cancel {handle.run_id}`", err=True)
                    sys.exit(130)
    _print_result(result, as_json)
    exit_for_result(result)


@click.command("watch")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@click.option("--all", "all_runs", is_flag=True, help="Coordinator mode: sweep and report every run, forever")
@click.option("--plain", is_flag=True, help="Print events as lines instead of the live view")
@click.option("--timeout", type=float, default=None,
              help="Seconds to follow the run before giving up (exit 124; the run goes on)")
def watch(run_id: str | None, all_runs: bool, plain: bool, timeout: float | None) -> None:
    """Follow RUN_ID until it ends (sweeping lost tasks back to the queues meanwhile).

    Exit status as for `robot-lab run`: 0 completed, 3 completed_with_errors, 1 cancelled."""
    from robot_lab.network.coordinator import Coordinator, is_embedded  # lazy: start-up time

    coordinator = Coordinator()
    if is_embedded(coordinator.connection):
        raise click.ClickException("watch needs REDIS_URL: an embedded run lives only in its own process")
    if all_runs:
        _watch_all(coordinator)
        return
    if not run_id:
        raise click.UsageError("give a RUN_ID or --all")
    try:
        handle = coordinator.attach(run_id)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc

    try:
        if plain:
            for event in handle.follow(timeout=timeout):
                print_event(event)
        else:
            follow_live(handle, title=f"run {handle.run_id}", timeout=timeout)
    except AwaitTimeout:
        click.echo(f"Error: {timeout_line(handle.run_id, timeout, outstanding(handle))}", err=True)
        sys.exit(TIMEOUT_EXIT)
    result = handle.result()
    _print_result(result, False)
    if result.status != "running":
        exit_for_result(result)


def _watch_all(coordinator: Any) -> None:
    """Long-running coordinator process (Procfile): sweep all runs, print finished ones.
    A Redis outage is ridden out (backoff with jitter, one lost/back log line pair)."""
    from robot_lab.logging import get_logger  # lazy: start-up time
    from robot_lab.outage import OutageTracker, is_outage  # lazy: start-up time

    root = click.get_current_context().find_root()
    if not root.params.get("verbose") and not root.params.get("debug"):
        from robot_lab.logging import configure_logging  # lazy: start-up time

        configure_logging(force=True)  # a service: its log lines (settings' level, JSON) are its output
    log = get_logger("robot_lab.coordinator")
    seen: set[str] = set()
    outage = OutageTracker("watch")
    log.info("coordinator.started", prefix=coordinator.keys.prefix)
    try:
        while True:
            try:
                coordinator.sweep()
                runs = coordinator.runs(limit=50)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                outage.lost(exc)
                outage.pause()
                continue
            outage.back()
            for run in runs:
                if run["status"] != "running" and run["run_id"] not in seen:
                    seen.add(run["run_id"])
                    log.info("run.finished", **run)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


@click.command("cancel")
@click.argument("run_id")
def cancel(run_id: str) -> None:
    """Cancel RUN_ID: queued tasks are dropped, running ones finish but nothing new starts."""
    from robot_lab.network.coordinator import Coordinator, is_embedded  # lazy: start-up time

    coordinator = Coordinator()
    try:
        status = coordinator.cancel(run_id)
    except ConfigurationError as exc:
        hint = (" (no REDIS_URL: an embedded run lives only in the process that started it; set REDIS_URL)"
                if is_embedded(coordinator.connection) else "")
        raise click.ClickException(f"{exc}{hint}") from exc
    click.echo(f"run {run_id}: {status}")
