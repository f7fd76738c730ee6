"""A synchronous MCP client on top of the async ``mcp`` 2.x SDK.

The Robot's tool loop is synchronous, while the SDK is async (anyio) and its sessions are
bound to the task that opened them. So each :class:`MCPClient` owns one background thread
running an asyncio event loop, and one long-lived *session task* in it that enters
``mcp.Client`` (the transport plus the protocol handshake), waits until asked to close, and
exits the context in the same task, as anyio requires. Requests from any thread are
submitted to that loop with ``run_coroutine_threadsafe`` and waited on with a timeout.

Failure behaviour (the Ruby gem's): :meth:`MCPClient.connect` never raises - it logs, stays
disconnected and keeps the reason in ``last_error``. Every request raises
``MCPError("Not connected to MCP server: <name>")`` while disconnected. ``call_tool``
returns text for tool errors and transport failures alike, so the model reads them.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from robot_lab import __version__
from robot_lab.errors import MCPError
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe
from robot_lab.runtime.mcp.config import MCPServerConfig

_log = get_logger("robot_lab.mcp")
_T = TypeVar("_T")
_PAGE_CAP = 100
_CLOSE_GRACE = 5.0
_WATCH_INTERVAL = 0.2
_live_clients: weakref.WeakSet[MCPClient] = weakref.WeakSet()


def describe_error(error: BaseException) -> str:
    """``"Type: message"`` of the innermost cause, unwrapping anyio's exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    message = str(error).strip()
    if not message and error.__cause__ is not None:
        return describe_error(error.__cause__)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def render_content(items: Any) -> str:
    """MCP content items as one text: texts as is, other kinds as a short placeholder."""
    parts: list[str] = []
    for item in items or ():
        kind = getattr(item, "type", None)
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(item, 'mime_type', None) or 'unknown type'}]")
        elif kind == "resource":
            resource = item.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource: {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {item.uri}]")
        else:
            parts.append(str(item))
    return "\n".join(parts)


def _is_connection_closed(error: BaseException) -> bool:
    from mcp_types import CONNECTION_CLOSED  # lazy: start-up time

    return getattr(error, "code", None) == CONNECTION_CLOSED


def _transport_closed(client: Any) -> bool:
    """Whether the SDK's dispatcher has seen the transport end (EOF on a stdio server's
    stdout, a dropped HTTP stream). Reads SDK internals defensively: if they move, this
    says False and a lost connection is still noticed by the next request that fails."""
    dispatcher = getattr(getattr(client, "_session", None), "_dispatcher", None)
    return bool(getattr(dispatcher, "_closed", False))


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def _paged(method: str, field: str) -> Callable[[Any], Any]:
    """A session call that follows ``next_cursor`` through every page of a list request
    (at most ``_PAGE_CAP`` pages, so a misbehaving server cannot loop us forever)."""

    async def fetch(session: Any) -> list[Any]:
        items: list[Any] = []
        cursor = None
        for _ in range(_PAGE_CAP):
            page = await getattr(session, method)(cursor=cursor)
            items.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                break
        return items

    return fetch


class MCPClient:
    """One MCP server connection with a blocking API (the Ruby gem's ``MCP::Client``)."""

    def __init__(self, config: MCPServerConfig | Mapping[str, Any]) -> None:
        self.config = MCPServerConfig.from_value(config)
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        self._session: Any = None  # mcp.Client, set while the session task is inside it
        self._lost = False  # the server closed the connection; the session task is ending
        _live_clients.add(self)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def server(self) -> MCPServerConfig:
        return self.config

    @property
    def connected(self) -> bool:
        task = self._task
        return self._session is not None and not self._lost and task is not None and not task.done()

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return f"MCPClient({self.name!r}, {self.config.transport}, {state})"

    # --- lifecycle -------------------------------------------------------------------------

    def connect(self) -> MCPClient:
        """Connect if not connected. Never raises: a failure is logged and kept in
        ``last_error``, and the client stays disconnected (call again to retry)."""
        with self._lock:
            if self.connected:
                return self
            self._shutdown(graceful=False)
            _log.info("mcp.connecting", server=self.name, transport=self.config.transport, target=self._target_label())
            try:
                self._start_loop()
                assert self._loop is not None
                future = asyncio.run_coroutine_threadsafe(self._open(), self._loop)
                try:
                    future.result(timeout=self.config.connect_timeout)
                except concurrent.futures.TimeoutError:
                    future.cancel()
                    raise TimeoutError(f"no handshake within {self.config.connect_timeout:g} s") from None
            except Exception as error:  # connect never raises (robot_lab semantics)
                self.last_error = describe_error(error)
                _log.warning(
                    "mcp.connect_failed",
                    server=self.name,
                    transport=self.config.transport,
                    target=self._target_label(),
                    error=self.last_error,
                )
                self._shutdown(graceful=False)
                return self
            self.last_error = None
            _log.info("mcp.connected", server=self.name, transport=self.config.transport)
            return self

    def close(self) -> None:
        """Close the session (and stop a stdio server process); safe to call twice."""
        with self._lock:
            was_connected = self.connected
            self._shutdown(graceful=True)
            if was_connected:
                _log.info("mcp.disconnected", server=self.name)

    disconnect = close

    def __enter__(self) -> MCPClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _target_label(self) -> str:
        # Only the executable's name or the URL's origin+path: args, env and headers may hold secrets.
        if self.config.transport == "stdio":
            return os.path.basename(self.config.command or "")
        return (self.config.url or "").split("?", 1)[0]

    def _start_loop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name=f"mcp-{self.name}", daemon=True)
        thread.start()
        ready.wait(5)
        self._loop, self._thread = loop, thread

    def _shutdown(self, *, graceful: bool) -> None:
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        if not loop.is_closed() and thread is not None and thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._stop_session(graceful), loop).result(_CLOSE_GRACE + 5)
            except Exception as error:
                _log.warning("mcp.close_failed", server=self.name, error=describe_error(error))
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
        if thread is None or not thread.is_alive():
            loop.close()
        self._loop = self._thread = None
        self._task = self._closing = self._session = None

    async def _stop_session(self, graceful: bool) -> None:
        task = self._task
        if task is None or task.done():
            return
        if self._closing is not None:
            self._closing.set()
        if graceful and self._session is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), _CLOSE_GRACE)
                return
            except (asyncio.TimeoutError, Exception):
                pass
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> None:
        self._lost = False
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._closing = asyncio.Event()
        self._task = loop.create_task(self._run_session(ready))
        await ready

    async def _run_session(self, ready: asyncio.Future[None]) -> None:
        from mcp import Client  # lazy: start-up time
        from mcp.types import Implementation  # lazy: start-up time

        try:
            async with AsyncExitStack() as stack:
                target = await self._transport(stack)
                client = Client(
                    target,
                    read_timeout_seconds=self.config.timeout,
                    client_info=Implementation(name="robot-lab", version=__version__),
                )
                await stack.enter_async_context(client)
                self._session = client
                if not ready.done():
                    ready.set_result(None)
                assert self._closing is not None
                while not self._closing.is_set():
                    if _transport_closed(client):
                        self._lost = True
                        self.last_error = "the server closed the connection"
                        _log.warning("mcp.session_ended", server=self.name, error=self.last_error)
                        break
                    try:
                        await asyncio.wait_for(self._closing.wait(), _WATCH_INTERVAL)
                    except asyncio.TimeoutError:
                        pass
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(TimeoutError("connection attempt cancelled"))
            raise
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else RuntimeError(describe_error(error)))
            else:
                self.last_error = describe_error(error)
                _log.warning("mcp.session_ended", server=self.name, error=self.last_error)
        finally:
            self._session = None

    async def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.transport == "stdio":
            from mcp import StdioServerParameters  # lazy: start-up time

            return StdioServerParameters(
                command=config.command or "", args=list(config.args), env=config.env, cwd=config.cwd
            )
        if config.transport == "sse":
            from mcp.client.sse import sse_client  # lazy: start-up time

            return sse_client(config.url or "", headers=config.headers, timeout=config.timeout)
        if config.headers:
            import httpx2  # lazy: start-up time
            from mcp.client.streamable_http import streamable_http_client  # lazy: start-up time

            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=config.headers, timeout=httpx2.Timeout(30.0, read=300.0))
            )
            return streamable_http_client(config.url or "", http_client=http)
        return config.url or ""

    # --- requests ----------------------------------------------------------------------------

    def _request(self, what: str, call: Callable[[Any], Awaitable[_T]]) -> _T:
        session, loop = self._session, self._loop
        if not self.connected or session is None or loop is None:
            raise MCPError(f"Not connected to MCP server: {self.name}")
        future = asyncio.run_coroutine_threadsafe(call(session), loop)
        try:
            # The SDK enforces config.timeout per request; the margin covers paging.
            return future.result(timeout=self.config.timeout * 2 + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise MCPError(
                f"MCP server '{self.name}' did not answer {what} within {self.config.timeout:g} s", retryable=True
            ) from None
        except MCPError:
            raise
        except Exception as error:
            if _is_connection_closed(error):
                self._connection_lost()
            raise MCPError(f"MCP server '{self.name}' failed {what}: {describe_error(error)}", retryable=True) from error

    def _connection_lost(self) -> None:
        """A request saw the connection closed: end the session now, so ``connected`` turns
        False and the next connect() (the manager's next use) starts a fresh one."""
        self._lost = True
        self.last_error = "the server closed the connection"
        loop, closing = self._loop, self._closing
        if loop is not None and closing is not None and not loop.is_closed():
            loop.call_soon_threadsafe(closing.set)

    def list_tools(self) -> list[dict[str, Any]]:
        """Tool definitions in MCP wire form: ``name``, ``description``, ``inputSchema``..."""
        fetch = _paged("list_tools", "tools")
        return [_dump(tool) for tool in self._request("tools/list", fetch)]

    @observe.mcp_call
    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call a tool; the result's content items joined as text. A tool error or a failed
        request comes back as ``"Error (name): ..."`` text, not an exception."""
        if not self.connected:
            raise MCPError(f"Not connected to MCP server: {self.name}")
        try:
            result = self._request(f"tools/call {name!r}", lambda s: s.call_tool(name, dict(arguments or {})))
        except MCPError as error:
            if not self.connected:
                raise MCPError(f"Not connected to MCP server: {self.name} ({error})") from error
            return f"Error ({name}): {error}"
        content = getattr(result, "content", None)
        text = render_content(content)
        if not text and getattr(result, "structured_content", None) is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        if getattr(result, "is_error", False):
            return f"Error ({name}): {text or 'the tool reported an error'}"
        return text

    def list_resources(self) -> list[dict[str, Any]]:
        fetch = _paged("list_resources", "resources")
        return [_dump(item) for item in self._request("resources/list", fetch)]

    def read_resource(self, uri: str) -> str:
        """A resource's contents as text (binary parts as ``[blob: mime, N bytes]``)."""
        result = self._request(f"resources/read {uri!r}", lambda s: s.read_resource(uri))
        parts = []
        for item in result.contents:
            text = getattr(item, "text", None)
            if text is not None:
                parts.append(text)
            else:
                blob = getattr(item, "blob", "") or ""
                parts.append(f"[blob: {getattr(item, 'mime_type', None) or 'unknown type'}, {len(blob) * 3 // 4} bytes]")
        return "\n".join(parts)

    def list_prompts(self) -> list[dict[str, Any]]:
        fetch = _paged("list_prompts", "prompts")
        return [_dump(item) for item in self._request("prompts/list", fetch)]

    def get_prompt(self, name: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The prompt in MCP wire form: ``{"description": ..., "messages": [{"role", "content"}]}``."""
        args = {str(k): str(v) for k, v in (arguments or {}).items()}
        result = self._request(f"prompts/get {name!r}", lambda s: s.get_prompt(name, args))
        return {k: v for k, v in _dump(result).items() if k in ("description", "messages")}

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.config.to_dict(), "connected": self.connected}


@atexit.register
def _close_all() -> None:
    """Stop stdio server processes cleanly when the interpreter exits."""
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:
            pass


__all__ = ["MCPClient", "describe_error", "render_content"]
