"""Builds: which code a process runs, which code a run needs, and handing a task back to it.

A *build* names what a replay of a run depends on: the robot-lab version and, for the app
the process serves, every robot's spec (model, prompt, tools, config) and each local tool's
JSON schema as imported here. It is ``ROBOT_LAB_BUILD`` (setting ``build``) when set, else
``b-<12 hex>`` of a SHA-256 over those, so a tool that gains a parameter is a new build
without anyone bumping a version (docs/operations.md, "Rolling out a new build").

A network run records the build it was submitted on (run record ``build``) and, when
*pinned* (``pinned=1``: the default for a run of an app, see :func:`default_pinned`), is
served only by workers of that build. The task job checks it before its claim
(:func:`wrong_build`): a worker of another build does not run the task and counts no
attempt; it *hands it back* (:func:`hand_back`: the task stays ``queued`` and is noted in
``Keys.builds_handed``). Every sweep re-enqueues handed-back tasks whose build has a live
worker (:func:`requeue_handed_back`), so no job bounces between wrong workers while its
build is away: the run is *stalled on build X* (:func:`build_report`, ``robot-lab status``)
until a worker of X beats again.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from robot_lab import __version__
from robot_lab.keys import Keys, is_wrong_type
from robot_lab.logging import get_logger

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.builds")

_SEP = "\t"  # between the parts of a handed-back member (run ids and task names have no tab)
_builds: dict[str | None, str] = {}  # app import path (None: the configured app) -> build
_runs: dict[str, tuple[str | None, str | None]] = {}  # run id -> (pinned build, app path)
_RUN_CACHE = 4096
_lock = threading.Lock()
REQUEUE_AFTER = 2.0  # seconds a handed-back task waits before a sweep re-enqueues it


def compute_build(source: Any) -> str:
    """The build id of a robot source (an App, a YAML app's robots, None: no app): the
    robot-lab version, each robot's spec and each of its local tools' JSON schemas, hashed.
    A tool that cannot be imported here hashes as its import error (a build that lacks it)."""
    import msgspec  # lazy: start-up time

    from robot_lab.runtime.tools import as_tool  # lazy: start-up time

    digest = hashlib.sha256(f"robot-lab {__version__}\n".encode())
    names = getattr(source, "robot_names", None) or sorted(getattr(source, "specs", {}) or {})
    for name in sorted(names):
        spec = source.robot_spec(name)
        digest.update(msgspec.json.encode(spec) + b"\n")
        for path in spec.local_tools:
            try:
                schema: Any = as_tool(path).to_json_schema()
            except Exception as exc:  # noqa: BLE001 - a missing tool is part of what differs
                schema = {"unresolved": path, "error": type(exc).__name__}
            digest.update(json.dumps(schema, sort_keys=True, default=str).encode() + b"\n")
    return f"b-{digest.hexdigest()[:12]}"


def build_for_app(app: str | None = None) -> str:
    """The build this process serves ``app`` (an import path; None: the configured app,
    ``ROBOT_LAB_APP``) with: the ``build`` setting when set, else :func:`compute_build` of
    the app as importable here (once per process and app)."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    settings = get_settings()
    if settings.build:
        return settings.build
    path = app or settings.app or None
    with _lock:
        cached = _builds.get(path)
    if cached is not None:
        return cached
    from robot_lab.runtime.registry import robot_source  # lazy: imports the app

    try:
        source = robot_source(path) if path else None
    except Exception as exc:  # noqa: BLE001 - an app this process cannot load
        # ... is not served here with the code it names: the build of no app, so a run pinned
        # to the app's build is handed back rather than run (the heartbeat still beats)
        log.warning("build.app_unloadable", app=path, error=f"{type(exc).__name__}: {exc}")
        source = None
    build = compute_build(source)
    with _lock:
        _builds[path] = build
    return build


_process_app: str | None = None  # the app this process serves when not the configured one (--app)


def serve_app(app: str | None) -> None:
    """Make ``app`` (``robot-lab worker --app``) the app :func:`process_build` is of."""
    global _process_app
    _process_app = app or None


def process_build() -> str:
    """This process's build (what its worker and A2A heartbeats advertise): its app's."""
    return build_for_app(_process_app)


def default_pinned(app: str | None) -> bool:
    """Whether a run is pinned when its submitter does not say: a run of an app is (its
    tasks may park for days on a question, and replaying its journal needs the same tools),
    a run of a network built in a script is not (no app to compute a worker's build from)."""
    return bool(app)


# --- the task job's check -----------------------------------------------------------------


def wrong_build(connection: RedisClient, keys: Keys, run_id: str) -> str | None:
    """The build ``run_id`` is pinned to when this process runs another one (None: it may
    serve the run: not pinned, no build recorded by an older release, or the same build).
    A run's build never changes, so it is read once per process and run."""
    with _lock:
        cached = _runs.get(run_id)
    if cached is None:
        build, pinned, app = (_text(v) for v in connection.hmget(keys.run(run_id), "build", "pinned", "app"))
        cached = (build if build and pinned == "1" else None, app or None)
        with _lock:
            if len(_runs) >= _RUN_CACHE:
                _runs.clear()
            _runs[run_id] = cached
    pinned_build, app = cached
    if pinned_build is None or pinned_build == build_for_app(app):
        return None
    return pinned_build


def hand_back(connection: RedisClient, keys: Keys, run_id: str, task: str, job_id: str, build: str) -> None:
    """Leave task ``task`` (job ``job_id``) of ``run_id`` to a worker of ``build``: noted in
    ``Keys.builds_handed`` for a sweep to re-enqueue once such a worker beats; the task stays
    ``queued`` and no attempt is counted."""
    member = _SEP.join((build, run_id, task, job_id))
    connection.zadd(keys.builds_handed(), {member: time.time()})
    log.info("task.handed_back", run_id=run_id, task=task, job_id=job_id, build=build, serving=process_build())


def requeue_handed_back(connection: RedisClient, keys: Keys) -> int:
    """Re-enqueue every handed-back task whose build has a live worker (returns how many);
    the others wait. Enqueued before their note is removed: a crash in between enqueues one
    twice, which the claim makes harmless."""
    # a task handed back a moment ago waits REQUEUE_AFTER: while workers of both builds
    # take from one queue, a job the wrong one takes again is not bounced at sweep pace
    try:
        raw = connection.zrangebyscore(keys.builds_handed(), "-inf", time.time() - REQUEUE_AFTER)
    except Exception as exc:
        if not is_wrong_type(exc):
            raise
        # written by hand: the sweep of every run goes on (``robot-lab status`` names the key)
        log.warning("builds.handed_wrong_type", key=keys.builds_handed())
        return 0
    if not raw:
        return 0
    from robot_lab.network.enqueue import enqueue_jobs  # lazy: enqueue imports rq
    from robot_lab.network.graphs import graph_for  # lazy: start-up time
    from robot_lab.network.run_state import RunStore  # lazy: start-up time

    live = set(live_builds(connection, keys))
    done = 0
    for member in (_text(m) or "" for m in raw):
        build, run_id, task, job_id = (member.split(_SEP) + ["", "", "", ""])[:4]
        if build not in live:
            continue
        store = RunStore(connection, keys, run_id)
        state, current = (_text(v) for v in connection.hmget(store.key, "status", "build"))
        if state == "running" and store.job_id(task) == job_id and store.states().get(task) == "queued":
            robot = graph_for(store).tasks[task].robot
            enqueue_jobs(connection, keys, run_id, [(task, job_id, robot)], graph_for(store), build=current)
            done += 1
        connection.zrem(keys.builds_handed(), member)
    if done:
        log.info("builds.requeued", tasks=done)
    return done


# --- who serves which build ---------------------------------------------------------------


def live_builds(connection: RedisClient, keys: Keys) -> dict[str, list[str]]:
    """Build -> names of the live worker processes beating it (heartbeats of
    ``Keys.worker``; a beat of a release before builds counts as build ``unknown``)."""
    names = [_text(n) or "" for n in connection.zrange(keys.workers(), 0, -1)]
    out: dict[str, list[str]] = {}
    if not names:
        return out
    from robot_lab.connection import mget  # (cluster: the worker keys sit in many slots)

    for name, raw in zip(names, mget(connection, [keys.worker(n) for n in names])):
        if raw is None:
            continue
        try:
            build = json.loads(raw).get("build") or "unknown"
        except (ValueError, AttributeError):
            continue
        out.setdefault(build, []).append(name)
    return out


def build_report(connection: RedisClient, keys: Keys) -> dict[str, dict[str, Any]]:
    """Per build: its live workers, the open runs pinned to it, whether those are stalled
    (no live worker of the build) and ``drained`` (no open run pinned to it any more).
    Builds appear while they have a live worker or an open pinned run."""
    workers = live_builds(connection, keys)
    run_ids = sorted(_text(r) or "" for r in connection.smembers(keys.runs_active()))
    pipe = connection.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hmget(keys.run(run_id), "status", "build", "pinned")
    pinned: dict[str, list[str]] = {}
    for run_id, (status, build, pin) in zip(run_ids, pipe.execute() if run_ids else []):
        if _text(status) == "running" and _text(pin) == "1" and _text(build):
            pinned.setdefault(_text(build) or "", []).append(run_id)
    report = {}
    for build in sorted({*workers, *pinned}):
        runs = pinned.get(build, [])
        report[build] = {"build": build, "workers": sorted(workers.get(build, [])), "runs": runs,
                         "stalled": bool(runs) and not workers.get(build), "drained": not runs}
    return report


def stalled_problems(connection: RedisClient, keys: Keys) -> list[str]:
    """A ``robot-lab status`` problem line per build that open runs wait for with no live
    worker (none when an index holds another type: status names that key in its own line)."""
    try:
        report = build_report(connection, keys)
    except Exception as exc:
        if is_wrong_type(exc):
            return []
        raise
    return [f"{len(row['runs'])} run(s) stalled on build {build}: no live worker of that build "
            f"(start one to resume them): {', '.join(row['runs'][:5])}{' ...' if len(row['runs']) > 5 else ''}"
            for build, row in report.items() if row["stalled"]]


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
