"""A robot and a memory dropped after use are freed by reference counting, not left for the
cyclic GC: a worker builds a Robot and two Memory objects per network task, and garbage in
reference cycles made every collection of a busy worker walk them (issue 30). Each test
runs with the collector off, so only reference counting can free the object."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from robot_lab.memory.store import Memory
from robot_lab.memory.writer import writing_as
from robot_lab.runtime.robot import build


@pytest.fixture
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_a_robot_after_its_run_is_freed_at_once(no_gc: None) -> None:
    robot = build("freed-bot", model="scripted/echo")
    robot.run("hi")
    assert robot.learnings == []  # the Learning still reaches its robot while the robot lives
    gone = weakref.ref(robot)
    del robot
    assert gone() is None


def test_a_memory_is_freed_at_once_and_still_attributes_writes(redis_client: Any, no_gc: None) -> None:
    # The server's first EVALSHA of a script fails (NOSCRIPT) and is retried; that
    # exception's traceback is a cycle through the caller's frames, once per script.
    Memory("freed:warm", redis=redis_client).set("k", 0)
    memory = Memory("freed:scope", redis=redis_client, writer="alice")
    memory.set("k", 1)
    memory.current_writer = "bob"
    memory.set("k", 2)
    with writing_as("carol"):
        memory.set("k", 3)
    assert [c.writer for c in memory.changes(since_version=0)] == ["alice", "bob", "carol"]
    assert memory._writer == "bob"  # the memory's own, under no override
    memory.close()
    gone = weakref.ref(memory)
    del memory
    assert gone() is None
