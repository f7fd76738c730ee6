"""AgentSkills: SKILL.md bundles (examples/skills/) are matched against each message; the
matched skill's instructions are prepended to the system prompt, and the skill sticks to the
conversation until another skill clearly wins (a follow-up keeps it; a new conversation
starts fresh).

    python examples/09_skills.py
    robot-lab skills list --root examples/skills        # the same catalog from the CLI

Offline the matcher uses TF-IDF (no model download); set ROBOT_LAB_SKILLS__EMBEDDER=fastembed
with a local model to use embeddings.
"""

import os
from pathlib import Path

os.environ.setdefault("ROBOT_LAB_SKILLS__EMBEDDER", "tfidf")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")  # a story, not a service: warnings only
os.environ["ROBOT_LAB_SKILLS__ROOTS"] = f'["{Path(__file__).parent / "skills"}"]'

import robot_lab  # noqa: E402
from robot_lab.settings import reload_settings  # noqa: E402
from robot_lab.skills import default_catalog, reset_default_catalog  # noqa: E402

reload_settings()
reset_default_catalog()
print("catalog:", default_catalog().names())

prompts = []


def show_prompt(note: str) -> str:
    """Record which instructions the model runs under (for this example)."""
    prompts.append(robot.instructions)
    return "noted"


robot = robot_lab.build(name="support09", system_prompt="You are a support agent.",
                        skills=["refund-policy", "release-notes"], local_tools=[show_prompt],
                        model="scripted/echo" if robot_lab.get_settings().default_model().startswith("scripted/")
                        else None)
robot.run("I see a duplicate charge on invoice 1042, can I get a refund?", tools="inherit",
          conversation_id="customer-1")
print("matched refund-policy:", "# Refund policy" in prompts[-1])
robot.run("And the one from March too?", tools="inherit", conversation_id="customer-1")
print("the follow-up keeps it:", "# Refund policy" in prompts[-1])
robot.run("What time is it?", tools="inherit", conversation_id="customer-2")
print("no skill for small talk in a new conversation:", "# Refund policy" not in prompts[-1])
print("prompt restored:", robot.instructions == "You are a support agent.")
