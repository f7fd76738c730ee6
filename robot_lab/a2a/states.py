"""The one place where robot-lab states become A2A task states.

A robot task's state comes from its bus reply (none yet: working; a reply: completed; an
error envelope: failed), a network task's from its run record's status. A run that parks
waiting for a human answer (the human-input feature) is A2A's ``input-required``: its status
names are listed in :data:`INPUT_STATUSES`, and :func:`task_state_for` is the seam that maps
them, so the rest of the tier only asks "is this interrupted?" (:func:`is_interrupted`).
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import TaskState

# robot-lab status -> A2A TaskState
_STATES: dict[str, int] = {
    "submitted": TaskState.TASK_STATE_SUBMITTED,
    "working": TaskState.TASK_STATE_WORKING,
    "running": TaskState.TASK_STATE_WORKING,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "done": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "error": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
    "canceled": TaskState.TASK_STATE_CANCELED,
    "rejected": TaskState.TASK_STATE_REJECTED,
}

# Run / conversation statuses that mean "parked until a human answers". The human-input
# feature names its parked status here; a message on such a task is then its answer.
INPUT_STATUSES: frozenset[str] = frozenset({"input_required", "waiting_for_input", "waiting"})

TERMINAL: frozenset[int] = frozenset({
    TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
})
INTERRUPTED: frozenset[int] = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})


def task_state_for(status: str) -> int:
    """The A2A TaskState of a robot-lab run or conversation status (unknown: working)."""
    if status in INPUT_STATUSES:
        return TaskState.TASK_STATE_INPUT_REQUIRED
    return _STATES.get(status, TaskState.TASK_STATE_WORKING)


def is_terminal(state: int) -> bool:
    return state in TERMINAL


def is_interrupted(state: int) -> bool:
    return state in INTERRUPTED
