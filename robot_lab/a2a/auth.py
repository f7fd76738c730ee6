"""Who may call ``robot-lab a2a``: bearer tokens or API keys, from settings or a Secret
directory, checked before the SDK sees the request.

A request without a known secret gets HTTP 401 with a ``WWW-Authenticate`` header and a
JSON-RPC error body; the agent cards stay readable unless ``a2a.public_card`` is off. The
caller's name (never its secret) becomes the request's user, which owns the tasks it starts.
"""

from __future__ import annotations

import hmac
import json
import time
from pathlib import Path
from typing import Any

from a2a.types.a2a_pb2 import (
    APIKeySecurityScheme,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.settings import A2ASettings

log = get_logger("robot_lab.a2a")

CARD_SUFFIX = "/.well-known/agent-card.json"
RELOAD_EVERY = 10.0  # seconds between looks at tokens_dir (a rotated Secret shows up)
UNAUTHORIZED_CODE = -32600  # JSON-RPC "invalid request": the spec carries auth failures in HTTP 401


def security_fields(settings: A2ASettings) -> tuple[dict[str, SecurityScheme], list[SecurityRequirement]]:
    """The card's ``securitySchemes`` and ``security``: either scheme will do."""
    if settings.anonymous and not (settings.tokens or settings.tokens_dir):
        return {}, []
    schemes = {
        "bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="bearer")),
        "apiKey": SecurityScheme(api_key_security_scheme=APIKeySecurityScheme(location="header",
                                                                             name=settings.api_key_header)),
    }
    return schemes, [SecurityRequirement(schemes={"bearer": StringList()}),
                     SecurityRequirement(schemes={"apiKey": StringList()})]


def read_tokens_dir(path: str) -> dict[str, str]:
    root = Path(path)
    if not root.is_dir():
        raise ConfigurationError(f"a2a.tokens_dir {path!r} is not a directory")
    out = {}
    for file in sorted(root.iterdir()):
        if file.is_file() and not file.name.startswith("."):  # Kubernetes' ..data links are dot names
            secret = file.read_text().strip()
            if secret:
                out[file.name] = secret
    return out


class Tokens:
    """Secret -> caller name, from settings and ``tokens_dir``."""

    def __init__(self, settings: A2ASettings) -> None:
        self.settings = settings
        self._static = {name: s.get_secret_value() for name, s in settings.tokens.items()}
        self._dir: dict[str, str] = {}
        self._read_at = 0.0
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        if self.settings.tokens_dir and (force or time.monotonic() - self._read_at > RELOAD_EVERY):
            self._read_at = time.monotonic()
            try:
                self._dir = read_tokens_dir(self.settings.tokens_dir)
            except (OSError, ConfigurationError) as exc:
                if force:
                    raise ConfigurationError(str(exc)) from exc
                log.warning("a2a.tokens_dir_unreadable", error=str(exc))

    def __bool__(self) -> bool:
        return bool(self._static or self._dir)

    def caller(self, secret: str) -> str | None:
        self._refresh()
        found = None
        for name, known in (*self._static.items(), *self._dir.items()):
            if hmac.compare_digest(known.encode(), secret.encode()):  # every entry compared: no timing hint
                found = name
        return found


class AuthMiddleware:
    """ASGI middleware: a known secret or HTTP 401."""

    def __init__(self, app: Any, tokens: Tokens | None, settings: A2ASettings) -> None:
        self.app = app
        self.tokens = tokens
        self.settings = settings

    def _secret(self, headers: dict[bytes, bytes]) -> str | None:
        auth = headers.get(b"authorization", b"").decode(errors="replace")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        key = headers.get(self.settings.api_key_header.lower().encode())
        return key.decode(errors="replace").strip() if key else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.tokens is None:
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if (self.settings.public_card and (path.endswith(CARD_SUFFIX) or path == "/")) or path == "/healthz":
            return await self.app(scope, receive, send)
        secret = self._secret(dict(scope.get("headers") or []))
        caller = self.tokens.caller(secret) if secret else None
        if caller is None:
            log.warning("a2a.unauthorized", path=path, presented=secret is not None)
            return await self._deny(send, "missing credentials" if secret is None else "unknown credentials")
        from starlette.authentication import AuthCredentials, SimpleUser  # lazy: start-up time

        scope["user"] = SimpleUser(caller)
        scope["auth"] = AuthCredentials(["authenticated"])
        await self.app(scope, receive, send)

    async def _deny(self, send: Any, why: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": None,
                           "error": {"code": UNAUTHORIZED_CODE, "message": f"Unauthorized: {why}"}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", 'Bearer realm="robot-lab", error="invalid_token"'.encode())]})
        await send({"type": "http.response.body", "body": body})
