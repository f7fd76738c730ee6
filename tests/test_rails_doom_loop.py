"""DoomLoopDetector (in process) and RedisDoomLoopDetector (shared by processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from robot_lab.keys import Keys
from robot_lab.runtime.rails.doom_loop import (
    DoomLoopDetector,
    RedisDoomLoopDetector,
    detect_period,
    warning_for,
    with_warning,
)

CONSECUTIVE = (
    "Tool 'search' has been called 3+ times consecutively with no progress. You appear to be "
    "stuck in a loop. Try a fundamentally different approach, use a different tool, or ask for "
    "clarification."
)
CYCLIC = (
    "Tool call pattern [a → b] has repeated 3+ times. You appear to be stuck in a loop. Try a "
    "fundamentally different approach, use a different tool, or ask for clarification."
)


def test_consecutive_loop_at_threshold() -> None:
    d = DoomLoopDetector()
    assert d.threshold == 3
    d.track("search")
    d.track("search")
    assert not d.doom_loop()
    d.track("search")
    assert d.doom_loop()
    assert d.warning_message() == CONSECUTIVE
    assert d.sequence == ["search"] * 3


def test_cyclic_loop_and_warning_text() -> None:
    d = DoomLoopDetector()
    for name in ["a", "b", "a", "b", "a"]:
        d.track(name)
        assert not d.doom_loop()
    d.track("b")
    assert d.doom_loop()
    assert d.warning_message() == CYCLIC


def test_period_three_and_longest_period_ten() -> None:
    assert detect_period(list("abcabcabc")) == 3
    pattern = [f"t{i}" for i in range(10)]
    assert detect_period(pattern * 3) == 10
    pattern11 = [f"t{i}" for i in range(11)]
    assert detect_period(pattern11 * 3) is None  # beyond MAX_PERIOD
    assert detect_period(list("abcabcab")) is None
    assert detect_period(["x", "a", "b", "a", "b", "a", "b"]) == 2


def test_threshold_is_configurable() -> None:
    d = DoomLoopDetector(threshold=4)
    for _ in range(3):
        d.track("x")
    assert not d.doom_loop()
    d.track("x")
    assert d.doom_loop()
    assert "4+ times consecutively" in d.warning_message()
    with pytest.raises(ValueError, match="doom_loop_threshold"):
        DoomLoopDetector(threshold=0)


def test_reset_and_empty_warning() -> None:
    d = DoomLoopDetector()
    assert d.warning_message() == ""
    for _ in range(3):
        d.track("x")
    d.reset()
    assert d.sequence == []
    assert not d.doom_loop()


def test_non_loop_warning_describes_last_tool_like_robot_lab() -> None:
    assert warning_for(["a", "b", "c"]).startswith("Tool 'c' has been called 3+ times")


def test_observe_warns_once_then_resets() -> None:
    d = DoomLoopDetector()
    assert d.observe("s") is None
    assert d.observe("s") is None
    assert d.observe("s") == CONSECUTIVE.replace("search", "s")
    assert d.sequence == []
    assert d.observe("s") is None


def test_with_warning_string_dict_other() -> None:
    assert with_warning("42", "stop") == "42\n\n⚠️ stop"
    original = {"ok": True}
    assert with_warning(original, "stop") == {"ok": True, "_doom_loop_warning": "stop"}
    assert original == {"ok": True}
    assert with_warning(7, "stop") == 7
    assert with_warning("x", "") == "x"


def test_redis_detector_same_semantics(redis_client, key_prefix: str) -> None:
    keys = Keys(prefix=key_prefix)
    d = RedisDoomLoopDetector("run-1", redis=redis_client, keys=keys)
    assert d.key == f"{key_prefix}:run:run-1:tool_calls"
    assert d.observe("a") is None
    assert d.observe("b") is None
    for name in ["a", "b", "a"]:
        assert d.observe(name) is None
    assert d.observe("b") == CYCLIC
    assert d.sequence == []  # reset after warning
    assert redis_client.exists(d.key) == 0


def test_redis_detector_shared_by_two_robots(redis_client, key_prefix: str) -> None:
    """Robot A and robot B of one run call tools alternately: the loop spans both."""
    keys = Keys(prefix=key_prefix)
    robot_a = RedisDoomLoopDetector("run-2", redis=redis_client, keys=keys)
    robot_b = RedisDoomLoopDetector("run-2", redis=redis_client, keys=keys)
    other_run = RedisDoomLoopDetector("run-3", redis=redis_client, keys=keys)
    assert robot_a.observe("ask_b") is None
    assert robot_b.observe("ask_a") is None
    assert other_run.observe("ask_b") is None
    assert robot_a.observe("ask_b") is None
    assert robot_b.observe("ask_a") is None
    assert robot_a.observe("ask_b") is None
    warning = robot_b.observe("ask_a")
    assert warning is not None and "[ask_b → ask_a]" in warning
    assert other_run.sequence == ["ask_b"]


def test_redis_detector_list_is_capped_and_expires(redis_client, key_prefix: str) -> None:
    d = RedisDoomLoopDetector("run-4", redis=redis_client, keys=Keys(prefix=key_prefix), ttl=120)
    for i in range(100):
        d.track(f"tool{i}")
    assert redis_client.llen(d.key) == 3 * 10
    assert d.sequence[-1] == "tool99"
    assert 0 < redis_client.ttl(d.key) <= 120
    assert not d.doom_loop()


def test_redis_detector_across_processes(real_redis_url: str, key_prefix: str) -> None:
    """Two real worker processes each track one side of a ping-pong; the second sees the loop."""
    import redis

    client = redis.Redis.from_url(real_redis_url)
    script = textwrap.dedent(
        """
        import sys, redis
        from robot_lab.keys import Keys
        from robot_lab.runtime.rails.doom_loop import RedisDoomLoopDetector
        url, prefix, name = sys.argv[1:4]
        d = RedisDoomLoopDetector("shared-run", redis=redis.Redis.from_url(url), keys=Keys(prefix=prefix))
        print(d.observe(name) or "none")
        """
    )
    outputs = []
    try:
        for name in ["ping", "pong", "ping", "pong", "ping", "pong"]:
            proc = subprocess.run(
                [sys.executable, "-c", script, real_redis_url, key_prefix, name],
                capture_output=True, text=True, timeout=60, check=True,
            )
            outputs.append(proc.stdout.strip())
        assert outputs[:5] == ["none"] * 5
        assert "Tool call pattern [ping → pong] has repeated 3+ times." in outputs[5]
    finally:
        for key in client.scan_iter(match=f"{key_prefix}*"):
            client.delete(key)
        client.close()


def test_redis_detector_defaults_to_configured_redis_and_prefix(redis_client, key_prefix: str) -> None:
    d = RedisDoomLoopDetector("run-defaults")
    assert d.key == f"{key_prefix}:run:run-defaults:tool_calls"
    d.track("x")
    assert redis_client.lrange(d.key, 0, -1) == [b"x"]
