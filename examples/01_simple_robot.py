"""One robot, one run (robot_lab example 01). Offline by default: the scripted model answers.

    python examples/01_simple_robot.py
    OPENAI_API_KEY=... python examples/01_simple_robot.py   # the same with a real model
"""

import robot_lab

robot = robot_lab.build(name="helper", system_prompt="You are a concise, friendly assistant.")
result = robot.run("What is a message bus, in one sentence?")
print(result.reply)
print(f"tokens: in={result.input_tokens} out={result.output_tokens} model={robot.model}")
