"""What ``robot-lab a2a`` reads of a request before anything else does: a body of at most
``a2a.max_body_bytes``, and, for a POST, a JSON body.

The SDK reads a request's body whole, parses it as JSON and then as protobuf, so one large
message costs many times its size in memory (a 48 MiB body raised the peak by 240 MiB).
This middleware sits outside everything else (auth included): a declared
``Content-Length`` over the limit is refused before a byte of the body is read, and a body
without one (chunked) is read as it streams, at most ``limit + 1`` bytes, then refused:
HTTP 413 with a JSON-RPC error body (``-32600``, the request is invalid: JSON-RPC has no
code of its own for size) and ``Connection: close``, since the rest of the body is never
read. A POST whose ``Content-Type`` names something other than JSON gets HTTP 415 with the
spec's ``ContentTypeNotSupportedError`` (``-32005``). A body that passes is handed on
whole, then the connection's later messages (a client going away during a stream) as they
come.
"""

from __future__ import annotations

import json
from typing import Any

from robot_lab.logging import get_logger

log = get_logger("robot_lab.a2a")

TOO_LARGE_CODE = -32600
CONTENT_TYPE_NOT_SUPPORTED_CODE = -32005


def _is_json(content_type: bytes) -> bool:
    media = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class RequestGate:
    """ASGI middleware: a body over ``limit`` bytes gets HTTP 413, a POST of another type than
    JSON HTTP 415."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, send, int(declared))
        content_type = headers.get(b"content-type")
        if scope.get("method") == "POST" and content_type is not None and not _is_json(content_type):
            log.warning("a2a.content_type_refused", path=scope.get("path", ""),
                        content_type=content_type.decode("latin-1")[:100])
            return await _answer(send, 415, CONTENT_TYPE_NOT_SUPPORTED_CODE,
                                 f"Content-Type {content_type.decode('latin-1')[:100]!r} is not supported: "
                                 "send JSON-RPC as application/json")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away before its body was read
                return None
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(scope, send, None)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole: dict[str, Any] | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> dict[str, Any]:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict[str, Any], send: Any, declared: int | None) -> None:
        log.warning("a2a.body_too_large", path=scope.get("path", ""), limit=self.limit, declared=declared)
        await _answer(send, 413, TOO_LARGE_CODE,
                      f"Request body too large: over {self.limit} bytes (a2a.max_body_bytes)")


async def _answer(send: Any, status: int, code: int, message: str) -> None:
    """An HTTP error with a JSON-RPC error body; the connection closes (its body is unread)."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
