"""The in-process robot: Robot, tools, RunConfig, templates, the rails around every model and
tool call (budgets, loop guards, hooks), durable steps and human input, MCP servers and
remote A2A agents as tools, conversations and history, delegation and spawn. The model
gateway it calls is the layer below (:mod:`robot_lab.llm`); networks of robots are the layer
above (:mod:`robot_lab.network`); skills sit beside this one (:mod:`robot_lab.skills`)."""
