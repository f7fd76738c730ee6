"""The MCP client and manager against REAL MCP servers (tests/mcp_servers/calculator.py),
over stdio (a subprocess per connection) and over streamable HTTP (a server subprocess)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from robot_lab.errors import MCPError
from robot_lab.runtime.mcp.servers import MCPClient, MCPManager, MCPTool
from tests.ports import free_port
from tests.redis_server import wait_for

SERVER = Path(__file__).parent / "mcp_servers" / "calculator.py"


def stdio_config(name: str = "calc", **extra: object) -> dict:
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": [str(SERVER)], **extra}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


@pytest.fixture(scope="module")
def calc() -> Iterator[MCPClient]:
    client = MCPClient(stdio_config(timeout=2))
    client.connect()
    assert client.connected, client.last_error
    try:
        yield client
    finally:
        client.close()


@contextmanager
def _serve(flag: str, path: str) -> Iterator[str]:
    """Run the calculator over HTTP in a subprocess on a free loopback port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), flag, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        def listening() -> bool:
            assert proc.poll() is None, "MCP HTTP server exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_for(listening, timeout=30, interval=0.05)
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with _serve("--http", "/mcp") as url:
        yield url


def test_stdio_lists_and_calls_tools(calc: MCPClient) -> None:
    tools = {t["name"]: t for t in calc.list_tools()}
    assert {"add", "shout", "two_parts", "explode", "slow", "pid", "crash"} <= set(tools)
    assert tools["add"]["description"] == "Add two integers and return the sum."
    assert tools["add"]["inputSchema"]["required"] == ["a", "b"]
    assert calc.call_tool("add", {"a": 2, "b": 40}) == "42"
    assert calc.call_tool("two_parts", {"word": "x"}) == "first:x\nsecond:x"  # content items joined


def test_tool_errors_come_back_as_text(calc: MCPClient) -> None:
    assert calc.call_tool("explode", {"reason": "kaput"}) == "Error (explode): Error executing tool explode: exploded: kaput"
    assert calc.call_tool("nope", {}) == "Error (nope): Unknown tool: nope"
    bad_args = calc.call_tool("add", {"a": "x"})
    assert bad_args.startswith("Error (add): ") and "validation error" in bad_args


def test_request_timeout_is_text_and_client_survives(calc: MCPClient) -> None:
    result = calc.call_tool("slow", {"seconds": 4})  # timeout is 2 s
    assert result.startswith("Error (slow): ") and "timed out" in result
    assert calc.connected
    assert calc.call_tool("add", {"a": 1, "b": 1}) == "2"


def test_resources_and_prompts(calc: MCPClient) -> None:
    resources = calc.list_resources()
    assert [(r["name"], r["uri"]) for r in resources] == [("greeting", "memo://greeting")]
    assert calc.read_resource("memo://greeting") == "hello from the calculator"
    prompts = calc.list_prompts()
    assert prompts[0]["name"] == "sum_prompt"
    assert [a["name"] for a in prompts[0]["arguments"]] == ["a", "b"]
    prompt = calc.get_prompt("sum_prompt", {"a": 1, "b": 2})
    assert prompt["messages"] == [{"role": "user", "content": {"type": "text", "text": "Please add 1 and 2."}}]
    with pytest.raises(MCPError, match="resources/read"):
        calc.read_resource("memo://missing")


def test_concurrent_calls_from_threads(calc: MCPClient) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: calc.call_tool("add", {"a": i, "b": 1000}), range(24)))
    assert results == [str(i + 1000) for i in range(24)]


def test_streamable_http(http_url: str) -> None:
    with MCPClient({"name": "calc-http", "url": http_url, "description": "calculator over HTTP"}) as client:
        assert client.connected, client.last_error
        assert "shout" in [t["name"] for t in client.list_tools()]
        assert client.call_tool("shout", {"text": "hello"}) == "HELLO"
        assert client.call_tool("explode", {}) == "Error (explode): Error executing tool explode: exploded: boom"
    assert not client.connected


def test_streamable_http_with_headers(http_url: str) -> None:
    client = MCPClient({"name": "calc-h", "transport": "http", "url": http_url, "headers": {"X-Test": "1"}})
    try:
        assert client.connect().connected, client.last_error
        assert client.call_tool("add", {"a": 1, "b": 2}) == "3"
    finally:
        client.close()


def test_sse_transport() -> None:
    with _serve("--sse", "/sse") as url:
        client = MCPClient({"name": "calc-sse", "transport": "sse", "url": url})
        try:
            assert client.connect().connected, client.last_error
            assert client.call_tool("shout", {"text": "sse"}) == "SSE"
        finally:
            client.close()


def test_disconnected_client_raises_not_connected() -> None:
    client = MCPClient(stdio_config("never"))
    for call in (
        client.list_tools,
        lambda: client.call_tool("add", {}),
        client.list_resources,
        lambda: client.read_resource("memo://greeting"),
        client.list_prompts,
        lambda: client.get_prompt("sum_prompt", {}),
    ):
        with pytest.raises(MCPError, match="^Not connected to MCP server: never$"):
            call()
    client.close()  # closing a never-connected client is fine


def test_missing_command_logs_and_does_not_raise() -> None:
    client = MCPClient({"name": "ghost", "command": "robot-lab-no-such-mcp-server"})
    with capture_logs() as logs:
        assert client.connect() is client
    assert not client.connected
    assert "FileNotFoundError" in (client.last_error or "")
    failed = [e for e in logs if e["event"] == "mcp.connect_failed"]
    assert failed and failed[0]["server"] == "ghost" and "robot-lab-no-such-mcp-server" in failed[0]["error"]
    assert failed[0]["log_level"] == "warning"


def test_unreachable_http_server_does_not_raise() -> None:
    client = MCPClient({"name": "down", "url": f"http://127.0.0.1:{free_port()}/mcp"})
    client.connect()
    assert not client.connected and "ConnectError" in (client.last_error or "")


def test_close_stops_the_stdio_server_process() -> None:
    client = MCPClient(stdio_config("closer"))
    client.connect()
    pid = int(client.call_tool("pid", {}))
    assert _pid_alive(pid)
    client.close()
    wait_for(lambda: not _pid_alive(pid))
    client.close()


def test_manager_is_lazy_and_wraps_tools(tmp_path: Path) -> None:
    manager = MCPManager([stdio_config("calc"), {"name": "ghost", "command": "robot-lab-no-such-mcp-server"}], owner="bot")
    try:
        assert manager.names == ["calc", "ghost"]
        assert manager.clients == {}  # nothing connected at construction
        assert manager.resolve("none") == [] and manager.resolve([]) == [] and manager.resolve(None) == []
        assert manager.resolve(["calc"]) == ["calc"]
        tools = manager.tools("inherit")
        assert manager.failed_server_names == ["ghost"]
        assert "FileNotFoundError" in manager.errors["ghost"]
        by_name = {t.name: t for t in tools}
        add = by_name["add"]
        assert isinstance(add, MCPTool) and add.server == add.mcp == "calc"
        assert add.description == "Add two integers and return the sum."
        assert add.parameters["properties"]["a"]["type"] == "integer"
        assert add.call({"a": 2, "b": 3}) == "5"
        assert add(a=1, b=1) == "2"
        assert add.to_schema()["function"]["name"] == "add"
        assert manager.tools(["ghost"]) == []  # retried, still failing, no tools
        assert list(manager.clients) == ["calc"]
    finally:
        manager.close()
    assert add.call({"a": 1, "b": 1}) == "Error (add): Not connected to MCP server: calc"


def test_manager_retries_failed_server_on_next_call(tmp_path: Path) -> None:
    script = tmp_path / "late_server.py"
    manager = MCPManager([{"name": "late", "command": sys.executable, "args": [str(script)], "timeout": 5}])
    try:
        assert manager.ensure_connected() == []
        assert manager.failed_server_names == ["late"]
        shutil.copy(SERVER, script)  # the server becomes available
        with capture_logs() as logs:
            assert manager.ensure_connected() == ["late"]
        assert any(e["event"] == "mcp.retrying" for e in logs)
        assert manager.failed_server_names == []
        assert {t.name for t in manager.tools()} >= {"add", "shout"}
    finally:
        manager.close()


def test_manager_reconnects_after_server_dies() -> None:
    manager = MCPManager([stdio_config("fragile")])
    try:
        tools = {t.name: t for t in manager.tools()}
        first_pid = int(tools["pid"].call())
        result = tools["crash"].call()
        assert result.startswith("Error (crash): ")
        client = manager.client("fragile")
        assert client is not None
        wait_for(lambda: not client.connected)
        assert tools["add"].call({"a": 1, "b": 2}).startswith("Error (add): Not connected to MCP server: fragile")
        tools = {t.name: t for t in manager.tools()}  # next use reconnects
        assert tools["add"].call({"a": 1, "b": 2}) == "3"
        assert int(tools["pid"].call()) != first_pid
    finally:
        manager.close()


def test_manager_discovery_and_unknown_names() -> None:
    manager = MCPManager(
        [
            {"name": "brew", "command": "x", "description": "Install and manage macOS packages via Homebrew"},
            {"name": "github", "command": "x", "description": "GitHub issues and pull requests"},
        ]
    )
    assert manager.discover("install imagemagick with brew") == ["brew"]
    assert manager.discover("what is the weather") == ["brew", "github"]
    from robot_lab.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"unknown MCP server 'gitlab' \(configured: brew, github\)"):
        manager.resolve(["gitlab"])
    with pytest.raises(ConfigurationError, match="configured twice"):
        manager.add({"name": "brew", "command": "y"})
    assert manager.resolve([{"name": "extra", "command": "z"}]) == ["extra"]
    assert manager.names == ["brew", "github", "extra"]
