"""A robot and a memory dropped after use are freed by reference counting, not left for the
cyclic GC: a worker builds a Robot and two Memory objects per network task, and garbage in
reference cycles made every collection of a busy worker walk them. Each test
runs with the collector off, so only reference counting can free the object."""

from __future__ import annotations

import gc
import uuid
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


def test_random_bytes_are_fresh_and_a_forked_child_does_not_repeat_its_parents() -> None:
    """Ids' random bytes come from one buffer (a system call per 4 KiB, not per id): every
    draw is new, and a child forked with a half-used buffer draws its own."""
    import os

    from robot_lab.randomness import random_bytes
    from robot_lab.schemas.ids import new_id

    draws = [random_bytes(8) for _ in range(2000)]  # crosses refills
    assert len(set(draws)) == len(draws) and all(len(d) == 8 for d in draws)
    assert len(random_bytes(10_000)) == 10_000
    assert len({new_id() for _ in range(5000)}) == 5000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next bytes, to the parent
        os.close(read)
        os.write(write, random_bytes(16))
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child != random_bytes(16)


def test_a_network_task_job_leaves_no_garbage_cycle_in_the_in_flight_worker(real_client: Any, no_gc: None) -> None:
    """The lean lifecycle's objects of a task job (the rq job, its execution, the records that
    ride with its claim and result) are freed by reference counting once the job ends."""
    from rq import Queue

    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.workers.inflight import in_flight_worker_class

    client = real_client  # (fakeredis answers rq's INFO with an error: a traceback cycle per dequeue)
    bot = build(f"cycle-free-{uuid.uuid4().hex[:6]}", model="scripted/echo")
    queue = Queue(f"robot:{bot.name}", connection=client, serializer=JobSerializer)

    def fan_out() -> str:
        net = create_network("cycle-free")
        with net.parallel("fan"):
            for i in range(4):
                net.task(f"t{i}", bot)
        handle = Coordinator(connection=client).submit(net, "hi")
        worker = in_flight_worker_class()([queue], connection=client, serializer=JobSerializer, in_flight=4)
        worker.work(burst=True, logging_level="WARNING")
        queue.delete(delete_jobs=True)
        return handle.status

    # a server's first use of each script fails (NOSCRIPT) and is retried: that exception's
    # traceback is a cycle through its caller's frames, once per script and server
    assert fan_out() == "completed"
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert fan_out() == "completed"
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    left = kinds & {"RobotLabJob", "Execution", "FinishWrites", "DeferredWrites", "Robot", "Memory"}
    assert not left, left


def test_compiling_a_network_leaves_no_garbage_cycle(no_gc: None) -> None:
    """Every process compiles each run's graph once (robot_lab/network/graphs.py); its
    recursive helpers (cycle check, levels) were closures that referenced themselves, so each
    compile left ~2 objects a task for the collector (a 5000-task fan-out: ~10,000)."""
    import msgspec

    from robot_lab.network.dag import compile_network
    from robot_lab.network.dsl import create_network
    from robot_lab.network.graphs import load_network_spec

    bot = build(f"compiled-{uuid.uuid4().hex[:6]}", model="scripted/echo")
    net = create_network("compiled")
    with net.parallel("fan"):
        for i in range(50):
            net.task(f"t{i}", bot)
    net.task("join", bot, depends_on=[f"t{i}" for i in range(50)])
    raw = msgspec.json.encode(net.spec)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        graph = compile_network(load_network_spec(raw))
        assert graph.levels[-1] == ["join"]
        del graph
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []
