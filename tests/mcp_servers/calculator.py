"""A tiny real MCP server for the tests: tools, a resource and a prompt.

Run over stdio (the default) or streamable HTTP::

    python tests/mcp_servers/calculator.py                       # stdio
    python tests/mcp_servers/calculator.py --http --port 8123    # http://127.0.0.1:8123/mcp
    python tests/mcp_servers/calculator.py --sse --port 8124     # http://127.0.0.1:8124/sse

It imports nothing from robot_lab, so it behaves like any third-party server.
"""

from __future__ import annotations

import argparse
import sys

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer(name="calculator", description="Arithmetic tools for tests", log_level="ERROR")


@server.tool(description="Add two integers and return the sum.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Echo the text back, upper-cased.")
def shout(text: str) -> str:
    return text.upper()


@server.tool(description="Return two text parts.")
def two_parts(word: str) -> list[str]:
    return [f"first:{word}", f"second:{word}"]


@server.tool(description="Sleep, then answer (for timeouts).")
def slow(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "done"


@server.tool(description="The server's process id.")
def pid() -> int:
    import os

    return os.getpid()


@server.tool(description="Kill this server process at once (to test lost connections).")
def crash() -> str:
    import os

    os._exit(3)


@server.tool(description="Always fails with a clear message.")
def explode(reason: str = "boom") -> str:
    raise ToolError(f"exploded: {reason}")


@server.resource("memo://greeting", name="greeting", description="A fixed greeting", mime_type="text/plain")
def greeting() -> str:
    return "hello from the calculator"


@server.prompt(description="Ask for a sum in words.")
def sum_prompt(a: str, b: str) -> str:
    return f"Please add {a} and {b}."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--sse", action="store_true")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    elif args.sse:
        server.run("sse", host="127.0.0.1", port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
