"""MCP servers as robot tools: :mod:`.config` (server configs, transports, timeouts),
:mod:`.client` (one session per server over stdio, streamable HTTP or SSE) and
:mod:`.servers` (the per-robot manager that connects, lists and wraps tools)."""
