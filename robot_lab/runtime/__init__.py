"""The robot runtime: Robot, tools, RunConfig, templates, the LLM gateway and the offline
scripted model, plus the subsystems (memory, networks, budgets, MCP) built on them."""
