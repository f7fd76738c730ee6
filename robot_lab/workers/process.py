"""``robot-lab worker``: rq workers on ``robot:<name>`` queues, each robot's bus poller and
the lost-work sweeper, in one command.

Layout of one ``robot-lab worker billing technical --concurrency 2`` process tree:

* the main process: one BusPoller thread per robot (inbox ``robot_lab:bus:<robot>``), the
  sweeper thread, and -- with ``--concurrency 1`` -- the rq worker itself;
* with ``--concurrency N > 1``: N child processes, each one rq ``SimpleWorker`` on all the
  queues (forked after litellm and the app are imported, so a job pays no import time).

SIGTERM / SIGINT: rq's warm shutdown (the job in hand finishes, nothing new is taken), the
bus pollers finish the message in hand and hand back what they hold, then the process exits.
A second signal is rq's cold shutdown. A job killed anyway (kill -9) is requeued by a sweeper
when its lease expires.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.logging import get_logger
from robot_lab.runtime.network.run_state import queue_name

log = get_logger("robot_lab.worker")

SWEEP_INTERVAL = 0.5


def robot_worker_class() -> type:
    """rq SimpleWorker (no fork per job: the robot runtime stays warm), data-only job serializer."""
    from rq.worker import SimpleWorker

    from robot_lab.workers.health import LoopProgress

    class RobotWorker(LoopProgress, SimpleWorker):
        """Records loop progress for the heartbeat (workers/health.py)."""

    return RobotWorker


def warm_up() -> None:
    """Import litellm and make one offline scripted call, so the first task of a worker (or
    of the demo) does not pay seconds of lazy imports."""
    from robot_lab.runtime.llm import gateway as llm

    llm.litellm_module()
    try:
        llm.LLMGateway(max_retries=0).complete("scripted/text:ok", [{"role": "user", "content": "warm up"}])
    except Exception as exc:  # warming up is an optimisation only
        log.warning("worker.warm_up_failed", error=f"{type(exc).__name__}: {exc}")
    from robot_lab.workers import jobs  # noqa: F401



def resolve_worker_robots(names: list[str], *, connection: Any, keys: Keys, app: Any) -> dict[str, Any]:
    """Each robot's spec, from the app or the Redis registry; unknown names raise."""
    from robot_lab.app import check_importable, published_spec

    specs = {}
    for name in names:
        spec = app.robot_spec(name) if app is not None and app.has_robot(name) else None
        if spec is None:
            spec = published_spec(name, connection=connection, keys=keys)
        if spec is None:
            where = f"not in app {app.name!r}" if app is not None else "no app given (set ROBOT_LAB_APP or --app)"
            raise ConfigurationError(
                f"unknown robot {name!r}: {where}, and no robot of that name is published in Redis"
            )
        check_importable(spec)
        specs[name] = spec
    return specs


def _rq_loop(url: str | None, queues: list[str], name: str, burst: bool) -> None:
    """One rq worker (main thread of its process: rq installs its signal handlers)."""
    from rq import Queue
    from robot_lab.workers.health import RQ_WORKER_TTL, WorkerHeartbeat, rq_loop_problem, threads_problem
    from robot_lab.runtime.network.serializer import JobSerializer

    from robot_lab.connection import connect

    connection = connect(url)
    worker_cls = robot_worker_class()
    qs = [Queue(q, connection=connection, serializer=JobSerializer) for q in queues]
    worker = worker_cls(qs, connection=connection, serializer=JobSerializer, name=name, worker_ttl=RQ_WORKER_TTL)
    # The beat (workers/health.py) also watches this process's bus pollers and sweeper.
    watched = [t for t in threading.enumerate() if t.name.startswith("bus-") or t.name == "sweeper"]
    heartbeat = WorkerHeartbeat(
        connection, default_keys(), name, [q.split(":", 1)[1] for q in queues],
        role="worker" if watched else "rq",
        checks=[lambda: rq_loop_problem(worker), lambda: threads_problem(watched)],
        info=lambda: {"queues": queues, "bus": sorted(t.name[4:] for t in watched if t.name != "sweeper"),
                      **worker.progress()},
    ).start()
    try:
        worker.work(burst=burst, logging_level="WARNING")
    finally:
        heartbeat.stop()


def _child_main(url: str | None, queues: list[str], name: str, burst: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards SIGTERM instead
    warm_up()
    _rq_loop(url, queues, name, burst)


def _sweeper(connection: Any, keys: Keys, stop: threading.Event) -> None:
    from robot_lab.runtime.network.coordinator import Coordinator

    coordinator = Coordinator(connection=connection, keys=keys)
    while not stop.wait(SWEEP_INTERVAL):
        try:
            coordinator.sweep(min_interval_ms=int(SWEEP_INTERVAL * 1000))
        except Exception as exc:
            log.warning("worker.sweep_failed", error=f"{type(exc).__name__}: {exc}")


def _spawn_watcher(connection: Any, keys: Keys, stop: threading.Event, serving: set[str],
                   interval: float = 1.0) -> None:
    """Serve every robot spawned at run time (``<prefix>:robots:spawned``): a bus poller per
    new name, built from its published spec. A spec that cannot be built is logged and
    retried on the next pass."""
    from robot_lab.app import published_spec
    from robot_lab.bus import BusPoller
    from robot_lab.runtime.robot import Robot

    while not stop.is_set():
        try:
            names = sorted(n.decode() if isinstance(n, bytes) else n for n in connection.smembers(keys.spawned()))
            for name in names:
                if name in serving:
                    continue
                spec = published_spec(name, connection=connection, keys=keys)
                if spec is None:
                    continue
                poller = BusPoller(name, redis=connection).serve(Robot.from_spec(spec))
                threading.Thread(target=poller.run_forever, args=(stop,), name=f"bus-{name}", daemon=True).start()
                serving.add(name)
                log.info("worker.serving_spawned", robot=name)
        except Exception as exc:
            log.warning("worker.spawn_watch_failed", error=f"{type(exc).__name__}: {exc}")
        stop.wait(interval)


def run_worker(robots: list[str], *, concurrency: int = 1, app_path: str | None = None,
               url: str | None = None, burst: bool = False, bus: bool = True, spawned: bool = False) -> None:
    """The body of ``robot-lab worker``."""
    from robot_lab.app import load_app
    from robot_lab.connection import connect
    from robot_lab.settings import get_settings

    settings = get_settings()
    url = url or settings.redis_url
    if not url:
        raise ConfigurationError(
            "robot-lab worker needs a Redis server: set REDIS_URL (with no REDIS_URL, networks run "
            "with in-process workers; see `robot-lab demo`)"
        )
    if not robots and not spawned:
        raise ConfigurationError(
            "name at least one robot (robot-lab worker billing [technical ...]) or serve spawned robots (--spawned)"
        )
    if concurrency < 1:
        raise ConfigurationError(f"--concurrency must be >= 1, got {concurrency}")
    app_path = app_path or settings.app
    app = load_app(app_path) if app_path else None
    connection = connect(url)
    keys = default_keys()
    specs = resolve_worker_robots(robots, connection=connection, keys=keys, app=app)
    if app is not None:
        app.publish(connection=connection, keys=keys)
    queues = [queue_name(r) for r in robots]
    base = f"robot-lab.{socket.gethostname()}.{os.getpid()}"
    log.info("worker.starting", robots=robots, queues=queues, concurrency=concurrency, app=app_path)
    # Fork the rq worker children before this process runs any other thread (litellm's
    # warm-up starts some): a fork taken while another thread holds a lock (logging, a
    # connection pool, litellm's executor) can deadlock the child. Each child warms up itself.
    children = _start_children(url, queues, base, burst, concurrency) if concurrency > 1 else []
    warm_up()
    stop = threading.Event()
    threads: list[threading.Thread] = [
        threading.Thread(target=_sweeper, args=(connection, keys, stop), name="sweeper", daemon=True)
    ]
    if bus:
        from robot_lab.bus import BusPoller
        from robot_lab.runtime.robot import Robot

        for name, spec in specs.items():
            poller = BusPoller(name, redis=connection).serve(Robot.from_spec(spec))
            threads.append(threading.Thread(target=poller.run_forever, args=(stop,), name=f"bus-{name}",
                                            daemon=True))
    if spawned:
        threads.append(threading.Thread(target=_spawn_watcher, args=(connection, keys, stop, set(robots)),
                                        name="spawn-watcher", daemon=True))
    for thread in threads:
        thread.start()
    try:
        if not queues:  # only spawned robots: nothing for rq to do; wait for SIGTERM/SIGINT
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            stop.wait()
        elif concurrency == 1:
            _rq_loop(url, queues, base, burst)
        else:
            _wait_children(children)
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
        log.info("worker.stopped", robots=robots)


def _start_children(url: str | None, queues: list[str], base: str, burst: bool, concurrency: int) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    children = [
        ctx.Process(target=_child_main, args=(url, queues, f"{base}.{i}", burst), name=f"rq-worker-{i}")
        for i in range(concurrency)
    ]
    for child in children:
        child.start()
    return children


def _wait_children(children: list[Any]) -> None:

    def forward(signum: int, frame: Any) -> None:
        for child in children:
            if child.is_alive() and child.pid:
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for child in children:
            child.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
