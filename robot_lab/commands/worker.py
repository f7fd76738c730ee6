"""``robot-lab worker billing [more robots] [--in-flight N] [--concurrency N]``."""

from __future__ import annotations

import gc
import os

import click

from robot_lab.errors import ConfigurationError


@click.command("worker")
@click.argument("robots", nargs=-1)
@click.option("--in-flight", "in_flight", type=int, default=None,
              help="Tasks, and messages per robot, each process runs at once (default: setting "
                   "worker.in_flight, 16; 1 = one at a time)")
@click.option("--concurrency", "-c", type=int, default=1, show_default=True,
              help="rq worker processes (each runs --in-flight tasks at once)")
@click.option("--app", "app_path", default=None, help="App import path (default: ROBOT_LAB_APP)")
@click.option("--url", default=None,
              help="Redis URL (default: REDIS_URL); without REDIS_URL also the Redis of what the robots "
                   "keep (memory, conversations, learnings)")
@click.option("--burst", is_flag=True, help="Quit when the queues are empty")
@click.option("--no-bus", is_flag=True, help="Do not poll the robots' bus inboxes")
@click.option("--spawned", is_flag=True, help="Also serve robots spawned at run time (Robot.spawn)")
@click.option("--build", "build", is_flag=False, flag_value="", default=None, metavar="[BUILD]",
              help="Serve (and advertise) build BUILD instead of the one computed from the app; alone: print "
                   "this worker's build and exit (docs/operations.md, \"Rolling out a new build\")")
@click.option("--metrics-port", type=int, default=None,
              help="Serve this process's Prometheus counters on this port (robot-lab[metrics]); queue and "
                   "fleet gauges come from one `robot-lab metrics`")
@click.option("--metrics-addr", default=None,
              help="Address --metrics-port listens on  [default: 127.0.0.1; 0.0.0.0 to be scraped from "
                   "other hosts, e.g. in a pod]")
@click.option("--metrics-gauges", is_flag=True,
              help="Also serve the Redis gauges of this worker's robots (queue depth, lag, DLQ) on --metrics-port")
def worker(robots: tuple[str, ...], in_flight: int | None, concurrency: int, app_path: str | None,
           url: str | None, burst: bool, no_bus: bool, spawned: bool, metrics_port: int | None,
           metrics_addr: str | None, metrics_gauges: bool, build: str | None) -> None:
    """Run ROBOTS' tasks (rq queues robot:<name>) and serve their bus inboxes.

    Each process runs up to --in-flight tasks, and as many messages per robot, at once
    (messages of one conversation stay in order). SIGTERM takes nothing new, lets every task
    and message in hand finish, then exits.
    """
    from robot_lab.workers.process import run_worker  # lazy: start-up time

    try:
        if _use_build(app_path, build):
            return
        if metrics_port is not None:
            from robot_lab.observability.metrics import DEFAULT_ADDR  # lazy: start-up time
            from robot_lab.workers.fleet_gauges import start_worker_metrics  # lazy: start-up time

            start_worker_metrics(metrics_port, list(robots), concurrency=concurrency, url=url,
                                 addr=metrics_addr or DEFAULT_ADDR, gauges=metrics_gauges)
        elif metrics_gauges or metrics_addr is not None:
            raise ConfigurationError("--metrics-addr and --metrics-gauges need --metrics-port")
        run_worker(list(robots), concurrency=concurrency, app_path=app_path, url=url, burst=burst, bus=not no_bus,
                   spawned=spawned, in_flight=in_flight)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    # The interpreter's final garbage collection walks litellm's whole heap: seconds on a busy
    # machine, past honcho's / Kubernetes' kill timeout. The work is done; skip that walk.

    gc.freeze()


def _use_build(app_path: str | None, build: str | None) -> bool:
    """Set this worker's build (``--app``'s app, ``--build BUILD``); ``--build`` alone prints
    it instead (True: nothing to serve)."""
    from robot_lab.network.builds import process_build, serve_app  # lazy: start-up time
    from robot_lab.settings import reload_settings  # lazy: start-up time

    if build:
        if any(c.isspace() for c in build):
            raise ConfigurationError(f"--build {build!r}: a build id has no whitespace")
        os.environ["ROBOT_LAB_BUILD"] = build  # the rq children (forked) and every reader of settings
        reload_settings()
    serve_app(app_path)
    if build == "":
        click.echo(process_build())
        return True
    return False
