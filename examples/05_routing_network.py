"""A routing network (robot_lab's create_network + a classifier): the classifier picks one
optional task, the chosen specialist answers, a summarizer closes. Offline the classifier is
the scripted model's `route:` behaviour driven by keyword rules; with a provider key a real
model makes the choice through the same `route` tool.

    python examples/05_routing_network.py
    OPENAI_API_KEY=... python examples/05_routing_network.py

Runs in this process (embedded Redis, in-process workers); 13_multiprocess.py shows the same
kind of network on worker processes.
"""

import robot_lab
from robot_lab.llm.scripted import register_script
from robot_lab.logging import configure_logging
from robot_lab.settings import get_settings

configure_logging(level="WARNING", force=True)  # keep the output to what the example prints
OFFLINE = get_settings().default_model().startswith("scripted/")
register_script("router05", {
    "rules": [{"when": {"regex": "invoice|refund|charge"}, "route": "billing"},
              {"when": {"regex": "crash|error|bug"}, "route": "tech"}],
    "default": {"route": "tech"},
})


def model(offline: str) -> str | None:
    return offline if OFFLINE else None  # None: the configured provider


router = robot_lab.build(name="router05", model=model("scripted/router05"),
                         system_prompt="Route the message to billing or tech by calling the route tool.")
billing = robot_lab.build(name="billing05", model=model("scripted/text:Billing: refund issued."),
                          system_prompt="You answer billing questions in one sentence.")
tech = robot_lab.build(name="tech05", model=model("scripted/text:Tech: update to 2.4.1."),
                       system_prompt="You answer technical questions in one sentence.")
closer = robot_lab.build(name="closer05", system_prompt="Close the ticket politely, in one sentence.")

net = robot_lab.create_network("helpdesk05")
net.task("route", router, routes=["billing", "tech"])
net.task("billing", billing, depends_on="optional")
net.task("tech", tech, depends_on="optional")
net.task("close", closer, depends_on=["billing", "tech"])

if __name__ == "__main__":
    print(net.visualize())
    for message in ("I was charged twice on my invoice", "The app crashes at login"):
        result = net.run(message)
        print(f"{message!r} -> routed to {sorted(result.activated)}; states {result.states}")
        print("  answer:", result["billing" if "billing" in result.activated else "tech"].reply)
