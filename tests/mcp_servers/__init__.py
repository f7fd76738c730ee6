"""Small real MCP servers the MCP tests launch as subprocesses (stdio and streamable HTTP)."""
