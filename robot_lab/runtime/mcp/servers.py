"""MCP for robots: server configs, a blocking client, a per-robot manager and discovery.

* :class:`MCPServerConfig` (``mcp_config``) - validated server definition.
* :class:`MCPClient` (``mcp_client``) - one connection, synchronous API over the async SDK.
* :class:`MCPManager` - a robot's servers: lazy connection on first use, failed servers
  retried on the next call, tools wrapped as :class:`MCPTool`.
* :class:`ServerDiscovery` - pick the servers relevant to a message (TF cosine).

How the Robot uses it (see docs/mcp.md)::

    manager = MCPManager(spec.mcp_servers, owner=robot.name)        # connects nothing
    names = manager.resolve(run_mcp)                                # "inherit"/"none"/[names]
    if robot.mcp_discovery and first_run:
        names = manager.discover(message, names)
    for tool in manager.tools(names):                               # connects lazily
        ...tool.name, tool.description, tool.parameters, tool.call(arguments) -> str
    manager.close()                                                 # robot.disconnect()

Nothing here imports the ``mcp`` SDK at module level; it loads on the first connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import ConfigurationError, MCPError
from robot_lab.logging import get_logger
from robot_lab.text import analysis as ta
from robot_lab.runtime.mcp.client import MCPClient, describe_error, render_content
from robot_lab.runtime.mcp.config import DEFAULT_TIMEOUT, VALID_TRANSPORTS, MCPServerConfig, normalize_timeout

_log = get_logger("robot_lab.mcp")

INHERIT = "inherit"
NONE_VALUES = (None, "none", "")


@dataclass
class MCPTool:
    """A tool served by an MCP server, callable like a local tool.

    ``call`` never raises: tool errors, transport failures and a lost connection all come
    back as ``"Error (name): ..."`` text for the model (the Ruby gem's tool contract).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    server: str
    client: MCPClient = field(repr=False)

    @property
    def mcp(self) -> str:
        """The Ruby gem's ``Tool#mcp``: the serving server's name."""
        return self.server

    def call(self, arguments: Mapping[str, Any] | None = None) -> str:
        try:
            return self.client.call_tool(self.name, arguments or {})
        except MCPError as error:
            return f"Error ({self.name}): {error}"

    def __call__(self, **arguments: Any) -> str:
        return self.call(arguments)

    def to_schema(self) -> dict[str, Any]:
        """The OpenAI/litellm ``tools`` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _wrap_tools(client: MCPClient) -> list[MCPTool]:
    tools = []
    for definition in client.list_tools():
        schema = definition.get("inputSchema") or {"type": "object", "properties": {}}
        tools.append(
            MCPTool(
                name=str(definition["name"]),
                description=str(definition.get("description") or ""),
                parameters=dict(schema),
                server=client.name,
                client=client,
            )
        )
    return tools


class MCPManager:
    """The MCP servers of one robot (the Ruby gem's ``MCPManagement``), thread-safe.

    Servers connect lazily, on the first :meth:`ensure_connected`/:meth:`tools` that needs
    them, in parallel. A server that fails is logged and remembered; every later call that
    needs it tries again (robot_lab: "retried on the next run"), as does a server whose
    session ended. Connected servers list their tools once per connection.
    """

    def __init__(
        self,
        servers: Iterable[MCPServerConfig | Mapping[str, Any]] = (),
        *,
        owner: str | None = None,
        client_factory: Any = MCPClient,
    ) -> None:
        self.owner = owner
        self._client_factory = client_factory
        self._configs: dict[str, MCPServerConfig] = {}
        self._clients: dict[str, MCPClient] = {}
        self._tools: dict[str, list[MCPTool]] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.RLock()
        for server in servers:
            self.add(server)

    def add(self, server: MCPServerConfig | Mapping[str, Any]) -> MCPServerConfig:
        config = MCPServerConfig.from_value(server)
        with self._lock:
            existing = self._configs.get(config.name)
            if existing is not None and existing != config:
                raise ConfigurationError(f"MCP server '{config.name}' is configured twice with different settings")
            self._configs[config.name] = config
        return config

    @property
    def names(self) -> list[str]:
        return list(self._configs)

    @property
    def configs(self) -> list[MCPServerConfig]:
        return list(self._configs.values())

    def resolve(self, selection: Any = INHERIT) -> list[str]:
        """Server names for a run's ``mcp`` value: ``"inherit"`` (all of this robot's),
        ``"none"``/None/``[]`` (none), a name, or a list of names and/or server configs
        (configs not seen before are added)."""
        if selection == INHERIT:
            return self.names
        if selection in NONE_VALUES or (isinstance(selection, (list, tuple)) and not selection):
            return []
        items = [selection] if isinstance(selection, (str, Mapping, MCPServerConfig)) else list(selection)
        names: list[str] = []
        for item in items:
            if isinstance(item, (Mapping, MCPServerConfig)):
                name = self.add(item).name
            elif isinstance(item, str):
                name = item
                if name not in self._configs:
                    known = ", ".join(self._configs) or "none"
                    raise ConfigurationError(f"unknown MCP server '{name}' (configured: {known})")
            else:
                raise ConfigurationError(f"mcp: expected server names or configs, got {type(item).__name__}")
            if name not in names:
                names.append(name)
        return names

    def discover(self, query: str, selection: Any = INHERIT, threshold: float | None = None) -> list[str]:
        """The names among ``selection`` relevant to ``query`` (see :class:`ServerDiscovery`)."""
        names = self.resolve(selection)
        chosen = ServerDiscovery.select(
            query,
            [self._configs[n] for n in names],
            threshold=ServerDiscovery.DEFAULT_THRESHOLD if threshold is None else threshold,
        )
        return [c.name for c in chosen]

    def ensure_connected(self, selection: Any = INHERIT) -> list[str]:
        """Connect the selected servers not yet connected; returns those connected now."""
        names = self.resolve(selection)
        with self._lock:
            pending = [n for n in names if n not in self._clients or not self._clients[n].connected]
            if pending:
                if len(pending) == 1:
                    self._connect(pending[0])
                else:
                    with ThreadPoolExecutor(max_workers=min(8, len(pending)), thread_name_prefix="mcp-connect") as pool:
                        list(pool.map(self._connect, pending))
            return [n for n in names if n in self._clients and self._clients[n].connected]

    def _connect(self, name: str) -> None:
        retry = name in self._errors
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self._client_factory(self._configs[name])
        if retry:
            _log.info("mcp.retrying", robot=self.owner, server=name)
        client.connect()
        if not client.connected:
            self._errors[name] = client.last_error or "connection failed"
            self._tools.pop(name, None)
            _log.warning("mcp.server_unavailable", robot=self.owner, server=name, error=self._errors[name])
            return
        try:
            self._tools[name] = _wrap_tools(client)
        except Exception as error:
            self._errors[name] = f"listing tools failed: {describe_error(error)}"
            self._tools.pop(name, None)
            client.close()
            _log.warning("mcp.server_unavailable", robot=self.owner, server=name, error=self._errors[name])
            return
        self._errors.pop(name, None)
        _log.info("mcp.tools_discovered", robot=self.owner, server=name, count=len(self._tools[name]), retry=retry)

    def tools(self, selection: Any = INHERIT) -> list[MCPTool]:
        """Tool wrappers of the selected servers, connecting them first if needed. A tool
        name served by two servers is kept once (the first server's) with a warning."""
        names = self.ensure_connected(selection)
        seen: dict[str, str] = {}
        out: list[MCPTool] = []
        for name in names:
            for tool in self._tools.get(name, []):
                if tool.name in seen:
                    _log.warning("mcp.duplicate_tool", tool=tool.name, kept=seen[tool.name], dropped=name)
                    continue
                seen[tool.name] = name
                out.append(tool)
        return out

    def client(self, name: str) -> MCPClient | None:
        return self._clients.get(name)

    @property
    def clients(self) -> dict[str, MCPClient]:
        return {n: c for n, c in self._clients.items() if c.connected}

    @property
    def failed_server_names(self) -> list[str]:
        return [n for n in self._configs if n in self._errors]

    @property
    def errors(self) -> dict[str, str]:
        """Last connection error per failed server."""
        return dict(self._errors)

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._tools.clear()

    def __enter__(self) -> MCPManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServerDiscovery:
    """Select the MCP servers relevant to a query (the Ruby gem's ``MCP::ServerDiscovery``).

    A server is kept when the TF cosine of the query and ``"name description"`` reaches
    ``threshold`` (0.05: descriptions are short, so on-topic scores are low). The input
    list comes back unchanged when it is empty, the query is blank, no server has a
    description, or nothing reaches the threshold - connecting everything is the safe
    fall-back.
    """

    DEFAULT_THRESHOLD = 0.05

    @staticmethod
    def _field(server: Any, name: str) -> str:
        value = server.get(name) if isinstance(server, Mapping) else getattr(server, name, None)
        return "" if value is None else str(value).strip()

    @classmethod
    def topic_text(cls, server: Any) -> str:
        return f"{cls._field(server, 'name')} {cls._field(server, 'description')}".strip()

    @classmethod
    def select(cls, query: str | None, servers: Sequence[Any], threshold: float = DEFAULT_THRESHOLD) -> list[Any]:
        servers = list(servers)
        if not servers or not (query or "").strip():
            return servers
        if not any(cls._field(s, "description") for s in servers):
            return servers
        query_vec = ta.tf_vector(query)
        matches = [s for s in servers if ta.cosine_similarity(query_vec, ta.tf_vector(cls.topic_text(s))) >= threshold]
        return matches or servers


__all__ = [
    "DEFAULT_TIMEOUT",
    "INHERIT",
    "VALID_TRANSPORTS",
    "MCPClient",
    "MCPManager",
    "MCPServerConfig",
    "MCPTool",
    "ServerDiscovery",
    "describe_error",
    "normalize_timeout",
    "render_content",
]
