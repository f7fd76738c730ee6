"""Budgets and the circuit breaker: a robot's own token budget, a budget shared by every
robot of a tenant (in Redis, so every worker process draws from it), and max_tool_rounds
stopping a model that calls tools forever.

    python examples/10_budgets.py
"""

import robot_lab
from robot_lab.errors import InferenceError

OFFLINE = robot_lab.get_settings().default_model().startswith("scripted/")
model = "scripted/echo" if OFFLINE else None

# 1. A robot's own budget: each model call reserves what is left and reconciles the usage.
frugal = robot_lab.build(name="frugal10", model=model, token_budget=60)
for attempt in range(1, 6):
    try:
        frugal.run("Tell me about budgets " * 3)
        print(f"run {attempt}: ok, {frugal.total_input_tokens + frugal.total_output_tokens} tokens used so far")
    except (robot_lab.BudgetExceeded, InferenceError) as exc:
        print(f"run {attempt}: refused -- {type(exc).__name__}: {exc}")
        break

# 2. A shared, dated tenant budget: two robots draw from one Redis hash.
tenant = robot_lab.RedisLedger("tenant:acme:2026-11-30", {"tokens": 50}, ttl=86_400)
writer = robot_lab.build(name="writer10", model=model)
editor = robot_lab.build(name="editor10", model=model)
for robot in (writer, editor, writer, editor):
    try:
        robot.run("Draft a two line note", budgets=[tenant])
        print(f"{robot.name}: ok, tenant has {tenant.remaining('tokens'):.0f} tokens left")
    except (robot_lab.BudgetExceeded, InferenceError) as exc:
        print(f"{robot.name}: refused -- {exc}")
        break


# 3. The circuit breaker: a model stuck in a tool loop is stopped after max_tool_rounds.
def lookup(term: str) -> str:
    """Look a term up."""
    return f"{term}: see {term}"


stuck = robot_lab.build(name="stuck10", model="scripted/loop:lookup", local_tools=[lookup], max_tool_rounds=4)
try:
    stuck.run("define recursion", tools="inherit")
except robot_lab.ToolLoopError as exc:
    print(f"circuit breaker: {exc}")
