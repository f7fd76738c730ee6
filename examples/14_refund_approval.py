"""A robot that stops to ask a person, and waits without holding a worker.

The refund desk (examples/refund_desk.py) asks which order to refund, then needs a person's
approval before its ``refund`` tool runs. As a network task it *parks* at each question: the
task is ``waiting``, the worker is free, and the answer may come from any process.

    # with a Redis: the example starts a worker process, answers with the CLI from other
    # processes, and resumes the run on a second worker after stopping the first
    REDIS_URL=redis://localhost:6379/0 python examples/14_refund_approval.py

Without REDIS_URL it runs the same story in this process (embedded Redis, worker threads),
answering through ``RunHandle.answer``.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # refund_desk, for this process

from refund_desk import desk, payments_key  # noqa: E402

from robot_lab.connection import get_redis  # noqa: E402
from robot_lab.logging import configure_logging  # noqa: E402
from robot_lab.network.coordinator import Coordinator, is_embedded  # noqa: E402
from robot_lab.network.dsl import create_network  # noqa: E402

configure_logging(level="WARNING", force=True)
robot = desk()
network = create_network("refunds")
network.task("desk", robot, tools="inherit")
coordinator = Coordinator()
redis = get_redis()


def parked(handle, kind):
    for _ in range(600):
        found = [r for r in handle.pending() if r.request.get("kind") == kind]
        if found:
            return found[0]
        time.sleep(0.05)
    raise SystemExit(f"the run never asked a {kind}")


if is_embedded(coordinator.connection):
    from robot_lab.network.embedded import EmbeddedWorkers

    with EmbeddedWorkers(coordinator.connection, [robot.name], threads=2):
        handle = coordinator.submit(network, "Please refund my last order")
        question = parked(handle, "question")
        print(f"robot asks: {question.question} {question.request['choices']}  (task {handle.states()['desk']})")
        handle.answer("2", by="alice")
        approval = parked(handle, "approval")
        print(f"robot wants to call {approval.request['tool']}({approval.request['arguments']}): approve?")
        handle.answer(approve=True, by="bob")
        result = handle.wait(timeout=60)
else:
    from robot_lab.runtime.registry import publish_specs

    publish_specs([robot.to_spec()], connection=redis)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
           "ROBOT_LAB_LOG_LEVEL": "WARNING"}
    cli = [sys.executable, "-m", "robot_lab"]
    first = subprocess.Popen([*cli, "worker", robot.name, "--no-bus"], env=env)
    try:
        handle = coordinator.submit(network, "Please refund my last order")
        question = parked(handle, "question")
        print(f"robot asks: {question.question} {question.request['choices']}  (task {handle.states()['desk']})")
        subprocess.run([*cli, "answer", handle.run_id, "2", "--by", "alice"], env=env, check=True)
        approval = parked(handle, "approval")
        print(f"robot wants to call {approval.request['tool']}({approval.request['arguments']}): approve?")
        first.terminate()  # the parked run holds nothing on this worker: stop it, start another
        first.wait(30)
        first = subprocess.Popen([*cli, "worker", robot.name, "--no-bus"], env=env)
        subprocess.run([*cli, "answer", handle.run_id, "--approve", "--by", "bob"], env=env, check=True)
        result = handle.wait(timeout=120)
    finally:
        first.terminate()
        first.wait(30)

payments = [p.decode() for p in redis.lrange(payments_key(), 0, -1)]
by = [e.data.get("by") for e in handle.events() if e.event == "hitl.resolved"]
print(result.reply)
print(f"payments made: {payments}; answered by {by}")
redis.delete(payments_key())
