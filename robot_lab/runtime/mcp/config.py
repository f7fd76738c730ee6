"""MCP server configuration: validated once, plain data, safe to ship inside a RobotSpec.

Accepted shapes (unknown keys are ignored, as robot_lab does)::

    {"name": "fs", "transport": "stdio", "command": "mcp-server-fs", "args": ["--root", "/data"],
     "env": {"LOG": "1"}, "cwd": "/srv", "timeout": 15, "description": "files on disk"}
    {"name": "search", "transport": "streamable-http", "url": "http://search:8000/mcp",
     "headers": {"Authorization": "Bearer ..."}}
    # the Ruby gem's nested form
    {"name": "fs", "transport": {"type": "stdio", "command": "mcp-server-fs"}}

``transport`` may be omitted when ``command`` (stdio) or ``url`` (streamable HTTP) makes it
obvious. ``timeout`` is per request, in seconds: default 15, a value >= 1000 is read as
milliseconds, the minimum is 1 (the Ruby gem's rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import ConfigurationError

DEFAULT_TIMEOUT = 15.0
DEFAULT_CONNECT_TIMEOUT = 30.0
VALID_TRANSPORTS = ("stdio", "streamable-http", "http", "sse")
# robot_lab also accepts these; the Python MCP SDK has no client for them.
UNSUPPORTED_TRANSPORTS = ("ws", "websocket")


def normalize_timeout(value: Any, *, server: str = "?", field_name: str = "timeout") -> float:
    """Seconds from the Ruby gem's timeout rule: None -> 15; >= 1000 -> milliseconds; min 1."""
    if value is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"MCP server '{server}': '{field_name}' must be a number of seconds, got {value!r}") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ConfigurationError(f"MCP server '{server}': '{field_name}' must be finite, got {value!r}")
    if seconds >= 1000:
        seconds /= 1000.0
    return max(seconds, 1.0)


def _str_list(value: Any, server: str, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(f"MCP server '{server}': '{name}' must be a list of strings, got {value!r}")
    if not all(isinstance(item, (str, int, float)) for item in value):
        raise ConfigurationError(f"MCP server '{server}': '{name}' must be a list of strings")
    return tuple(str(item) for item in value)


def _str_map(value: Any, server: str, name: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        # Never echo the value: env and headers hold secrets.
        raise ConfigurationError(f"MCP server '{server}': '{name}' must be a mapping of strings")
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True, eq=True)
class MCPServerConfig:
    """One MCP server a robot may use (the Ruby gem's ``MCP::Server``)."""

    name: str
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = field(default=None, repr=False)  # may hold secrets
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = field(default=None, repr=False)  # may hold secrets
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    description: str = ""

    __hash__ = None  # type: ignore[assignment]  # holds dicts

    @property
    def transport_type(self) -> str:
        return self.transport

    @classmethod
    def from_value(cls, value: MCPServerConfig | Mapping[str, Any]) -> MCPServerConfig:
        """Validate a config given as this class or a dict (flat or robot_lab-nested)."""
        if isinstance(value, MCPServerConfig):
            return value
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"MCP server config must be a mapping, got {type(value).__name__}")
        data = {str(k): v for k, v in value.items()}
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"MCP server config: 'name' is required (a non-empty string), got {name!r}")
        name = name.strip()
        transport = data.get("transport", data.get("type"))
        if isinstance(transport, Mapping):  # robot_lab: transport: {type:, command:, ...}
            nested = {str(k): v for k, v in transport.items()}
            transport = nested.pop("type", None)
            data = {**data, **nested}
        if transport is None:
            transport = "stdio" if data.get("command") else "streamable-http" if data.get("url") else None
        if transport is None:
            raise ConfigurationError(
                f"MCP server '{name}': 'transport' is required (one of {', '.join(VALID_TRANSPORTS)}), "
                "or give 'command' (stdio) or 'url' (streamable HTTP)"
            )
        transport = str(transport).strip().lower()
        if transport in UNSUPPORTED_TRANSPORTS:
            raise ConfigurationError(
                f"MCP server '{name}': 'transport' {transport!r} is not supported by the Python MCP SDK; "
                "use streamable-http or sse"
            )
        if transport not in VALID_TRANSPORTS:
            raise ConfigurationError(
                f"MCP server '{name}': invalid 'transport' {transport!r}; must be one of: {', '.join(VALID_TRANSPORTS)}"
            )
        if transport == "http":
            transport = "streamable-http"

        command = data.get("command")
        url = data.get("url")
        if transport == "stdio":
            if not isinstance(command, str) or not command.strip():
                raise ConfigurationError(f"MCP server '{name}': 'command' is required for the stdio transport")
        else:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigurationError(
                    f"MCP server '{name}': 'url' is required for the {transport} transport "
                    f"(an http:// or https:// URL), got {url!r}"
                )
        cwd = data.get("cwd")
        description = data.get("description")
        return cls(
            name=name,
            transport=transport,
            command=command.strip() if transport == "stdio" else None,
            args=_str_list(data.get("args"), name, "args"),
            env=_str_map(data.get("env"), name, "env"),
            cwd=str(cwd) if cwd else None,
            url=url if transport != "stdio" else None,
            headers=_str_map(data.get("headers"), name, "headers"),
            timeout=normalize_timeout(data.get("timeout"), server=name),
            connect_timeout=normalize_timeout(
                data.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT), server=name, field_name="connect_timeout"
            ),
            description="" if description is None else str(description).strip(),
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form (what :meth:`from_value` reads back)."""
        out: dict[str, Any] = {"name": self.name, "transport": self.transport, "timeout": self.timeout}
        if self.description:
            out["description"] = self.description
        if self.transport == "stdio":
            out["command"] = self.command
            if self.args:
                out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        else:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        if self.connect_timeout != DEFAULT_CONNECT_TIMEOUT:
            out["connect_timeout"] = self.connect_timeout
        return out


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "MCPServerConfig",
    "UNSUPPORTED_TRANSPORTS",
    "VALID_TRANSPORTS",
    "normalize_timeout",
]
