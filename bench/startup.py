"""Start-up cost: the CLI against ``rq info``, a first run in a fresh process, a worker's readiness.

    python bench/startup.py [--repeat 5] [--url redis://...] [--peer] [--compare TREE] [--no-bytecode]

Every figure is the CPU time (user + system) of a fresh process, the median of ``--repeat``
rounds in which the commands alternate, so a change in the machine's load hits every side
alike; the load average is printed with them. One warm-up round of (a) runs first and is not
counted. Without ``--url`` / REDIS_URL a private redis-server is started on a free port (and
stopped after).

Bytecode: rq's modules are compiled once, at install; robot-lab's (a source checkout) are
compiled again by every process when ``PYTHONDONTWRITEBYTECODE`` is set, as in some sandboxes
(~0.03 s per CLI command). By default (a) drops the variable for the children, so the warm-up
writes robot-lab's ``__pycache__`` as an installed package has it (and as any user's second
command finds it); ``--no-bytecode`` keeps it (each process compiles robot-lab again). The
header says which.
``--compare TREE`` runs each robot-lab command of (a) on another checkout too (say the tree
before a change: ``git worktree add --detach /tmp/before BASE``), right after this tree's, in
the same rounds.

(a) CLI cold start: ``robot-lab status`` (a prefix with nothing under it, and one with an inbox
    holding a message, which also reads the bus and names rq queues), ``runs``, ``send`` (to an
    unknown inbox: its one-line error), ``chat`` (scripted model, embedded) and ``chat`` with a
    provider model refused by ``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0``, each beside ``rq info``
    (target: ratio <= 1.0);
    ``robot-lab --help`` beside ``python -c pass``.
(b) first run in a fresh process: import, build a robot with one tool, run it on the scripted
    model (a tool call, then the answer); CPU and peak RSS, and the modules it loaded. With
    ``--peer`` and pydantic-ai installed, the same with pydantic-ai's ``TestModel`` beside it
    (target: ratio <= 1.3x).
(c) a worker's readiness: ``robot-lab worker`` on a scripted robot and on a provider-model robot
    (litellm loads on a thread of its own), time until rq lists it, beside a plain ``rq worker``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

FIRST_RUN = r"""
import resource, sys, time
start = time.process_time()
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool

@tool
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

result = build("first", model="scripted/echo", local_tools=[add]).run("add 1 and 2", tools="inherit")
assert "add" in result.reply, result.reply
print(f"{time.process_time() - start:.4f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} {len(sys.modules)}")
"""

PEER_RUN = r"""
import resource, sys, time
start = time.process_time()
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

agent = Agent(TestModel())

@agent.tool_plain
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

result = agent.run_sync("add 1 and 2")
print(f"{time.process_time() - start:.4f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} {len(sys.modules)}")
"""


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one run of ``cmd`` and its children."""
    before = os.times()
    subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def cli_phase(url: str, repeat: int, bytecode: bool = False, compare: str | None = None) -> None:
    """(a); with ``compare`` (another checkout, e.g. the tree before a change) each robot-lab
    command also runs on that tree right after this one, in the same rounds."""
    base = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", ROBOT_LAB_ALLOW_MODEL_REQUESTS="0",
                PYTHONPATH=str(ROOT), ROBOT_LAB_KEY_PREFIX=f"bench-start-{uuid.uuid4().hex[:6]}")
    if bytecode:
        base.pop("PYTHONDONTWRITEBYTECODE", None)
    remote = dict(base, REDIS_URL=url)
    local = {k: v for k, v in base.items() if k != "REDIS_URL"}
    robot_lab = str(BIN / "robot-lab")
    one_robot = dict(remote, ROBOT_LAB_KEY_PREFIX=base["ROBOT_LAB_KEY_PREFIX"] + "-one")
    subprocess.run([robot_lab, "send", "--create", "billing", "hi"], env=one_robot, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    sides = {
        "rq info": ([str(BIN / "rq"), "info", "--url", url], remote),
        "robot-lab status": ([robot_lab, "status"], remote),
        "robot-lab status (one inbox)": ([robot_lab, "status"], one_robot),
        "robot-lab runs": ([robot_lab, "runs"], remote),
        "robot-lab send (unknown inbox)": ([robot_lab, "send", "nobody", "hi"], remote),
        "robot-lab chat (scripted)": ([robot_lab, "chat", "hi"], local),
        "robot-lab chat (provider refused)": ([robot_lab, "chat", "-m", "openai/gpt-4o-mini", "hi"], local),
        "python -c pass": ([sys.executable, "-c", "pass"], local),
        "robot-lab --help": ([robot_lab, "--help"], local),
    }
    if compare:
        for name in [n for n in sides if n.startswith("robot-lab")]:
            cmd, env = sides[name]
            sides[f"{name} [compare]"] = (cmd, dict(env, PYTHONPATH=compare))
        sides = dict(sorted(sides.items(), key=lambda kv: list(sides).index(kv[0].removesuffix(" [compare]"))))
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for name, (cmd, env) in sides.items():  # warm-up: file caches (and, with --bytecode, __pycache__)
        cpu_of(cmd, env)
    for _ in range(repeat):
        for name, (cmd, env) in sides.items():
            figures[name].append(cpu_of(cmd, env))
    med = {name: statistics.median(values) for name, values in figures.items()}
    compiled = "robot-lab compiled by each process" if base.get("PYTHONDONTWRITEBYTECODE") else "bytecode cached"
    print(f"(a) CLI cold start, CPU per command (median of {repeat}; load {os.getloadavg()[0]:.2f}; {compiled}"
          + (f"; [compare] = {compare}" if compare else "") + ")")
    for name in sides:
        ref = "python -c pass" if name.startswith("robot-lab --help") else "rq info"
        if name in (ref, "python -c pass"):
            print(f"    {name:46} {med[name]:7.3f} s")
        else:
            print(f"    {name:46} {med[name]:7.3f} s   {med[name] / med[ref]:5.2f}x {ref}")


def run_phase(repeat: int, peer: bool) -> None:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", ROBOT_LAB_ALLOW_MODEL_REQUESTS="0",
               PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    sides = {"robot-lab": FIRST_RUN}
    if peer:
        try:
            import pydantic_ai  # noqa: F401
        except ImportError:
            print("    (pydantic-ai is not installed: no peer figure)")
        else:
            sides["pydantic-ai"] = PEER_RUN
    rows: dict[str, list[tuple[float, int, int]]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, code in sides.items():
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                                 timeout=300)
            if out.returncode != 0:
                raise SystemExit(f"{name}: {out.stderr[-2000:]}")
            cpu, rss, modules = out.stdout.split()
            rows[name].append((float(cpu), int(rss), int(modules)))
    print(f"(b) first run in a fresh process: import + build + a scripted tool call (median of {repeat}; "
          f"load {os.getloadavg()[0]:.2f})")
    cpu = {}
    for name, values in rows.items():
        cpu[name] = statistics.median(v[0] for v in values)
        rss = statistics.median(v[1] for v in values) / 1024
        print(f"    {name:12} {cpu[name]:6.3f} s CPU   peak RSS {rss:5.0f} MB   {values[0][2]} modules")
    if "pydantic-ai" in cpu:
        print(f"    ratio robot-lab / pydantic-ai: {cpu['robot-lab'] / cpu['pydantic-ai']:.2f}x (target <= 1.3x)")
    else:
        print("    target: <= 0.3 s CPU")


def ready_seconds(cmd: list[str], env: dict[str, str], queue: str, url: str) -> float:
    """Seconds from start until rq lists a worker on ``queue``."""
    import redis
    from rq import Queue, Worker

    connection = redis.Redis.from_url(url)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        while time.monotonic() - started < 180:
            if Worker.all(queue=Queue(queue, connection=connection)):
                return time.monotonic() - started
            time.sleep(0.05)
        raise SystemExit(f"{cmd}: not ready within 180 s")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
        for worker in Worker.all(queue=Queue(queue, connection=connection)):
            worker.register_death()


def worker_phase(url: str, repeat: int) -> None:
    sys.path.insert(0, str(ROOT))
    from robot_lab.runtime.registry import publish_specs
    from robot_lab.connection import connect
    from robot_lab.keys import Keys
    from robot_lab.runtime.robot import build

    prefix = f"bench-start-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix, LITELLM_LOCAL_MODEL_COST_MAP="True",
               ROBOT_LAB_ALLOW_MODEL_REQUESTS="0", PYTHONPATH=str(ROOT), ROBOT_LAB_LOG_LEVEL="WARNING")
    client = connect(url)
    scripted = build(f"start-{uuid.uuid4().hex[:6]}", model="scripted/echo")
    provider = build(f"start-{uuid.uuid4().hex[:6]}", model="openai/gpt-4o-mini")
    publish_specs([scripted.to_spec(), provider.to_spec()], connection=client, keys=Keys(prefix=prefix))
    plain_queue = f"bench-plain-{uuid.uuid4().hex[:6]}"
    sides = {
        "rq worker (plain)": ([str(BIN / "rq"), "worker", plain_queue, "--url", url], plain_queue),
        "robot-lab worker (scripted)": ([str(BIN / "robot-lab"), "worker", scripted.name], f"robot:{scripted.name}"),
        "robot-lab worker (provider)": ([str(BIN / "robot-lab"), "worker", provider.name], f"robot:{provider.name}"),
    }
    figures: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, (cmd, queue) in sides.items():
            figures[name].append(ready_seconds(cmd, env, queue, url))
    print(f"(c) worker ready (rq lists it), wall seconds (median of {repeat}; load {os.getloadavg()[0]:.2f})")
    ref = statistics.median(figures["rq worker (plain)"])
    for name, values in figures.items():
        value = statistics.median(values)
        print(f"    {name:30} {value:6.2f} s   {value / ref:5.2f}x rq worker")
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--peer", action="store_true", help="also pydantic-ai's first run, if it is installed")
    parser.add_argument("--skip-workers", action="store_true", help="leave out (c)")
    parser.add_argument("--compare", metavar="TREE", default=None,
                        help="also run (a)'s robot-lab commands on this checkout, interleaved (before/after)")
    parser.add_argument("--bytecode", action=argparse.BooleanOptionalAction, default=True,
                        help="(a) without PYTHONDONTWRITEBYTECODE: robot-lab's bytecode cached, as rq's is "
                             "(default); --no-bytecode: every process compiles robot-lab again")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.redis_server import RedisServer  # the suite's private server (a free port, no disk)

    server = RedisServer()
    url = server.bench_url(args.url)
    try:
        cli_phase(url, args.repeat, args.bytecode, args.compare)
        run_phase(args.repeat, args.peer)
        if not args.skip_workers:
            worker_phase(url, max(1, args.repeat // 2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
