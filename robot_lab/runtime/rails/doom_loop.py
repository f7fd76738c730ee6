"""Doom-loop detection: notice a model calling the same tool(s) over and over.

A doom loop is either identical consecutive calls (A, A, A) or a repeating multi-step
pattern (A, B, C, A, B, C, A, B, C). robot_lab never raises on one: the warning is appended
to the tool result so the model reads it on its next turn and can change course, and the
detector resets after warning. (The fatal limit is ``max_tool_rounds``, not this.)

Two detectors with the same semantics:

* :class:`DoomLoopDetector` keeps the sequence in process (one robot run), exactly as
  robot_lab does.
* :class:`RedisDoomLoopDetector` keeps the sequence of a whole network run in Redis (a capped
  list per run, ``Keys.tool_calls(run_id)``), so a loop that bounces between robots running
  in different worker processes is detected too.

How the Robot uses either (see docs/safety.md)::

    result = tool.call(args)
    warning = detector.observe(tool_name)      # track + check + reset-after-warning
    if warning:
        result = with_warning(result, warning)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from robot_lab.keys import default_keys
from robot_lab.logging import get_logger

DEFAULT_THRESHOLD = 3
MAX_PERIOD = 10
WARNING_KEY = "_doom_loop_warning"

_log = get_logger("robot_lab.doom_loop")


def _check_threshold(threshold: int) -> int:
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
        raise ValueError(f"doom_loop_threshold must be a positive integer, got {threshold!r}")
    return threshold


def detect_period(sequence: Sequence[str], threshold: int = DEFAULT_THRESHOLD) -> int | None:
    """The period of the loop at the end of ``sequence`` (1 = the same tool repeated), or
    None when there is no loop. Shorter periods win, as in robot_lab."""
    n = len(sequence)
    if n < threshold:
        return None
    tail = sequence[n - threshold :]
    if all(name == tail[0] for name in tail):
        return 1
    for period in range(2, min(MAX_PERIOD, n // threshold) + 1):
        window = threshold * period
        chunk = list(sequence[n - window :])
        if chunk == chunk[:period] * threshold:
            return period
    return None


def warning_for(sequence: Sequence[str], threshold: int = DEFAULT_THRESHOLD) -> str:
    """The Ruby gem's warning text for the loop at the end of ``sequence`` ("" when empty).

    Like robot_lab, a sequence with no detectable cycle is described as a consecutive
    repeat of its last tool.
    """
    if not sequence:
        return ""
    period = detect_period(sequence, threshold) or 1
    if period == 1:
        return (
            f"Tool '{sequence[-1]}' has been called {threshold}+ times consecutively with "
            "no progress. You appear to be stuck in a loop. Try a fundamentally "
            "different approach, use a different tool, or ask for clarification."
        )
    pattern = " → ".join(sequence[len(sequence) - period :])
    return (
        f"Tool call pattern [{pattern}] has repeated {threshold}+ times. "
        "You appear to be stuck in a loop. Try a fundamentally different "
        "approach, use a different tool, or ask for clarification."
    )


def with_warning(result: Any, warning: str) -> Any:
    """Attach ``warning`` to a tool result the way robot_lab does: a string gets
    ``"\\n\\n⚠️ <warning>"`` appended, a dict gets a ``_doom_loop_warning`` key (a copy is
    returned), anything else is returned unchanged."""
    if not warning:
        return result
    if isinstance(result, str):
        return f"{result}\n\n⚠️ {warning}"
    if isinstance(result, dict):
        return {**result, WARNING_KEY: warning}
    return result


class DoomLoopDetector:
    """In-process detector for one robot run (the Ruby gem's ``DoomLoopDetector``)."""

    DEFAULT_THRESHOLD = DEFAULT_THRESHOLD
    MAX_PERIOD = MAX_PERIOD

    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.threshold = _check_threshold(threshold)
        self._sequence: list[str] = []

    @property
    def sequence(self) -> list[str]:
        """The tool names tracked since the last reset (a copy)."""
        return list(self._sequence)

    def track(self, tool_name: str) -> None:
        self._sequence.append(str(tool_name))

    def reset(self) -> None:
        self._sequence = []

    def doom_loop(self) -> bool:
        """True when the tracked calls end in a loop (the Ruby gem's ``doom_loop?``)."""
        return detect_period(self._sequence, self.threshold) is not None

    def warning_message(self) -> str:
        return warning_for(self._sequence, self.threshold)

    def observe(self, tool_name: str) -> str | None:
        """Track a call; on a loop, return the warning and reset (the Robot's one call)."""
        self.track(tool_name)
        if not self.doom_loop():
            return None
        warning = self.warning_message()
        _log.warning("doom_loop.detected", tool=str(tool_name), warning=warning)
        self.reset()
        return warning


class RedisDoomLoopDetector:
    """The same detector over a Redis list shared by every robot of one run.

    ``track`` is ``RPUSH`` + ``LTRIM`` to the last ``threshold * MAX_PERIOD`` names (all a
    loop can span) + ``EXPIRE``, in one MULTI. :meth:`observe` does track-and-read in one
    round trip. Two robots hitting the loop at the same moment may both be warned; that is
    harmless (the warning is advice, never an error).
    """

    DEFAULT_THRESHOLD = DEFAULT_THRESHOLD
    MAX_PERIOD = MAX_PERIOD

    def __init__(
        self,
        run_id: str,
        *,
        redis: Any = None,
        keys: Any = None,
        threshold: int = DEFAULT_THRESHOLD,
        ttl: int = 86_400,
    ) -> None:
        from robot_lab.connection import get_redis  # lazy: start-up time

        if not run_id:
            raise ValueError("RedisDoomLoopDetector needs a run_id")
        self.run_id = str(run_id)
        self.threshold = _check_threshold(threshold)
        self.ttl = int(ttl)
        self.redis = redis if redis is not None else get_redis()
        self.key = (keys or default_keys()).tool_calls(self.run_id)
        self.maxlen = self.threshold * MAX_PERIOD

    @property
    def sequence(self) -> list[str]:
        return [_text(item) for item in self.redis.lrange(self.key, 0, -1)]

    def _push(self, pipe: Any, tool_name: str) -> None:
        pipe.rpush(self.key, str(tool_name))
        pipe.ltrim(self.key, -self.maxlen, -1)
        if self.ttl > 0:
            pipe.expire(self.key, self.ttl)

    def track(self, tool_name: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        self._push(pipe, tool_name)
        pipe.execute()

    def reset(self) -> None:
        self.redis.delete(self.key)

    def doom_loop(self) -> bool:
        return detect_period(self.sequence, self.threshold) is not None

    def warning_message(self) -> str:
        return warning_for(self.sequence, self.threshold)

    def observe(self, tool_name: str) -> str | None:
        pipe = self.redis.pipeline(transaction=True)
        self._push(pipe, tool_name)
        pipe.lrange(self.key, 0, -1)
        sequence = [_text(item) for item in pipe.execute()[-1]]
        if detect_period(sequence, self.threshold) is None:
            return None
        warning = warning_for(sequence, self.threshold)
        _log.warning("doom_loop.detected", tool=str(tool_name), run_id=self.run_id, warning=warning)
        self.reset()
        return warning


def _text(item: Any) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)


__all__ = [
    "DEFAULT_THRESHOLD",
    "MAX_PERIOD",
    "DoomLoopDetector",
    "RedisDoomLoopDetector",
    "detect_period",
    "warning_for",
    "with_warning",
]
