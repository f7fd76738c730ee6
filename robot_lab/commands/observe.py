"""``robot-lab metrics`` (standalone Prometheus exporter) and ``robot-lab dashboard`` (web view)."""

from __future__ import annotations

import os
import signal
import threading

import click

from robot_lab.errors import ConfigurationError
from robot_lab.keys import default_keys
from robot_lab.observability import metrics


@click.command("metrics")
@click.option("--port", type=int, default=9808, show_default=True, help="Port of the /metrics endpoint")
@click.option("--addr", "--metrics-addr", "addr", default=metrics.DEFAULT_ADDR, show_default=True,
              help="Address to listen on (0.0.0.0 to be scraped from other hosts, e.g. in a pod)")
@click.option("--robot", "robots", multiple=True, help="Only these robots (default: every registered robot)")
@click.option("--url", default=None, help="Redis URL (default: REDIS_URL)")
def metrics_cmd(port: int, addr: str, robots: tuple[str, ...], url: str | None) -> None:
    """Serve queue depth, stream lag, DLQ size, live workers, active runs and budget
    remaining, read from Redis at each scrape. Run one per deployment; each worker's own
    counters come from `robot-lab worker --metrics-port`."""
    from robot_lab.connection import connect, get_redis  # lazy: start-up time
    from robot_lab.logging import get_logger  # lazy: start-up time
    from robot_lab.workers.fleet_gauges import RedisCollector  # lazy: start-up time

    _warn_if_embedded(url)
    try:
        metrics.require()
        connection = connect(url) if url else get_redis()
        server = _serve_only(port, addr, RedisCollector(connection, default_keys(), list(robots) or None))
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    get_logger("robot_lab.metrics").info("metrics.serving", port=port, addr=addr)
    click.echo(f"serving metrics on http://{addr}:{port}/metrics", err=True)
    _wait_for_signal()
    server[0].shutdown()


def _warn_if_embedded(url: str | None) -> None:
    """Without a Redis URL these commands would read this process's own empty fakeredis."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    if not (url or get_settings().redis_url):
        click.echo("warning: no REDIS_URL (or --url): showing this process's embedded Redis, which is empty",
                   err=True)


def _serve_only(port: int, addr: str, collector: object) -> tuple:
    from prometheus_client import CollectorRegistry, start_http_server  # lazy: start-up time

    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    try:
        return start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from None


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on")
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--url", default=None, help="Redis URL (default: REDIS_URL)")
@click.option("--allow-actions", is_flag=True,
              help="Enable cancel and DLQ replay (POSTs must carry the token; read-only without this flag)")
@click.option("--token", default=None, envvar="ROBOT_LAB_DASHBOARD_TOKEN",
              help="Token for actions (env ROBOT_LAB_DASHBOARD_TOKEN; generated and printed when omitted)")
def dashboard(host: str, port: int, url: str | None, allow_actions: bool, token: str | None) -> None:
    """Robots, workers, queues, the DLQ and live network runs (DAG, streamed text, memory
    changes, tokens, cost) in a browser, updated over server-sent events."""
    try:
        from robot_lab.dashboard.server import serve  # lazy: start-up time
    except ImportError as exc:
        raise click.ClickException(f"the dashboard needs starlette and uvicorn: pip install 'robot-lab[dashboard]' "
                                   f"({exc})") from None
    _warn_if_embedded(url)
    if allow_actions and not token:
        token = os.urandom(16).hex()
        click.echo(f"action token: {token}", err=True)
    try:
        serve(host=host, port=port, url=url, token=token if allow_actions else None)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
