"""A robot's MCP servers: connected lazily (once per process), their tools resolved per
run along the Ruby gem's ``mcp`` cascade, failures logged and never fatal to a run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.runtime.robot.toolset import is_none_value
from robot_lab.runtime.run_config import RunConfig
from robot_lab.runtime.tools import Tool, as_tool
from robot_lab.settings import get_settings

log = get_logger("robot_lab.robot")


def global_mcp() -> Any:
    """The settings' ``mcp`` (the Ruby gem's ``config.mcp``) as the last parent of ``inherit``;
    its default ``none`` means "no restriction at this level", as for ``tools``."""
    value = get_settings().mcp
    return None if is_none_value(value) else value


class MCPAttachment:
    """The MCP side of one robot: its server configs, the live manager, discovery state."""

    def __init__(self, owner: str, servers: Sequence[Mapping[str, Any]], *, discovery: bool = False) -> None:
        self.owner = owner
        self.servers = [dict(s) for s in servers]
        self.discovery = discovery
        self._discovered = False
        self._manager: Any = None
        if self.servers:
            self.manager  # validate the server configs now: a bad one fails at build time

    @property
    def manager(self) -> Any:
        """The MCPManager (connected lazily, per process)."""
        if self._manager is None:
            from robot_lab.runtime.mcp.servers import MCPManager  # lazy: start-up time

            self._manager = MCPManager(self.servers, owner=self.owner)
        return self._manager

    @property
    def failed_server_names(self) -> list[str]:
        return self._manager.failed_server_names if self._manager is not None else []

    def close(self) -> None:
        if self._manager is not None:
            self._manager.close()

    @contextmanager
    def shared(self) -> Iterator[None]:
        """For one run: the process's shared manager of these servers stands in for this
        robot's own (runtime/mcp/pool.py), so robots built per network task or per in-flight
        slot reuse one connection per server instead of each starting the servers."""
        if not self.servers:
            yield
            return
        from robot_lab.runtime.mcp.pool import shared_pool  # lazy: start-up time

        own = self._manager
        with shared_pool().lease(self.owner, self.servers) as manager:
            self._manager = manager
            try:
                yield
            finally:
                self._manager = own

    def may_block(self, mcp: Any) -> bool:
        """Whether :meth:`tools_for_run` may connect to or list servers (``arun`` then runs
        it in a thread); with no servers or runtime ``mcp`` none it returns [] at once."""
        return not (is_none_value(mcp) or not self.servers)

    def tools_for_run(self, mcp: Any, message: str | None, robot_mcp: Any, network_config: RunConfig | None) -> list[Tool]:
        """MCP tools for this run: runtime ``mcp`` none sends none; ``inherit`` takes the
        robot's setting (``robot_mcp``), else the network's, else all its servers."""
        if not self.may_block(mcp):
            return []
        if mcp == "inherit":
            mcp = robot_mcp or (network_config.mcp if network_config else None) or global_mcp() or "inherit"
        try:
            names = self.manager.resolve(mcp)
            if names and self.discovery and not self._discovered and message:
                names = self.manager.discover(message, names)
                self._discovered = True
            return [as_tool(t) for t in self.manager.tools(names)] if names else []
        except ConfigurationError:
            raise
        except Exception as exc:  # robot_lab: MCP trouble is logged, the run goes on
            log.warning("mcp.unavailable", robot=self.owner, error=f"{type(exc).__name__}: {exc}")
            return []
