"""``robot-lab worker``: rq workers on ``robot:<name>`` queues, each robot's bus poller and
the lost-work sweeper, in one command.

Layout of one ``robot-lab worker billing technical --in-flight 16 --concurrency 2`` process tree:

* the main process: one BusPoller thread per robot (inbox ``robot_lab:bus:<robot>``, up to
  ``--in-flight`` messages at once on its handler threads), the sweeper thread, and -- with
  ``--concurrency 1`` -- the rq worker itself (up to ``--in-flight`` tasks at once on its job
  threads, :mod:`.inflight`; ``--in-flight 1`` is a plain rq SimpleWorker);
* with ``--concurrency N > 1``: N child processes, each one such rq worker on all the queues
  (forked after the app is imported; each warms up, so a job pays no import time).

SIGTERM / SIGINT: rq's warm shutdown -- nothing new is taken (tasks or messages), every task
and message in hand finishes, the bus pollers hand back what they hold but never started,
then the process exits (``worker.stopping`` says whether it had work in hand: ``path=drain``,
or none: ``path=idle``). Nothing on that path waits on Redis or on an idle loop: the loops
with nothing in hand and the bookkeeping writes share
:data:`~robot_lab.workers.supervision.STOP_BUDGET` (3 s), so an idle worker is gone within
seconds even while its Redis is down or hung. A second signal is rq's cold shutdown. Work killed anyway (kill -9)
is re-run: a task when its lease expires (a sweeper requeues it), a message when its
visibility timeout passes (another consumer reclaims it).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis

from robot_lab.app import load_app
from robot_lab.bus import BusPoller
from robot_lab.connection import adopt_default, connect
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.llm import gateway as llm
from robot_lab.logging import get_logger
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.enqueue import DEFAULT_JOB_TIMEOUT, queue_name
from robot_lab.network.serializer import JobSerializer
from robot_lab.observability import metrics, otel
from robot_lab.outage import Backoff, is_outage
from robot_lab.rq_connection import rq_connection
from robot_lab.runtime.registry import check_importable, published_spec
from robot_lab.settings import get_settings
from robot_lab.workers.health import (
    JOB_SLACK,
    LOOP_SLACK,
    RQ_WORKER_TTL,
    LoopProgress,
    WorkerHeartbeat,
    rq_loop_problem,
)
from robot_lab.workers.inflight import RobotPool, cap_malloc_arenas, in_flight_worker_class
from robot_lab.workers.supervision import (
    Loops,
    RidesOutages,
    restart_stop_budget,
    stop_signalled,
    stop_time_left,
    supervise_poller,
)

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.worker")

SWEEP_INTERVAL = 0.5
# How long a stopping worker waits for each bus poller's messages in hand (a model call that
# long is past any sane timeout; the supervisor's kill and the visibility timeout cover more).
DRAIN_LIMIT = 600.0


def robot_worker_class() -> type:
    """rq SimpleWorker (no fork per job: the robot runtime stays warm), data-only job serializer."""
    from rq.worker import SimpleWorker  # lazy: start-up time

    from robot_lab.network.job_policy import PolicedWorker  # lazy: start-up time
    from robot_lab.workers.task_lifecycle import task_job_lifecycle  # lazy: start-up time

    class RobotWorker(PolicedWorker, LoopProgress, RidesOutages, task_job_lifecycle(SimpleWorker)):
        """Records loop progress for the heartbeat (workers/health.py), rides out Redis
        outages (workers/supervision.py), runs only robot-lab's job (network/job_policy.py)
        and runs network task jobs on the lean lifecycle of workers/task_lifecycle.py."""

    return RobotWorker


def warm_up(models: Iterable[str] | None = None, *, background: bool = False) -> None:
    """Make one offline scripted call and import the job code, so the first task of a worker
    (or of the demo) does not pay lazy imports; litellm (200 MB, seconds) only when one of
    ``models`` needs it (None: not known, so yes) -- with ``background``, on a thread of its
    own, so the worker serves its inbox and queues (and beats its health) while it loads; a
    provider call before it is loaded waits for it. See docs/operations.md, "Memory"."""
    if models is None or not all(llm.is_scripted(model) for model in models):
        if background:
            threading.Thread(target=_load_litellm, name="litellm-import", daemon=True).start()
        else:
            llm.litellm_module()

    try:
        # a warm-up is no request: no one-span trace, no counted model call per worker start
        with otel.untraced(), metrics.uncounted():
            llm.LLMGateway(max_retries=0).complete("scripted/text:ok", [{"role": "user", "content": "warm up"}])
    except Exception as exc:  # warming up is an optimisation only
        log.warning("worker.warm_up_failed", error=f"{type(exc).__name__}: {exc}")
    from robot_lab.network import task_job  # noqa: F401  (the job's imports, before the first job)
    from robot_lab.runtime import robot  # noqa: F401  (what the first task imports: ~50 ms of CPU)



def _load_litellm() -> None:
    started = time.monotonic()
    try:
        llm.litellm_module()
    except Exception as exc:  # noqa: BLE001 - the first provider call will say why, again
        log.warning("worker.litellm_import_failed", error=f"{type(exc).__name__}: {exc}")
        return
    log.info("worker.litellm_loaded", seconds=round(time.monotonic() - started, 2))


def resolve_worker_robots(names: list[str], *, connection: RedisClient, keys: Keys, app: Any) -> dict[str, Any]:
    """Each robot's spec, from the app or the Redis registry; unknown names raise."""
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


def _rq_loop(url: str | None, queues: list[str], name: str, burst: bool, loops: Any = None,
             in_flight: int = 1, on_stop: Any = None) -> None:
    """One rq worker (main thread of its process: rq installs its signal handlers). Its
    progress joins ``loops`` (the main process's registry), or -- in an rq child process --
    a heartbeat of its own. ``in_flight`` > 1 runs that many jobs at once (workers/inflight.py);
    ``on_stop`` is called when a warm shutdown starts."""
    from rq import Queue  # lazy: start-up time

    data = connect(url)
    adopt_default(data)  # --url without REDIS_URL: the robots' memory lives there too
    connection = rq_connection(data)  # on Redis Cluster: a plain client of rq's slot owner
    qs = [Queue(q, connection=connection, serializer=JobSerializer) for q in queues]
    if in_flight > 1:
        worker = in_flight_worker_class()(qs, connection=connection, serializer=JobSerializer, name=name,
                                          worker_ttl=RQ_WORKER_TTL, in_flight=in_flight, on_stop=on_stop)
    else:
        worker = robot_worker_class()(qs, connection=connection, serializer=JobSerializer, name=name,
                                      worker_ttl=RQ_WORKER_TTL)
    heartbeat = None
    if loops is None:
        loops = Loops()
        heartbeat = WorkerHeartbeat(data, default_keys(), name, [q.split(":", 1)[1] for q in queues],
                                    role="rq", checks=[loops.problem],
                                    info=lambda: {"queues": queues, **loops.info(), **worker.progress()})
    loops.add("rq", idle_limit=float("inf"), probe=lambda: worker.loop_beat)  # started = first beat
    loops.checks.append(lambda: rq_loop_problem(worker))
    loops.extra_info = worker.progress
    loops.started()
    if heartbeat is not None:
        heartbeat.start()
    try:
        _work(worker, burst)
    finally:
        if heartbeat is not None:
            heartbeat.stop()


def _work(worker: Any, burst: bool) -> None:
    """rq's ``work()``; started again when it quit without being asked to stop: because of
    a Redis outage (rq's own failure path raises out of it), or on an error of rq's loop
    itself ("found an unhandled exception, quitting", with rq's traceback before it) -- a
    worker whose rq loop ended either exited with status 0, and under honcho its exit
    stopped the whole Procfile, or stayed up taking no job. The restart after an error
    waits a backoff (an error that repeats is one line per round, and the health probe's
    "rq loop silent" names it); a stop signal meanwhile ends it."""
    from rq.exceptions import StopRequested  # lazy: start-up time

    backoff = Backoff()
    while True:
        outages = worker._tracker().outages
        worker.work(burst=burst, logging_level="WARNING")
        if burst or _asked_to_stop(worker):
            return
        if worker._tracker().outages != outages:
            log.warning("worker.rq_loop_restarted", worker=worker.name)
            worker._ride_out(worker.connection.ping)
            continue
        delay = backoff.next_delay()
        log.error("worker.rq_loop_restarted", worker=worker.name, after_error=True, retry_in=round(delay, 2))
        try:
            time.sleep(delay)  # rq's signal handlers stay installed: SIGTERM raises StopRequested here
        except StopRequested:
            return
        if _asked_to_stop(worker):
            return


def _asked_to_stop(worker: Any) -> bool:
    # an idle worker's SIGTERM raises StopRequested without setting _stop_requested; rq
    # records the request's date either way
    return bool(worker._stop_requested or worker._shutdown_requested_date is not None)


def served_models(specs: dict[str, Any], spawned: bool) -> list[str] | None:
    """The models the served robots call (None when spawned robots may bring any)."""
    if spawned:
        return None

    return [spec.model or get_settings().default_model() for spec in specs.values()]


def _child_main(url: str | None, queues: list[str], name: str, burst: bool, in_flight: int,
                models: list[str] | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards SIGTERM instead
    warm_up(models, background=True)
    try:
        _rq_loop(url, queues, name, burst, in_flight=in_flight)
    finally:
        from robot_lab.runtime.mcp.pool import close_shared  # lazy: start-up time

        close_shared()


def _sweeper(connection: RedisClient, keys: Keys, stop: threading.Event, loop: Any) -> None:

    coordinator = Coordinator(connection=connection, keys=keys)
    loop.tick()
    while not stop.wait(SWEEP_INTERVAL):
        with loop.busy("sweeping"):
            try:
                coordinator.sweep(min_interval_ms=int(SWEEP_INTERVAL * 1000))
            except Exception as exc:
                if is_outage(exc):
                    loop.outage.lost(exc)
                    loop.outage.pause(stop)
                    continue
                loop.failed(exc)
                log.warning("worker.sweep_failed", error=f"{type(exc).__name__}: {exc}")
                continue
        loop.succeeded()


def _spawn_watcher(connection: RedisClient, keys: Keys, stop: threading.Event, serving: set[str], loops: Any,
                   in_flight: int = 1, interval: float = 1.0) -> None:
    """Serve every robot spawned at run time (``<prefix>:robots:spawned``): a bus poller per
    new name, built from its published spec. A spec that cannot be built is logged and
    retried on the next pass."""

    loop = loops.loops["spawn-watcher"]
    while not stop.is_set():
        loop.tick()
        try:
            names = sorted(n.decode() if isinstance(n, bytes) else n for n in connection.smembers(keys.spawned()))
            for name in names:
                if name in serving:
                    continue
                spec = published_spec(name, connection=connection, keys=keys)
                if spec is None:
                    continue
                poller = serving_poller(name, spec, connection, in_flight)
                bus_thread(loops, name, poller, stop).start()
                serving.add(name)
                log.info("worker.serving_spawned", robot=name)
        except Exception as exc:
            if is_outage(exc):
                loop.outage.lost(exc)
                loop.outage.pause(stop)
                continue
            log.warning("worker.spawn_watch_failed", error=f"{type(exc).__name__}: {exc}")
        else:
            loop.outage.back()
        stop.wait(interval)


def serving_poller(name: str, spec: Any, connection: RedisClient, in_flight: int) -> Any:
    """The bus poller serving robot ``name``: ``in_flight`` messages at once, each run on a
    robot of its own (workers/inflight.py RobotPool) when more than one."""
    from robot_lab.runtime.robot import Robot  # lazy: start-up time

    if in_flight > 1:
        robot: RobotPool | Robot = RobotPool(spec)
    else:
        robot = Robot.from_spec(spec)
    return BusPoller(name, redis=connection, in_flight=in_flight).serve(robot)


def bus_thread(loops: Any, robot: str, poller: Any, stop: threading.Event) -> threading.Thread:
    """The supervised thread of one robot's bus poller (workers/supervision.py): its rounds
    count as progress, a Redis outage is ridden out, its death fails the health probe."""

    loop = loops.add(f"bus-{robot}", idle_limit=poller.block_ms / 1000 + LOOP_SLACK)
    supervise_poller(poller, loop, stop, handler_limit=DEFAULT_JOB_TIMEOUT + JOB_SLACK)
    return loops.thread(loop, poller.run_forever, stop, stop=stop)


def run_worker(robots: list[str], *, concurrency: int = 1, app_path: str | None = None,
               url: str | None = None, burst: bool = False, bus: bool = True, spawned: bool = False,
               in_flight: int | None = None) -> None:
    """The body of ``robot-lab worker``. ``in_flight``: tasks, and messages per robot, run at
    once by each process (default: setting ``worker.in_flight``)."""

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
    in_flight = settings.worker.in_flight if in_flight is None else in_flight
    if in_flight < 1:
        raise ConfigurationError(f"--in-flight must be >= 1, got {in_flight}")
    if in_flight > 1:
        cap_malloc_arenas()  # before any thread: many threads, few arenas (workers/inflight.py)
    app_path = app_path or settings.app
    app = load_app(app_path) if app_path else None
    connection = connect(url)
    adopt_default(connection)  # --url without REDIS_URL: the served robots' memory lives there too
    keys = default_keys()
    specs = resolve_worker_robots(robots, connection=connection, keys=keys, app=app)
    if app is not None:
        _publish_app(app, connection, keys)
    queues = [queue_name(r) for r in robots]
    base = f"robot-lab.{socket.gethostname()}.{os.getpid()}"
    log.info("worker.starting", robots=robots, queues=queues, concurrency=concurrency, in_flight=in_flight,
             app=app_path)
    # Fork the rq worker children before this process runs any other thread (litellm's
    # warm-up starts some): a fork taken while another thread holds a lock (logging, a
    # connection pool, litellm's executor) can deadlock the child. Each child warms up itself.
    models = served_models(specs, spawned)
    children = (_start_children(url, queues, base, burst, concurrency, in_flight, models)
                if concurrency > 1 else [])
    stop = threading.Event()
    # Every loop is registered before it starts and the heartbeat runs from here on, so a
    # loop that dies at start-up fails `robot-lab health` naming it (workers/supervision.py).
    loops, heartbeat = _supervision(connection, keys, base, robots, queues, children)
    warm_up(models, background=True)  # litellm loads beside the loops, not before them
    threads = [loops.thread(loops.add("sweeper", idle_limit=SWEEP_INTERVAL + LOOP_SLACK, busy_limit=300.0),
                            _sweeper, connection, keys, stop, loops.loops["sweeper"], stop=stop)]
    pollers: dict[threading.Thread, Any] = {}  # each bus thread's poller: its messages in hand
    if bus:
        for name, spec in specs.items():
            poller = serving_poller(name, spec, connection, in_flight)
            threads.append(bus_thread(loops, name, poller, stop))
            pollers[threads[-1]] = poller
    if spawned:
        loops.add("spawn-watcher", idle_limit=LOOP_SLACK + 1.0, busy_limit=300.0)
        threads.append(loops.thread(loops.loops["spawn-watcher"], _spawn_watcher, connection, keys, stop,
                                    set(robots), loops, in_flight, stop=stop))
    for thread in threads:
        thread.start()
    if not queues or concurrency > 1:
        loops.started()  # else _rq_loop says so once the rq loop is registered too
    try:
        if not queues:  # only spawned robots: nothing for rq to do; wait for SIGTERM/SIGINT
            def on_signal(*_: Any) -> None:
                stop_signalled("idle", 0)
                stop.set()

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, on_signal)
            stop.wait()
        elif concurrency == 1:
            # a warm shutdown stops the bus pollers at once too: nothing new is taken anywhere
            _rq_loop(url, queues, base, burst, loops, in_flight=in_flight, on_stop=stop.set)
        else:
            _wait_children(children, on_stop=stop.set)
    finally:
        loops.stopping()
        stop.set()
        _join_loops(threads, pollers)
        heartbeat.stop()
        from robot_lab.runtime.mcp.pool import close_shared  # lazy: start-up time

        close_shared()  # the MCP servers its runs shared stop with the worker
        log.info("worker.stopped", robots=robots)


def _join_loops(threads: list[threading.Thread], pollers: dict[threading.Thread, Any]) -> None:
    """Wait for the main process's loops once ``stop`` is set: a bus poller with messages in
    hand as long as they run (up to :data:`DRAIN_LIMIT`); a loop with nothing in hand while
    the stop budget lasts (it sees the stop within a poll round: an idle poller within its
    block_ms, 1 s), then it is left to die with the process (a daemon thread blocked on a
    Redis that does not answer must not hold the exit; its held, unstarted messages go to
    another consumer when their visibility timeout passes). Without a stop signal (a burst
    run) every loop is waited for."""
    drain_until = time.monotonic() + DRAIN_LIMIT
    for thread in threads:
        poller = pollers.get(thread)
        while thread.is_alive():
            left = stop_time_left()
            if poller is not None and poller._running and time.monotonic() < drain_until:  # handlers running now
                thread.join(0.1)  # messages in hand: they finish
            elif left is None and time.monotonic() < drain_until:
                thread.join(0.1)
            elif left:
                thread.join(min(0.1, left))
            else:
                log.warning("worker.loop_left_running", loop=thread.name,
                            reason="nothing in hand, and it did not see the stop (Redis not answering?)")
                break


def _publish_app(app: Any, connection: RedisClient, keys: Keys) -> None:
    """Publish the app's robot specs. A worker logged in as its robot's ACL user (robot-lab
    acl) may write only its own spec: the others are refused, which is logged, not fatal
    (the pipeline has written every spec it was allowed to)."""
    try:
        app.publish(connection=connection, keys=keys)
    except redis.ResponseError as exc:
        if not (isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in str(exc)):
            raise
        log.info("worker.specs_not_all_published", reason="the Redis user may write only its own robot's spec")


def _supervision(connection: RedisClient, keys: Keys, base: str, robots: list[str], queues: list[str],
                 children: list[Any]) -> tuple[Any, Any]:
    """The main process's loop registry and its heartbeat (started)."""

    loops = Loops()
    for child in children:
        loops.checks.append(lambda child=child: None if child.is_alive() or child.exitcode == 0 else
                            f"rq child {child.name} (pid {child.pid}) exited with code {child.exitcode}")
    heartbeat = WorkerHeartbeat(connection, keys, base, robots, role="worker", checks=[loops.problem],
                                info=lambda: {"queues": queues, **loops.info(),
                                              **(loops.extra_info() if loops.extra_info else {})})
    return loops, heartbeat.start()


def _start_children(url: str | None, queues: list[str], base: str, burst: bool, concurrency: int,
                    in_flight: int = 1, models: list[str] | None = None) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    children = [
        ctx.Process(target=_child_main, args=(url, queues, f"{base}.{i}", burst, in_flight, models),
                    name=f"rq-worker-{i}")
        for i in range(concurrency)
    ]
    for child in children:
        child.start()
    return children


def _wait_children(children: list[Any], on_stop: Any = None) -> None:

    def forward(signum: int, frame: Any) -> None:
        stop_signalled("children", 0)  # each child drains its own jobs; this process its messages
        if on_stop is not None:
            on_stop()
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
        restart_stop_budget()  # the children are done: the idle part of this process's stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
