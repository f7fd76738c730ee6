"""Templates: a Markdown prompt with YAML front matter, rendered with Jinja2.

    python examples/04_templates.py
"""

from pathlib import Path

import robot_lab

prompts = Path(__file__).parent / "prompts"
robot = robot_lab.build(template="support", template_dirs=[prompts], context={"company": "Acme"})
print("system prompt:", robot.instructions)
print("temperature from front matter:", robot.config.temperature)
print(robot.run("My parcel is late", tone="formal").reply)
print("re-rendered:", robot.instructions)
