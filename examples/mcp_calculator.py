"""A tiny MCP server (stdio) used by examples/06_mcp.py: two arithmetic tools.

    python examples/mcp_calculator.py      # speaks MCP on stdin/stdout
"""

from mcp.server import MCPServer

server = MCPServer(name="calculator", description="Arithmetic tools", log_level="ERROR")


@server.tool(description="Add two integers and return the sum.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Multiply two integers.")
def multiply(a: int, b: int) -> int:
    return a * b


if __name__ == "__main__":
    server.run()
