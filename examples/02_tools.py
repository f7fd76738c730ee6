"""A robot with two Python-function tools and a circuit breaker (robot_lab examples 02/06).

    python examples/02_tools.py

Offline (no API key) the robot runs on the scripted model ``scripted/echo``. It does not read
the question: it calls every offered tool once with placeholder arguments built from the
tool's JSON schema ("a" for a string, 0 for an integer), which is why the output shows
``order_status({'order_id': 'a'})``. With a real model (``OPENAI_API_KEY`` and, say,
``ROBOT_LAB_MODEL=openai/gpt-4o-mini``) the model reads "A-1001" from the question instead.
"""

import robot_lab


def order_status(order_id: str) -> dict:
    """Look up the shipping status of an order.

    Args:
        order_id: the order number, e.g. "A-1001"
    """
    return {"order_id": order_id, "status": "shipped", "carrier": "DHL"}


def refund_amount(order_id: str, percent: int = 100) -> float:
    """How much a refund of the given percentage would pay back."""
    return round(49.90 * percent / 100, 2)


clerk = robot_lab.build(
    name="clerk",
    system_prompt="You answer questions about orders using your tools.",
    local_tools=[order_status, refund_amount],
    max_tool_rounds=6,
)
result = clerk.run("Where is order A-1001 and what would a full refund be?", tools="inherit")
for call in result.tool_calls:
    print(f"tool {call.tool.name}({call.tool.input}) -> {call.data or call.error}")
print(result.reply)

# The circuit breaker: a model that calls a tool forever is stopped.
looping = robot_lab.build(name="stuck", model="scripted/loop:order_status", local_tools=[order_status], max_tool_rounds=3)
try:
    looping.run("go", tools="inherit")
except robot_lab.ToolLoopError as exc:
    print(f"stopped: {exc}")
looping.clear_messages()  # reusable afterwards
