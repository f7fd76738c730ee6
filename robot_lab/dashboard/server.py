"""The dashboard's HTTP side: Starlette routes, server-sent events, the action guard.

Read-only by default: the actions (cancel a run, re-run a failed task, replay dead letters) exist only when
the server was started with a token (``robot-lab dashboard --allow-actions``), and each POST
must carry it as ``Authorization: Bearer <token>``. The page never embeds the token; the
operator pastes it once (kept in the tab's sessionStorage).

Live runs: ``GET /api/runs/<id>/stream`` is an SSE stream. Each event's ``id`` is the pair of
stream cursors (run events, memory changes), so a browser that reconnects with
``Last-Event-ID`` resumes where it was; the stream ends after the run's ``stream.ended``.

Redis away (a restart, a failover): every API call answers 503 with ``{"error", "redis":
"down"}`` (the page shows a banner and keeps polling), a live stream sends ``redis`` events
(down, then up) and reads on from its cursors, and the log gets one ``redis.lost`` /
``redis.back`` pair per outage instead of a traceback per request.
"""

from __future__ import annotations

import errno
import hmac
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from robot_lab.connection import connect, get_redis
from robot_lab.dashboard.data import FINISHED_RUN, DashboardData
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.outage import OutageTracker, describe, is_outage

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.dashboard")

STATIC = Path(__file__).resolve().parent / "static"
FEED_BLOCK_MS = 1000  # one XREAD wait; also how often a quiet stream checks for a closed tab


class RedisAway(Exception):
    """Redis did not answer a request (an outage): the client gets a 503, not a traceback."""


def create_app(connection: RedisClient, keys: Keys, *, token: str | None = None) -> Starlette:
    """The ASGI app. ``token`` None: read-only (every POST answers 403)."""
    data = DashboardData(connection, keys)
    outage = OutageTracker("dashboard")

    async def threaded(fn: Any, *args: Any) -> Any:
        return await _redis_call(outage, fn, *args)

    async def redis_away(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": f"Redis is not answering: {exc} (retrying)", "redis": "down"},
                            status_code=503)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def config(request: Request) -> Response:
        return JSONResponse({"actions": token is not None, "prefix": keys.prefix})

    async def overview(request: Request) -> Response:
        return JSONResponse(await threaded(data.overview))

    async def dead_letters(request: Request) -> Response:
        return JSONResponse(await threaded(data.dead_letters, request.path_params["robot"]))

    async def run(request: Request) -> Response:
        try:
            return JSONResponse(await threaded(data.run, request.path_params["run_id"]))
        except ConfigurationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)

    async def stream(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            snapshot = await threaded(data.run, run_id)
        except ConfigurationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        events_at, memory_at = _cursors(request.headers.get("last-event-id"))
        return StreamingResponse(_feed(data, snapshot, events_at, memory_at, outage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def guarded(action: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            if token is None:
                return JSONResponse({"error": "read-only dashboard (start it with --allow-actions)"},
                                    status_code=403)
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            try:
                body = await request.json() if await request.body() else {}
                result = await threaded(action, request.path_params, body)
            except RedisAway:
                raise
            except (ConfigurationError, ValueError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            log.info("dashboard.action", action=action.__name__, **request.path_params)
            return JSONResponse(result)

        return endpoint

    def cancel(params: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        return {"status": data.cancel(params["run_id"])}

    def rerun(params: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        return {"status": data.rerun(params["run_id"], params["task"])}

    async def pending(request: Request) -> Response:
        return JSONResponse(await threaded(data.pending))

    def answer(params: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        text, approve = body.get("text"), body.get("approve")
        if text is not None and not isinstance(text, str) or approve not in (None, True, False):
            raise ValueError("the body is {\"text\": \"...\"} or {\"approve\": true|false, \"text\": \"why\"}")
        if text is None and approve is None:
            raise ValueError("give text or approve")
        return data.answer(params["request_id"], text, approve, str(body.get("by") or "dashboard"))

    def replay(params: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        ids = body.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise ValueError("ids must be a list of dead-letter ids")
        return {"replayed": data.replay(params["robot"], ids)}

    routes = [
        Route("/", index),
        Route("/api/config", config),
        Route("/api/overview", overview),
        Route("/api/dlq/{robot}", dead_letters),
        Route("/api/dlq/{robot}/replay", guarded(replay), methods=["POST"]),
        Route("/api/runs/{run_id}", run),
        Route("/api/runs/{run_id}/stream", stream),
        Route("/api/runs/{run_id}/cancel", guarded(cancel), methods=["POST"]),
        Route("/api/runs/{run_id}/tasks/{task}/rerun", guarded(rerun), methods=["POST"]),
        Route("/api/pending", pending),
        Route("/api/answer/{request_id}", guarded(answer), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={RedisAway: redis_away})


async def _redis_call(outage: OutageTracker, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a worker thread; an outage becomes :class:`RedisAway`, logged once
    per outage (``redis.lost`` then ``redis.back``)."""
    try:
        result = await anyio.to_thread.run_sync(fn, *args)
    except Exception as exc:
        if not is_outage(exc):
            raise
        outage.lost(exc)
        raise RedisAway(describe(exc)) from None
    outage.back()
    return result


def _cursors(last_event_id: str | None) -> tuple[str, str]:
    if last_event_id and "|" in last_event_id:
        events_at, memory_at = last_event_id.split("|", 1)
        return events_at or "0-0", memory_at or "0-0"
    return "0-0", "0-0"


def _sse(event: str, payload: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(payload, default=str)}\n\n"


async def _feed(data: DashboardData, snapshot: dict[str, Any], events_at: str, memory_at: str,
                outage: OutageTracker | None = None) -> AsyncIterator[str]:
    """snapshot, then every run event and memory change as it lands, then ``end``. Through
    a Redis outage it sends ``redis`` events (down, then up) and reads on from its cursors."""
    outage = outage or OutageTracker("dashboard")
    run_id = snapshot["run_id"]
    yield _sse("snapshot", snapshot)
    finished = snapshot["status"] in FINISHED_RUN
    away = False
    while True:
        try:
            events, changes, events_at, memory_at = await _redis_call(
                outage, data.feed, run_id, events_at, memory_at, 0 if finished else FEED_BLOCK_MS)
        except RedisAway as exc:
            away = True
            yield _sse("redis", {"down": True, "error": str(exc)})
            await anyio.sleep(outage.backoff.next_delay())
            continue
        if away:
            away = False
            yield _sse("redis", {"down": False})
        cursor = f"{events_at}|{memory_at}"
        for change in changes:
            yield _sse("memory", change, cursor)
        ended = False
        for event in events:
            yield _sse("run", event, cursor)
            ended = ended or event.get("event") == "stream.ended"
        if ended or (finished and not events and not changes):
            try:
                final = await anyio.to_thread.run_sync(data.run, run_id)
            except ConfigurationError:
                final = snapshot
            except Exception as exc:  # Redis went away right at the end: the next round retries
                if not is_outage(exc):
                    raise
                continue
            if final["status"] not in FINISHED_RUN:  # a re-run task made it run again: read on
                finished = False
                continue
            yield _sse("snapshot", final, cursor)
            yield _sse("end", {"status": final["status"]}, cursor)
            return
        if not events and not changes:
            yield ": keep-alive\n\n"  # lets the server notice a closed tab
            if not finished:
                try:
                    finished = (await _redis_call(outage, data.run, run_id))["status"] in FINISHED_RUN
                except ConfigurationError:  # the run expired while we watched
                    finished = True
                except RedisAway:
                    continue


def serve(*, host: str, port: int, url: str | None = None, token: str | None = None) -> None:
    """Run the app under uvicorn until SIGINT / SIGTERM."""
    import uvicorn  # lazy: start-up time

    connection = connect(url) if url else get_redis()
    app = create_app(connection, default_keys(), token=token)
    _check_port(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"dashboard on http://{shown}:{port}/ ({'actions enabled' if token else 'read-only'}; Ctrl-C stops it)",
          file=sys.stderr, flush=True)
    log.info("dashboard.serving", host=host, port=port, actions=token is not None)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def _check_port(host: str, port: int) -> None:
    """A busy port or an address this host lacks is the user's to fix: one clear line
    (uvicorn would log its own error and exit)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            hint = " (another process listens there: pick another --port)" if exc.errno == errno.EADDRINUSE else ""
            raise ConfigurationError(f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}{hint}"
                                     ) from None
