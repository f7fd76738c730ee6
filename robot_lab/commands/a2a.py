"""``robot-lab a2a``: the A2A tier (docs/a2a.md)."""

from __future__ import annotations

import click

from robot_lab.errors import ConfigurationError


@click.command("a2a")
@click.option("--app", "app_path", default=None, metavar="PKG.MOD:APP",
              help="The app whose robots and networks to serve (default: ROBOT_LAB_APP)")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0 in a pod)")
@click.option("--port", default=9292, show_default=True, type=int)
@click.option("--robots", "robots", multiple=True, metavar="NAME",
              help="Serve only these robots (repeat or comma-separate); default: all, unless --networks is given")
@click.option("--networks", "networks", multiple=True, metavar="NAME",
              help="Serve only these networks; default: all, unless --robots is given")
@click.option("--public-url", default=None, metavar="URL",
              help="The URL clients reach this server at, written into the agent cards (default http://HOST:PORT)")
@click.option("--anonymous", is_flag=True, help="Serve without tokens (a trusted network only)")
@click.option("--name", "server_name", default=None, help="Process name in `robot-lab status` (default a2a.<host>.<pid>)")
def a2a(app_path: str | None, host: str, port: int, robots: tuple[str, ...], networks: tuple[str, ...],
        public_url: str | None, anonymous: bool, server_name: str | None) -> None:
    """Serve an app's robots and networks as A2A agents: a robot's tasks are bus messages to
    its `robot-lab worker`s, a network's are runs; task state lives in Redis, so several of
    these processes behind a load balancer serve the same tasks. Cards at
    /robots/<name>/.well-known/agent-card.json and /networks/<name>/...; callers present a
    token from ROBOT_LAB_A2A__TOKENS / ROBOT_LAB_A2A__TOKENS_DIR as a bearer token."""
    try:
        import uvicorn  # lazy: start-up time

        from robot_lab.a2a.asgi import build_a2a_app  # optional extra [a2a]
    except ImportError as exc:
        raise click.ClickException(f"the A2A server needs the a2a extra: pip install 'robot-lab[a2a]' ({exc})") from None
    from robot_lab.app import configured_app, load_app  # lazy: start-up time
    from robot_lab.settings import get_settings  # lazy: start-up time

    settings = get_settings()
    if not settings.redis_url:
        raise click.ClickException("robot-lab a2a needs REDIS_URL: its tasks run on workers and live in Redis")
    a2a_settings = settings.a2a.model_copy(update={"anonymous": True}) if anonymous else settings.a2a
    split = lambda names: [n.strip() for v in names for n in v.split(",") if n.strip()] or None  # noqa: E731
    try:
        app = load_app(app_path) if app_path else configured_app()
        if app is None:
            raise ConfigurationError("no app: give --app pkg.module:app or set ROBOT_LAB_APP")
        web = build_a2a_app(app, base_url=public_url or f"http://{host}:{port}", robots=split(robots),
                            networks=split(networks), settings=a2a_settings, server_name=server_name)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    for entry in web.state.entries:
        click.echo(f"{entry.kind} {entry.name}: {(public_url or f'http://{host}:{port}').rstrip('/')}{entry.path}", err=True)
    # a SIGTERM cuts requests still in flight after the grace: uvicorn's default waits for them
    # for ever (a blocking message/send, a stream of a task that runs for hours)
    uvicorn.run(web, host=host, port=port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=a2a_settings.shutdown_grace)
