"""MCP server config validation and ServerDiscovery (no server needed)."""

from __future__ import annotations

import pytest

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.mcp.servers import MCPServerConfig, ServerDiscovery, normalize_timeout


def test_flat_stdio_config() -> None:
    c = MCPServerConfig.from_value(
        {"name": "fs", "transport": "STDIO", "command": "mcp-fs", "args": ["--root", "/data"], "env": {"K": 1},
         "timeout": 20, "description": " files ", "extra": "ignored"}
    )
    assert (c.name, c.transport, c.command, c.args, c.env, c.timeout, c.description) == (
        "fs", "stdio", "mcp-fs", ("--root", "/data"), {"K": "1"}, 20.0, "files"
    )
    assert MCPServerConfig.from_value(c.to_dict()) == c
    assert "K" not in repr(c)  # env may hold secrets


def test_nested_robot_lab_form_and_inferred_transport() -> None:
    nested = MCPServerConfig.from_value({"name": "fs", "transport": {"type": "stdio", "command": "mcp-fs", "args": ["x"]}})
    assert nested.transport == "stdio" and nested.command == "mcp-fs" and nested.args == ("x",)
    assert MCPServerConfig.from_value({"name": "a", "command": "x"}).transport == "stdio"
    http = MCPServerConfig.from_value({"name": "b", "url": "http://h:1/mcp", "headers": {"Authorization": "t"}})
    assert http.transport == "streamable-http" and http.headers == {"Authorization": "t"}
    assert MCPServerConfig.from_value({"name": "c", "transport": "http", "url": "https://h/mcp"}).transport == "streamable-http"
    assert MCPServerConfig.from_value({"name": "d", "transport": "sse", "url": "https://h/sse"}).transport == "sse"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"transport": "stdio", "command": "x"}, r"'name' is required"),
        ({"name": "  "}, r"'name' is required"),
        ({"name": "s"}, r"MCP server 's': 'transport' is required"),
        ({"name": "s", "transport": "carrier-pigeon", "command": "x"}, r"invalid 'transport' 'carrier-pigeon'; must be one of: stdio"),
        ({"name": "s", "transport": "ws", "url": "ws://h"}, r"'transport' 'ws' is not supported"),
        ({"name": "s", "transport": "stdio"}, r"MCP server 's': 'command' is required for the stdio transport"),
        ({"name": "s", "transport": "streamable-http"}, r"'url' is required for the streamable-http transport"),
        ({"name": "s", "transport": "sse", "url": "ftp://h"}, r"'url' is required for the sse transport"),
        ({"name": "s", "command": "x", "args": "--flag"}, r"'args' must be a list of strings"),
        ({"name": "s", "command": "x", "env": ["A=1"]}, r"'env' must be a mapping"),
        ({"name": "s", "command": "x", "timeout": "soon"}, r"'timeout' must be a number of seconds"),
    ],
)
def test_invalid_configs_name_the_field(config: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MCPServerConfig.from_value(config)


def test_timeout_rule() -> None:
    assert normalize_timeout(None) == 15.0
    assert normalize_timeout(30) == 30.0
    assert normalize_timeout(999) == 999.0
    assert normalize_timeout(1000) == 1.0  # milliseconds
    assert normalize_timeout(2500) == 2.5
    assert normalize_timeout(0.2) == 1.0  # minimum one second
    assert normalize_timeout(-5) == 1.0


SERVERS = [
    {"name": "filesystem", "description": "Read, write, and search local files and directories"},
    {"name": "github", "description": "GitHub repos, issues, pull requests, code search"},
    {"name": "brew", "description": "Install, update, and manage macOS packages via Homebrew"},
]


def test_discovery_selects_relevant_servers() -> None:
    assert [s["name"] for s in ServerDiscovery.select("install imagemagick with brew", SERVERS)] == ["brew"]
    assert [s["name"] for s in ServerDiscovery.select("open a pull request", SERVERS)] == ["github"]
    configs = [MCPServerConfig.from_value({**s, "command": "x"}) for s in SERVERS]
    assert [c.name for c in ServerDiscovery.select("search the files in this directory", configs)] == ["filesystem", "github"]


def test_discovery_fallbacks_return_input_unchanged() -> None:
    assert ServerDiscovery.select("anything", []) == []
    assert ServerDiscovery.select("   ", SERVERS) == SERVERS
    bare = [{"name": "a"}, {"name": "b"}]
    assert ServerDiscovery.select("a", bare) == bare  # no descriptions
    assert ServerDiscovery.select("quantum chromodynamics lattice", SERVERS) == SERVERS  # nothing passes
    assert ServerDiscovery.select("install brew", SERVERS, threshold=1.0) == SERVERS
