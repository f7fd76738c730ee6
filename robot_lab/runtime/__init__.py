"""The in-process robot: Robot, tools, RunConfig, templates, the LLM gateway and the offline
scripted model, the rails around every model and tool call (budgets, loop guards, hooks),
MCP servers, conversations and history, delegation and spawn. Networks of robots are the
layer above (:mod:`robot_lab.network`); skills sit beside this one (:mod:`robot_lab.skills`)."""
