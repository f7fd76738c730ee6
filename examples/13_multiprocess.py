"""Many processes: the support-desk network (robot_lab.demo) on worker processes started from
the Procfile, one process per robot, all talking through one Redis.

    # terminal 1: a Redis with AOF, and the workers
    redis-server --appendonly yes --appendfsync everysec
    REDIS_URL=redis://localhost:6379/0 honcho start          # Procfile at the repository root
    # terminal 2: submit runs and look at the system
    REDIS_URL=redis://localhost:6379/0 python examples/13_multiprocess.py
    REDIS_URL=redis://localhost:6379/0 robot-lab status       # queues, workers, bus lag, DLQ
    REDIS_URL=redis://localhost:6379/0 robot-lab runs         # recent runs, tokens, cost

Without REDIS_URL it prints these steps and runs the same network in this process (embedded
Redis, worker threads), so it works anywhere.
"""

import sys
import time

from robot_lab import demo
from robot_lab.logging import configure_logging
from robot_lab.network.coordinator import Coordinator, is_embedded

configure_logging(level="WARNING", force=True)
MESSAGES = demo.SAMPLE_MESSAGES

coordinator = Coordinator()
if is_embedded(coordinator.connection):
    print(__doc__.split("Without REDIS_URL")[0].strip())
    print("\nREDIS_URL is not set: running the network here instead (embedded Redis, worker threads).")
    demo.register_scripts(0)
    try:
        for message in MESSAGES:
            result = demo.support.run(message)
            print(f"- {message[:45]!r}: routed to {sorted(result.activated)}, {result.status}")
    finally:
        demo.register_scripts()
else:
    from rq import Queue, Worker

    robots = sorted({t.robot for t in demo.support.spec.tasks})
    idle = [r for r in robots if not Worker.all(queue=Queue(f"robot:{r}", connection=coordinator.connection))]
    if idle:
        print(f"no worker serves {idle}: start them with `honcho start` (Procfile)", file=sys.stderr)
        sys.exit(1)
    started = time.monotonic()
    handles = [coordinator.submit(demo.support, message) for message in MESSAGES]  # all at once
    print(f"submitted {len(handles)} runs; workers: {robots}")
    for message, handle in zip(MESSAGES, handles):
        result = handle.wait(timeout=120)
        workers = {e.data.get("worker") for e in handle.events() if e.event == "task.started"}
        print(f"- {message[:45]!r}: {result.status}, routed to {sorted(result.activated)}, "
              f"{len(workers)} worker processes")
    print(f"{len(handles)} runs in {time.monotonic() - started:.1f}s")
