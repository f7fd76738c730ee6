"""MCP benchmark: tool-call latency through robot-lab's synchronous MCPClient beside the raw
async ``mcp`` SDK client, against the same real stdio server, in one run.

    .venv/bin/python bench/mcp_calls.py [--calls 300]

The baseline is ``async with mcp.Client(...)`` awaiting ``call_tool`` in a loop (no thread
hop). robot-lab's side is ``MCPClient.call_tool`` from plain synchronous code: each call
crosses into the client's event-loop thread and back. Connection time (process start plus
handshake) is reported for both. No Redis needed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from robot_lab.logging import configure_logging  # noqa: E402
from robot_lab.runtime.mcp.servers import MCPClient  # noqa: E402

SERVER = ROOT / "tests" / "mcp_servers" / "calculator.py"


async def baseline(calls: int) -> tuple[float, float]:
    from mcp import Client, StdioServerParameters

    start = time.perf_counter()
    async with Client(StdioServerParameters(command=sys.executable, args=[str(SERVER)]), read_timeout_seconds=15) as client:
        connected = time.perf_counter()
        for i in range(calls):
            result = await client.call_tool("add", {"a": i, "b": 1})
            assert result.content[0].text == str(i + 1)
        done = time.perf_counter()
    return connected - start, (done - connected) / calls


def robot_lab_side(calls: int) -> tuple[float, float]:
    start = time.perf_counter()
    client = MCPClient({"name": "calc", "command": sys.executable, "args": [str(SERVER)]})
    client.connect()
    assert client.connected, client.last_error
    connected = time.perf_counter()
    try:
        for i in range(calls):
            assert client.call_tool("add", {"a": i, "b": 1}) == str(i + 1)
        done = time.perf_counter()
    finally:
        client.close()
    return connected - start, (done - connected) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    configure_logging(level="ERROR", force=True)
    base_connect, base_call = asyncio.run(baseline(args.calls))
    rl_connect, rl_call = robot_lab_side(args.calls)
    print(f"MCP stdio tool call ({args.calls} sequential calls to tests/mcp_servers/calculator.py)")
    print(f"  raw async mcp.Client (baseline)   {base_call * 1e3:7.2f} ms/call   connect {base_connect:5.2f} s")
    print(f"  robot-lab MCPClient (sync)        {rl_call * 1e3:7.2f} ms/call   connect {rl_connect:5.2f} s")
    print(f"  ratio (robot-lab / baseline)      {rl_call / base_call:7.2f}x")


if __name__ == "__main__":
    main()
