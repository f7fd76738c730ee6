"""Conversation history of a robot: search, compression with the ``compaction`` hooks,
and the automatic compaction (``auto_compact``) checked before each run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from robot_lab.llm.gateway import litellm_module
from robot_lab.logging import get_logger
from robot_lab.runtime.rails.hooks import CompactionHookContext, call_point_hook, hook_scope, run_hooks

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts

log = get_logger("robot_lab.robot")


def compress(
    robot: RobotParts,
    recent_turns: int = 3,
    keep_threshold: float = 0.6,
    drop_threshold: float = 0.2,
    summarizer: Callable[[str], str] | None = None,
    *,
    strategy: str = "custom",
) -> None:
    """Drop or summarize old turns that drifted from the recent conversation; an
    ``on_compaction`` hook may supply the result itself."""
    from robot_lab.runtime.history import compress_history  # lazy: start-up time

    ctx = CompactionHookContext(robot=robot, messages_before=tuple(robot.messages), config=robot.config, strategy=strategy)

    def core() -> list[dict[str, Any]]:
        call_point_hook("on_compaction", ctx)
        if ctx.compacted_messages is None:
            ctx.compacted_messages = compress_history(
                robot.messages, recent_turns=recent_turns, keep_threshold=keep_threshold,
                drop_threshold=drop_threshold, summarizer=summarizer,
            )
        return ctx.compacted_messages

    with hook_scope(robot.hooks):
        robot.messages = list(run_hooks("compaction", ctx, core))


def may_block(robot: RobotParts) -> bool:
    """Whether :func:`maybe_compact` does any work (a user's callable, token counting, a
    summary): ``arun`` then runs it in a thread; with ``auto_compact`` off it returns at once."""
    return robot.config.auto_compact not in (None, "none")


def maybe_compact(robot: RobotParts) -> None:
    """``auto_compact``: None/"none" off, a callable called with the robot, or
    ``context_window`` (compress when the history nears the model's window)."""
    mode = robot.config.auto_compact
    if not may_block(robot):
        return
    if callable(mode):
        mode(robot)
        return
    if mode != "context_window":
        log.warning("auto_compact.unknown_mode", robot=robot.name, mode=str(mode))
        return
    from robot_lab.runtime.history import should_compact  # lazy: start-up time

    if should_compact(robot.messages, context_window=context_window(robot.model), threshold=robot.config.compact_threshold):
        robot.compress_history(strategy="context_window")


def context_window(model: str) -> int | None:
    """The model's input window from litellm's model table (None when unknown)."""
    if model.startswith("scripted"):
        return None
    try:
        info = litellm_module().get_model_info(model)
        return int(info.get("max_input_tokens") or info.get("max_tokens") or 0) or None
    except Exception:
        return None
