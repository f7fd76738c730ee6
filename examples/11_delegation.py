"""Delegation: a manager robot hands sub-tasks to specialists -- a Robot in this process, or a
robot *name* served over the bus by whichever worker runs it (here a poller thread; in
production a `robot-lab worker` process) -- synchronously or as a future.

    python examples/11_delegation.py
"""

import robot_lab
from robot_lab.bus import Bus, BusPoller
from robot_lab.logging import configure_logging

configure_logging(level="WARNING", force=True)
OFFLINE = robot_lab.get_settings().default_model().startswith("scripted/")


def model(offline: str) -> str | None:
    return offline if OFFLINE else None


manager = robot_lab.build(name="manager11", system_prompt="You split work and delegate it.")
translator = robot_lab.build(name="translator11", model=model("scripted/text:Bonjour le monde"),
                             system_prompt="Translate to French.")
researcher = robot_lab.build(name="researcher11", model=model("scripted/text:Paris has 2.1 million people."),
                             system_prompt="Answer with one fact.")

# 1. a Robot object: it runs here
result = manager.delegate(translator, "Hello world")
print(f"local delegate: {result.reply!r} (delegated_by={result.delegated_by})")

# 2. a robot name: the task travels over the bus to the worker serving 'researcher11'
bus = Bus()
bus.register("researcher11")
with BusPoller("researcher11", bus).serve(researcher):
    print("remote delegate:", manager.delegate("researcher11", "How many people live in Paris?", timeout=30).reply)
    future = manager.delegate("researcher11", "And in Lyon?", async_=True, timeout=30)
    print("future:", future.value(timeout=30).reply)

# 3. a name nobody serves: a clear timeout instead of a hang
bus.register("nobody11")
try:
    manager.delegate("nobody11", "anyone?", timeout=0.5)
except robot_lab.DelegationTimeout as exc:
    print(f"timeout: {exc}")
