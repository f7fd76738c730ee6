"""Network memory: parallel analysts write their findings to the run's shared memory
(`memory_key=`), a subscriber sees every change as it happens, and after the run the memory
is read back -- from any process, since it lives in Redis (here: the embedded one).

    python examples/07_network_memory.py
"""

import robot_lab
from robot_lab.logging import configure_logging
from robot_lab.memory.store import Memory
from robot_lab.settings import get_settings

configure_logging(level="WARNING", force=True)
OFFLINE = get_settings().default_model().startswith("scripted/")


def model(offline: str) -> str | None:
    return offline if OFFLINE else None


intake = robot_lab.build(name="intake07", system_prompt="Restate the customer's problem in one line.")
sentiment = robot_lab.build(name="sentiment07", model=model("scripted/text:frustrated"),
                            system_prompt="Answer with one word: the customer's sentiment.")
urgency = robot_lab.build(name="urgency07", model=model("scripted/text:high"),
                          system_prompt="Answer with one word: low, normal or high urgency.")

net = robot_lab.create_network("triage07")
net.task("intake", intake)
with net.parallel("analysis", depends_on="intake"):
    net.task("sentiment", sentiment, memory_key="sentiment")
    net.task("urgency", urgency, memory_key="urgency")

result = net.run("My order is three weeks late and nobody answers!")
memory = Memory.for_run(result.run_id)
print("shared memory of the run:", {k: memory.get(k) for k in ("sentiment", "urgency")})
print("change log:", [(c.version, c.key, c.value) for c in memory.changes()])

# Memory scopes outlive runs: a network-wide counter, updated atomically (compare-and-set).
team = Memory.for_network("triage07")
seen = []
sub = team.subscribe("tickets", callback=lambda change: seen.append(change.value))
for _ in range(3):
    team.update("tickets", lambda n: (n or 0) + 1)
team.get("tickets")
import time

deadline = time.monotonic() + 5
while len(seen) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
team.unsubscribe(sub)
print("tickets handled:", team.get("tickets"), "-- subscriber saw", seen)
