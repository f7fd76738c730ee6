"""Network scenarios run in a child process against a real Redis Cluster (tests/test_connection_cluster.py).

rq reads ``RQ_KEY_PREFIX`` when it is imported, so everything that enqueues rq jobs runs
here, in a process started with ``RQ_KEY_PREFIX={rq}`` (the documented cluster setting),
and prints one JSON object for the test to check. The robots are served by real
``robot-lab worker`` processes; their specs are published by :func:`robots`.

    python tests/cluster_scenarios.py publish <tag>
    python tests/cluster_scenarios.py networks <tag>
    python tests/cluster_scenarios.py slow <tag>      # submit a slow run, print its id, wait
"""

from __future__ import annotations

import json
import sys
from typing import Any

from robot_lab.runtime.registry import publish_specs
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from tests.fixtures.tools import add


def robots(tag: str) -> dict[str, Any]:
    return {
        "split": build(f"split-{tag}", model="scripted/echo"),
        "left": build(f"left-{tag}", model="scripted/text:left side"),
        "right": build(f"right-{tag}", model="scripted/text:right side"),
        "join": build(f"join-{tag}", model="scripted/echo"),
        "router": build(f"router-{tag}", model="scripted/route:tech"),
        "billing": build(f"billing-{tag}", model="scripted/text:billing"),
        "tech": build(f"tech-{tag}", model="scripted/text:tech"),
        "loop_a": build(f"loopa-{tag}", model="scripted/loop:add", local_tools=[add], max_tool_rounds=2),
        "loop_b": build(f"loopb-{tag}", model="scripted/loop:add", local_tools=[add], max_tool_rounds=2),
        "slow": build(f"slow-{tag}", model="scripted/sleep:2500"),
    }


def _summary(result: Any) -> dict[str, Any]:
    return {"run_id": result.run_id, "status": result.status, "states": result.states, "reply": result.reply,
            "activated": sorted(result.activated),
            "errors": {k: (r.error or "") for k, r in result.context.items()}}


def networks(tag: str) -> dict[str, Any]:
    r = robots(tag)
    fan = create_network(f"fan-{tag}")
    fan.task("split", r["split"])
    with fan.parallel("sides"):
        fan.task("left", r["left"], depends_on="split")
        fan.task("right", r["right"], depends_on="split")
    fan.task("join", r["join"], depends_on=["left", "right"])

    route = create_network(f"route-{tag}")
    route.task("route", r["router"], routes=["billing", "tech"])
    route.task("billing", r["billing"], depends_on="optional")
    route.task("tech", r["tech"], depends_on="optional")

    thrifty = create_network(f"budget-{tag}", config={"token_budget": 60})
    thrifty.task("a", r["split"])
    thrifty.task("b", r["join"], depends_on="a")
    thrifty.task("c", r["split"], depends_on="b")

    loopy = create_network(f"loop-{tag}")
    loopy.task("a", r["loop_a"], tools="inherit")
    loopy.task("b", r["loop_b"], depends_on="a", tools="inherit")

    out = {}
    for name, net, message in (("fan", fan, "hello"), ("route", route, "the app crashes"),
                               ("budget", thrifty, "a message long enough to use a fair share of the budget " * 2),
                               ("loop", loopy, "go")):
        handle = net.submit(message)
        result = handle.wait(timeout=60)
        out[name] = _summary(result)
        if name == "loop":
            out[name]["outputs"] = [str(e.data.get("output")) for _, e in handle.store.events()
                                    if e.event == "tool_call.completed"]
    return out


def slow(tag: str) -> dict[str, Any]:
    r = robots(tag)
    net = create_network(f"slow-{tag}")
    net.task("slow", r["slow"])
    net.task("after", r["join"], depends_on="slow")
    handle = net.submit("survive")
    print(json.dumps({"run_id": handle.run_id}), flush=True)
    return _summary(handle.wait(timeout=60))


def main() -> None:
    scenario, tag = sys.argv[1], sys.argv[2]
    if scenario == "publish":
        publish_specs([robot.to_spec() for robot in robots(tag).values()])
        out: dict[str, Any] = {"published": sorted(robot.name for robot in robots(tag).values())}
    else:
        out = {"networks": networks, "slow": slow}[scenario](tag)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
