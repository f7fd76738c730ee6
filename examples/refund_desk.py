"""The refund desk of examples/14_refund_approval.py: a robot that asks which order, then
refunds it only after a person approved the call. Importable by path, so worker processes
build the same robot (``refund_desk:refund`` on ``PYTHONPATH=examples``).

The refund "pays" by appending to a Redis list, keyed by ``current_step().idempotency_key``:
a payment API would take that key to refuse a second refund of the same step.
"""

from robot_lab import AskUser, build, current_step, tool
from robot_lab.connection import get_redis
from robot_lab.keys import default_keys
from robot_lab.llm.scripted import register_script

register_script("refund-desk", {"turns": [
    {"tool_calls": [{"name": "ask_user", "arguments": {
        "question": "Which order should I refund?", "choices": ["A-1001", "B-2002"]}}]},
    {"tool_calls": [{"name": "refund", "arguments": {"order": "B-2002", "amount": 42}}]},
    {"reply": "Done. {tool_results}"},
]})


def payments_key() -> str:
    return f"{default_keys().prefix}:example:payments"


@tool(requires_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order (a person approves each refund first).

    Args:
        order: the order id
        amount: euros to refund
    """
    key = current_step().idempotency_key
    if get_redis().set(f"{payments_key()}:{key}", "1", nx=True, ex=86_400):  # once per step, ever
        get_redis().rpush(payments_key(), f"{order}:{amount}")
    return f"refunded {amount} EUR on {order}"


def desk():
    return build("refund-desk", model="scripted/refund-desk", local_tools=[AskUser, refund],
                 system_prompt="You refund orders. Ask when unsure.")
