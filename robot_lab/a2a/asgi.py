"""The ``robot-lab a2a`` web app: one A2A agent per robot and per network, on the SDK's
Starlette routes.

Paths: ``/robots/<name>/`` and ``/networks/<name>/`` take JSON-RPC (A2A 1.0 method names
and the 0.3 ones: ``message/send``, ``message/stream``, ``tasks/get``, ``tasks/cancel``,
``tasks/resubscribe``); each has its card at ``<path>.well-known/agent-card.json``. ``/``
lists the agents, ``/.well-known/agent-card.json`` is the card of the only agent when there
is one, ``/healthz`` answers while Redis does. The process beats into Redis
(``Keys.a2a_server``) so ``robot-lab status`` lists it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.types.a2a_pb2 import AgentCard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from robot_lab.a2a.auth import AuthMiddleware, Tokens
from robot_lab.a2a.gate import RequestGate
from robot_lab.a2a.cards import network_card, robot_card
from robot_lab.a2a.handler import AgentHandler, Backend
from robot_lab.a2a.task_store import TaskStore
from robot_lab.bus import Bus
from robot_lab.connection import get_redis
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.network.builds import process_build
from robot_lab.network.coordinator import Coordinator
from robot_lab.settings import A2ASettings, get_settings

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.a2a")

CARD_PATH = "/.well-known/agent-card.json"
CARD_CACHE = "public, max-age=300"  # cards change with a deploy; clients revalidate by ETag


def card_routes(card: AgentCard, since: float) -> list[Route]:
    """The SDK's card route (ETag, 304s) with ``Cache-Control`` and a ``Last-Modified`` of
    ``since``, so caches and the spec's card-caching checks see both."""
    last_modified = email.utils.formatdate(since, usegmt=True)
    out = []
    for route in create_agent_card_routes(card, card_url=CARD_PATH, cache_control=CARD_CACHE):
        async def endpoint(request: Request, inner: Any = route.endpoint) -> Response:
            response = await inner(request)
            response.headers["Last-Modified"] = last_modified
            return response

        out.append(Route(route.path, endpoint, methods=["GET"]))
    return out


@dataclass
class AgentEntry:
    kind: str  # "robot" | "network"
    name: str
    card: AgentCard
    handler: AgentHandler

    @property
    def path(self) -> str:
        return f"/{self.kind}s/{self.name}/"


def select(app: Any, robots: list[str] | None, networks: list[str] | None) -> tuple[list[str], list[str]]:
    """The robots and networks to serve: the named ones (each must exist), else all."""
    robot_names = list(robots) if robots else ([] if networks else app.robot_names)
    network_names = list(networks) if networks else ([] if robots else list(app.networks))
    for name in robot_names:
        app.robot_spec(name)  # ConfigurationError naming the known robots
    for name in network_names:
        app.get_network(name)
    if not robot_names and not network_names:
        raise ConfigurationError(f"app {app.name!r} has no robots or networks to serve")
    return robot_names, network_names


def _robot_for_card(app: Any, name: str) -> Any:
    try:
        return app.build_robot(name)
    except Exception:  # a robot that needs its worker's environment to build: its spec will do
        return app.robot_spec(name)


def build_a2a_app(app: Any, *, base_url: str, robots: list[str] | None = None, networks: list[str] | None = None,
                  connection: RedisClient | None = None, keys: Keys | None = None, settings: A2ASettings | None = None,
                  server_name: str | None = None) -> Starlette:
    """The ASGI app serving ``app``'s robots and networks (all of them unless named)."""
    settings = settings or get_settings().a2a
    tokens = Tokens(settings)
    if not tokens and not settings.anonymous:
        raise ConfigurationError(
            "no A2A tokens configured: set ROBOT_LAB_A2A__TOKENS='{\"caller\": \"secret\"}' or "
            "ROBOT_LAB_A2A__TOKENS_DIR, or --anonymous on a trusted network")
    keys = keys or default_keys()
    if connection is None:
        connection = get_redis()
    bus = Bus(connection, keys=keys)
    backend = Backend(bus=bus, coordinator=Coordinator(connection, keys), store=TaskStore(bus, keys,
                      ttl=settings.task_ttl), keys=keys, settings=settings)
    robot_names, network_names = select(app, robots, networks)
    started = time.time()  # the cards' Last-Modified: a card changes only with a new process
    base = base_url.rstrip("/")
    entries: list[AgentEntry] = []
    for name in robot_names:
        card = robot_card(_robot_for_card(app, name), f"{base}/robots/{name}/", settings)
        entries.append(AgentEntry("robot", name, card, AgentHandler(backend, kind="robot", name=name, card=card)))
    for name in network_names:
        network = app.get_network(name)
        card = network_card(network, f"{base}/networks/{name}/", settings)
        entries.append(AgentEntry("network", name, card, AgentHandler(backend, kind="network", name=name, card=card,
                                                                      network=network)))
    routes: list[Any] = []
    for entry in entries:
        inner = card_routes(entry.card, started)
        inner += create_jsonrpc_routes(entry.handler, "/", enable_v0_3_compat=True)
        routes.append(Mount(entry.path.rstrip("/"), routes=inner))
    if len(entries) == 1:
        routes += card_routes(entries[0].card, started)

    async def index(request: Request) -> JSONResponse:
        return JSONResponse({"agents": [{"name": e.name, "kind": e.kind, "url": f"{base}{e.path}",
                                         "card": f"{base}{e.path.rstrip('/')}{CARD_PATH}"} for e in entries]})

    async def healthz(request: Request) -> JSONResponse:
        try:
            await bus.aredis.ping()
        except Exception as exc:
            return JSONResponse({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, status_code=503)
        return JSONResponse({"ok": True})

    routes += [Route("/", index, methods=["GET"]), Route("/healthz", healthz, methods=["GET"])]
    name = server_name or f"a2a.{socket.gethostname()}.{os.getpid()}"
    beat = ServerBeat(bus, keys, name, base, [f"{e.kind}/{e.name}" for e in entries])

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        beat.start()
        try:
            yield
        finally:
            await beat.stop()

    web = Starlette(routes=routes, lifespan=lifespan)
    web.add_middleware(AuthMiddleware, tokens=tokens if tokens or not settings.anonymous else None, settings=settings)
    web.add_middleware(RequestGate, limit=settings.max_body_bytes)  # the outermost: before auth
    web.state.entries = entries
    log.info("a2a.app", agents=[f"{e.kind}/{e.name}" for e in entries], auth=bool(tokens))
    return web


class ServerBeat:
    """``robot-lab status`` sees a live A2A process by this beat (PX 3 beats, like workers)."""

    def __init__(self, bus: Bus, keys: Keys, name: str, url: str, agents: list[str]) -> None:
        self.bus, self.keys, self.name = bus, keys, name
        self.record = {"name": name, "role": "a2a", "host": socket.gethostname(), "pid": os.getpid(), "url": url,
                       "agents": agents, "started_at": time.time(), "build": process_build()}
        self.interval = float(get_settings().worker_heartbeat)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def beat(self) -> None:
        now = time.time()
        pipe = self.bus.aredis.pipeline(transaction=False)
        pipe.set(self.keys.a2a_server(self.name), json.dumps({**self.record, "beat_at": now}),
                 px=int(self.interval * 3000))
        pipe.zadd(self.keys.a2a_servers(), {self.name: now})
        await pipe.execute()

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception as exc:  # Redis away: the next beat tries again
                log.warning("a2a.heartbeat_failed", server=self.name, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            pipe = self.bus.aredis.pipeline(transaction=False)
            pipe.delete(self.keys.a2a_server(self.name))
            pipe.zrem(self.keys.a2a_servers(), self.name)
            await pipe.execute()
