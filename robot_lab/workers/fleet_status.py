"""What ``robot-lab status`` and ``robot-lab runs`` report, computed from Redis alone.

Per robot: its rq queue (queued, started, failed, rq-registered workers), live robot-lab
workers (heartbeat keys, ``workers/health.py``), tasks running and tasks *abandoned* (state
``running`` but the lease expired: the worker died and no sweeper requeued it yet), tasks
*lost* (state ``queued`` but the rq job is gone), and the bus inbox (length, pending, lag,
consumers, DLQ). Plus the active runs with their progress, and recent runs with duration,
tokens and cost summed over their task results.

Liveness comes from robot-lab's own heartbeats. rq's worker registry is only a second
opinion: a ``kill -9``ed worker stays registered there until its key expires (up to the job
timeout + 60 s), so a registration of a ``robot-lab.*`` worker without a live heartbeat is
reported as *stale* and not counted (:func:`rq_registrations`).

Status never sweeps (``robot-lab watch --all`` does), so it shows the damage as it is. Its one
write is housekeeping of liveness records: expired heartbeat index entries, and the rq
registrations of workers that are certainly dead (see :func:`rq_registrations`), so that
``rq info`` stops listing a killed worker as busy.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from robot_lab.connection import get_redis, mget, redact_url
from robot_lab.keys import Keys, default_keys, is_wrong_type, wrong_typed
from robot_lab.network.builds import stalled_problems
from robot_lab.rq_connection import rq_connection, rq_prefix
from robot_lab.settings import get_settings
from robot_lab.text.strings import as_str as _s
from robot_lab.workers.health import RQ_WORKER_TTL, pid_alive

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

FINISHED = ("done", "failed", "skipped", "cancelled")


def live_workers(connection: RedisClient, keys: Keys) -> list[dict[str, Any]]:
    """Heartbeat records still alive; index entries whose key expired are pruned."""
    return _live(connection, keys.workers(), keys.worker)


def live_a2a_servers(connection: RedisClient, keys: Keys) -> list[dict[str, Any]]:
    """The ``robot-lab a2a`` processes beating (name, host, pid, url, agents)."""
    return _live(connection, keys.a2a_servers(), keys.a2a_server)


def _shared_index(connection: RedisClient, command: str, key: str, *args: Any, **kwargs: Any) -> Any:
    """Read a shared index (the registry, the worker, run and input indexes): one of the
    wrong type -- any worker's Redis user may write it -- reads as empty, and
    :func:`collect_status` names it in a problem line (:func:`shared_expected_types`)
    instead of the whole status failing on an unnamed WRONGTYPE."""
    try:
        return getattr(connection, command)(key, *args, **kwargs)
    except Exception as exc:
        if not is_wrong_type(exc):
            raise
        return []


def _live(connection: RedisClient, index: str, key_of: Any) -> list[dict[str, Any]]:
    names = [_s(n) for n in _shared_index(connection, "zrange", index, 0, -1)]
    if not names:
        return []
    raws = mget(connection, [key_of(n) for n in names])  # one slot per process on a cluster
    out, gone = [], []
    for name, raw in zip(names, raws):
        if raw is None:
            gone.append(name)
            continue
        try:
            out.append(json.loads(raw))
        except ValueError:
            gone.append(name)
    if gone:
        connection.zrem(index, *gone)
    return out


ROBOT_LAB_WORKER_PREFIX = "robot-lab."


def queue_name(robot: str) -> str:
    """The rq queue of ``robot`` (the network's naming, imported when there is a robot to
    name: ``robot-lab runs`` and an empty fleet's ``status`` never load the DAG engine)."""
    from robot_lab.network.enqueue import queue_name as network_queue_name  # lazy: start-up time

    return network_queue_name(robot)


def _rq_key(suffix: str) -> str:
    """An rq key under rq's prefix (``RQ_KEY_PREFIX``: ``{rq}`` on Redis Cluster)."""
    return f"{rq_prefix()}:{suffix}"


def _rq_heartbeat_age(value: Any, now: float) -> float | None:
    if not value:
        return None
    try:
        stamp = dt.datetime.fromisoformat(_s(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return now - stamp.timestamp()


def rq_registrations(connection: RedisClient, queues: list[str], live_names: set[str], *,
                     clean: bool = True) -> dict[str, dict[str, list[str]]]:
    """rq's registered workers of each queue, split into ``live`` and ``stale``.

    A ``robot-lab.*`` worker is live while its robot-lab heartbeat is (``live_names``); any
    other registration (a plain ``rq worker``) is taken at its word, except one of this host
    whose process is gone. A stale registration is *removed* from rq's registry (``clean``)
    when its worker is certainly dead: its process is gone from this host, or rq itself has
    not heard from it for longer than a robot-lab worker's rq TTL + 60 s (a live robot-lab
    worker refreshes it every 30 s when idle; a busy one keeps beating in robot-lab's own
    heartbeat, which is checked first).
    """
    host = socket.gethostname()
    now = time.time()
    connection = rq_connection(connection)
    worker_prefix = _rq_key("worker:")
    pipe = connection.pipeline(transaction=False)
    for queue in queues:
        pipe.smembers(_rq_key("workers:" + queue))
    members = [sorted(_s(k) for k in found) for found in pipe.execute()]
    worker_keys = sorted({k for keys_ in members for k in keys_})
    pipe = connection.pipeline(transaction=False)
    for key in worker_keys:
        pipe.hmget(key, "hostname", "pid", "last_heartbeat", "queues")
    info = dict(zip(worker_keys, pipe.execute()))
    dead: dict[str, list[str]] = {}
    out: dict[str, dict[str, list[str]]] = {}
    for queue, keys_ in zip(queues, members):
        live, stale = [], []
        for key in keys_:
            name = key[len(worker_prefix):]
            hostname, pid, beat, worker_queues = info[key]
            if hostname is None:  # the hash expired: rq's own cleanup drops it on next read
                continue
            gone = _s(hostname) == host and pid is not None and not pid_alive(int(_s(pid)))
            ours = name.startswith(ROBOT_LAB_WORKER_PREFIX)
            if ours and name in live_names or not ours and not gone:
                live.append(name)
                continue
            stale.append(name)
            age = _rq_heartbeat_age(beat, now)
            if gone or (ours and age is not None and age > RQ_WORKER_TTL + 60):
                dead[key] = [q for q in _s(worker_queues or b"").split(",") if q] or [queue]
        out[queue] = {"live": live, "stale": stale}
    if clean and dead:
        pipe = connection.pipeline(transaction=False)
        for key, worker_queues in dead.items():
            pipe.srem(_rq_key("workers"), key)
            for queue in worker_queues:
                pipe.srem(_rq_key("workers:" + queue), key)
            pipe.delete(key)
        pipe.execute()
    return out


def _run_ids(connection: RedisClient, keys: Keys) -> list[str]:
    return sorted(_s(r) for r in _shared_index(connection, "smembers", keys.runs_active()))


def active_runs(connection: RedisClient, keys: Keys) -> list[dict[str, Any]]:
    """Each unfinished run: progress, running / abandoned / lost tasks (three pipelined round
    trips in all, whatever the number of runs)."""
    from rq.job import Job  # lazy: start-up time

    job_key = Job.redis_job_namespace_prefix
    now = time.time()
    run_ids = _run_ids(connection, keys)
    pipe = connection.pipeline(transaction=False)
    for run_id in run_ids:
        key = keys.run(run_id)
        pipe.hmget(key, "network", "status", "created_at")
        for suffix in (":state", ":graph", ":jobs", ":attempts"):
            pipe.hgetall(key + suffix)
    raw = pipe.execute()
    runs = []
    for i, run_id in enumerate(run_ids):
        meta, states, graph, jobs, attempts = raw[i * 5:(i + 1) * 5]
        if meta[0] is None or _s(meta[1]) != "running":
            continue
        runs.append({
            "run_id": run_id, "meta": meta,
            "states": {_s(k): _s(v) for k, v in states.items()},
            "graph": {_s(k): json.loads(v) for k, v in graph.items()},
            "jobs": {_s(k): _s(v) for k, v in jobs.items()},
            "attempts": {_s(k): int(v) for k, v in attempts.items()},
        })
    # second round trip: leases of running tasks, rq job records of running / queued tasks
    pipe = connection.pipeline(transaction=False)
    probes: list[tuple[int, str, str]] = []
    for index, run in enumerate(runs):
        for task, state in run["states"].items():
            job_id = run["jobs"].get(task)
            if state == "running":
                pipe.get(keys.run_lease(run["run_id"], task))
                pipe.hget(f"{job_key}{job_id}", "worker_name") if job_id else pipe.echo("")
                probes.append((index, task, "running"))
            elif state == "queued" and job_id:
                pipe.exists(f"{job_key}{job_id}")
                probes.append((index, task, "queued"))
    answers = iter(pipe.execute())
    found: dict[tuple[int, str], tuple[Any, ...]] = {}
    for index, task, kind in probes:
        found[(index, task)] = (next(answers), next(answers)) if kind == "running" else (next(answers),)
    out = []
    for index, run in enumerate(runs):
        states, graph, jobs = run["states"], run["graph"], run["jobs"]
        live, abandoned, lost = [], [], []
        for task, state in states.items():
            robot = graph.get(task, {}).get("robot", "")
            if state == "running":
                lease, worker = found[(index, task)]
                if lease is not None:
                    live.append({"task": task, "robot": robot, "worker": _s(lease)})
                else:
                    abandoned.append({"run_id": run["run_id"], "task": task, "robot": robot,
                                      "job_id": jobs.get(task), "attempt": run["attempts"].get(task, 1),
                                      "worker": _s(worker) if worker else None,
                                      "reason": "worker lost (lease expired)"})
            elif state == "queued" and (index, task) in found and not found[(index, task)][0]:
                lost.append({"run_id": run["run_id"], "task": task, "robot": robot, "job_id": jobs.get(task),
                             "reason": "rq job missing"})
        done = sum(1 for v in states.values() if v in FINISHED)
        meta = run["meta"]
        out.append({
            "run_id": run["run_id"], "network": _s(meta[0]), "status": "running",
            "age": round(now - float(meta[2] or now), 1),
            "tasks": len(states), "finished": done,
            "progress": round(done / len(states), 3) if states else 0.0,
            "states": states, "running": live, "abandoned": abandoned, "lost": lost,
            "waiting": sorted(t for t, v in states.items() if v == "waiting"),  # parked for a person's answer
            "robots": sorted({g.get("robot", "") for g in graph.values()} - {""}),
        })
    return out


RECENT_WINDOW = 3600.0  # seconds: what "recent" means for the failed-runs line and gauge
RECENT_SCAN_LIMIT = 5000  # run records read at most per look (newest first)


def recent_run_statuses(connection: RedisClient, keys: Keys, window: float = RECENT_WINDOW) -> dict[str, list[str]]:
    """Status -> ids of the runs started in the last ``window`` seconds (newest first, at
    most :data:`RECENT_SCAN_LIMIT`), one pipelined read: what the ``status`` problem line
    and the ``robot_lab_runs_recent`` gauge count."""
    ids = [_s(r) for r in _shared_index(connection, "zrevrangebyscore", keys.runs_index(), "+inf",
                                        time.time() - window, start=0, num=RECENT_SCAN_LIMIT)]
    if not ids:
        return {}
    pipe = connection.pipeline(transaction=False)
    for run_id in ids:
        pipe.hget(keys.run(run_id), "status")  # one slot per run on a cluster
    out: dict[str, list[str]] = {}
    for run_id, status in zip(ids, pipe.execute()):
        if status is not None:
            out.setdefault(_s(status), []).append(run_id)
    return out


def failed_runs_problem(connection: RedisClient, keys: Keys) -> str | None:
    """The problem line for runs that finished with failed tasks lately, or None."""
    statuses = recent_run_statuses(connection, keys)
    if not statuses:
        return None
    from robot_lab.network.run_state import RUN_COMPLETED_WITH_ERRORS  # lazy: start-up time

    failed = statuses.get(RUN_COMPLETED_WITH_ERRORS, [])
    if not failed:
        return None
    shown = ", ".join(failed[:3]) + (", ..." if len(failed) > 3 else "")
    return (f"{len(failed)} run(s) with failed tasks in the last hour ({shown}; "
            f"`robot-lab runs --status {RUN_COMPLETED_WITH_ERRORS}`, `robot-lab watch <run>` for their errors)")


def rq_queue_robots(connection: RedisClient, keys: Keys) -> list[str]:
    """Robots whose ``robot:<name>`` queue rq knows (``rq:queues``) or an rq worker -- a plain
    ``rq worker robot:<name>`` included -- listens on, and whose spec is published under this
    prefix (rq's keys are not prefixed: the spec says the robot is this prefix's; every run
    publishes its robots' specs). So a robot served only by plain rq workers is listed while
    idle, with queue depth 0. Two pipelined reads of rq's sets, one of EXISTS."""

    rq = rq_connection(connection)
    queue_prefix = _rq_key("queue:robot:")
    names = {_s(q)[len(queue_prefix):] for q in rq.smembers(_rq_key("queues")) if _s(q).startswith(queue_prefix)}
    workers = sorted(_s(w) for w in rq.smembers(_rq_key("workers")))
    if workers:
        pipe = rq.pipeline(transaction=False)
        for key in workers:
            pipe.hget(key, "queues")
        for queues in pipe.execute():
            names.update(q.removeprefix("robot:") for q in _s(queues or b"").split(",") if q.startswith("robot:"))
    candidates = sorted(n for n in names if n)
    if not candidates:
        return []
    pipe = connection.pipeline(transaction=False)
    for name in candidates:
        pipe.exists(keys.robot_spec(name))  # one slot per robot on a cluster
    return [name for name, published in zip(candidates, pipe.execute()) if published]


def known_robots(connection: RedisClient, keys: Keys, workers: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """Robots of this prefix: the bus registry, live workers, robots of active runs, and
    published robots with an rq queue or rq worker (:func:`rq_queue_robots`). (No SCAN of
    published specs: on a large keyspace that is thousands of round trips.)"""
    names = {_s(r) for r in _shared_index(connection, "smembers", keys.registry())}
    for worker in workers:
        names.update(worker.get("robots", []))
    for run in runs:
        names.update(run["robots"])
    names.update(rq_queue_robots(connection, keys))
    return sorted(n for n in names if n)


def robot_rows(connection: RedisClient, keys: Keys, robots: list[str], workers: list[dict[str, Any]],
               runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not robots:
        return []
    from rq import Queue  # lazy: start-up time
    from rq.registry import FailedJobRegistry, StartedJobRegistry  # lazy: start-up time

    from robot_lab.bus.inbox_stats import inbox_stats  # lazy: start-up time (no Bus: schemas, signing)

    inbox = {s.robot: s for s in inbox_stats(connection, keys, robots)}
    registered = rq_registrations(connection, [queue_name(r) for r in robots], {w["name"] for w in workers})
    rows = []
    rq = rq_connection(connection)
    for robot in robots:
        queue = Queue(queue_name(robot), connection=rq)  # counts only: no job is deserialized
        alive = [w["name"] for w in workers if robot in w.get("robots", []) and w.get("role") != "bus"]
        bus_alive = [w["name"] for w in workers if robot in w.get("bus", [])]
        stats = inbox.get(robot)
        rows.append({
            "robot": robot,
            "queue": queue.name,
            "queue_key": queue.key,
            "queued": queue.count,
            # cleanup=False: status is read-only (rq's cleanup would move expired jobs)
            "started": StartedJobRegistry(queue=queue).get_job_count(cleanup=False),
            "failed": FailedJobRegistry(queue=queue).get_job_count(cleanup=False),
            "workers": len(alive),
            "worker_names": alive,
            "bus_workers": len(bus_alive),
            "rq_workers": len(registered[queue.name]["live"]),
            "rq_worker_names": registered[queue.name]["live"],
            "stale_rq_workers": registered[queue.name]["stale"],
            "running": sum(1 for r in runs for t in r["running"] if t["robot"] == robot),
            "abandoned": sum(1 for r in runs for t in r["abandoned"] if t["robot"] == robot),
            "lost": sum(1 for r in runs for t in r["lost"] if t["robot"] == robot),
            "bus_length": stats.length if stats else 0,
            "bus_pending": stats.pending if stats else 0,
            "bus_lag": stats.lag if stats else None,
            "bus_consumers": stats.consumers if stats else 0,
            "dlq": stats.dlq if stats else 0,
        })
    return rows


def stalled_conversation_problems(connection: RedisClient, keys: Keys, robots: list[str]) -> list[str]:
    """One line per conversation whose head has waited longer than the visibility timeout
    plus one reclaim sweep with no live consumer running it (bus/stalls.py)."""

    if not robots:
        return []

    from robot_lab.bus.stalls import stalled_conversations  # lazy: start-up time

    # what stalled_conversations reads of a Bus, without building one (schemas, signing)
    bus = SimpleNamespace(redis=connection, keys=keys, settings=get_settings().bus)
    found = []
    for robot in robots:
        try:
            found += [s.describe() for s in stalled_conversations(bus, robot)]
        except Exception as exc:  # a wrong-typed key is reported by wrong_type_problems
            if not is_wrong_type(exc):
                raise
    return found


def shared_expected_types(keys: Keys) -> dict[str, str]:
    """The shared indexes any worker's Redis user may write (``robot-lab acl``:
    SHARED_FOR_WORKERS) that ``robot-lab status`` and ``robot-lab pending`` read, and their
    types: one set to a string by hand would otherwise fail those commands whole with a
    WRONGTYPE that names no key."""
    return {keys.registry(): "set", keys.workers(): "zset", keys.runs_index(): "zset", keys.runs_active(): "set",
            keys.inputs_pending(): "zset", keys.inputs_deadlines(): "zset",
            keys.builds_handed(): "zset"}


def shared_index_problems(connection: RedisClient, keys: Keys) -> list[str]:
    """One line per shared index of the wrong type (read as empty meanwhile)."""
    return [f"{problem} (written by hand?): read as empty; delete it and robot-lab starts it anew"
            for problem in wrong_typed(connection, shared_expected_types(keys))]


def wrong_type_problems(connection: RedisClient, keys: Keys, robots: list[str]) -> list[str]:
    """One line per bus key of the wrong type (each stops its robot's poller)."""
    from robot_lab.bus.key_types import wrong_typed_keys  # lazy: `runs` loads no bus package

    return [f"{robot}: {problem} (its bus poller cannot serve until the key is deleted or renamed)"
            for robot in robots for problem in wrong_typed_keys(connection, keys, robot)]


def collect_status(connection: RedisClient | None = None, keys: Keys | None = None, robots: list[str] | None = None) -> dict[str, Any]:
    """The whole ``robot-lab status --json`` document."""

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    shared = shared_index_problems(connection, keys)
    workers = live_workers(connection, keys)
    runs = active_runs(connection, keys)
    unknown = unknown_robots(connection, keys, robots, workers, runs) if robots else []
    names = [r for r in robots if r not in unknown] if robots else known_robots(connection, keys, workers, runs)
    wrong_types = wrong_type_problems(connection, keys, names)
    rows = robot_rows(connection, keys, names, workers, runs)
    problems = [f"unknown robot {name!r}: no inbox, queue, worker, run or published spec under prefix "
                f"{keys.prefix!r} (`robot-lab status` lists the known ones)" for name in unknown]
    for row in rows:
        if row["abandoned"]:
            problems.append(f"{row['robot']}: {row['abandoned']} abandoned task(s) (worker lost); "
                            "a running worker or `robot-lab watch --all` requeues them")
        if row["lost"]:
            problems.append(f"{row['robot']}: {row['lost']} queued task(s) whose rq job is missing")
        if row["queued"] and not row["workers"] and not row["rq_workers"]:
            problems.append(f"{row['robot']}: {row['queued']} queued job(s) and no live worker on {row['queue']} "
                            f"(start one: robot-lab worker {row['robot']})")
        elif (row["abandoned"] or row["lost"]) and not row["workers"] and not row["rq_workers"]:
            problems.append(f"{row['robot']}: a run waits on it and no live worker serves {row['queue']} "
                            f"(start one: robot-lab worker {row['robot']})")
        if row["stale_rq_workers"]:
            problems.append(f"{row['robot']}: rq still lists {len(row['stale_rq_workers'])} dead worker(s) on "
                            f"{row['queue']} ({', '.join(row['stale_rq_workers'])}); not counted as live")
        if row["dlq"]:
            problems.append(f"{row['robot']}: {row['dlq']} dead letter(s) (robot-lab dlq list {row['robot']})")
    orphans = orphan_inbox_problems(connection, keys, rows, runs)
    for row in rows:
        if row["bus_lag"] and not row["bus_workers"] and not any(f"inbox {row['robot']!r}:" in o for o in orphans):
            problems.append(f"{row['robot']}: {row['bus_lag']} unread message(s) in its inbox and no live "
                            f"robot-lab worker serving it (start one: robot-lab worker {row['robot']})")
    problems += orphans
    problems += stalled_conversation_problems(connection, keys, names)
    problems += stalled_problems(connection, keys)  # runs pinned to a build no live worker serves
    problems += wrong_types
    problems += shared
    failed_runs = failed_runs_problem(connection, keys)
    if failed_runs:
        problems.append(failed_runs)
    settings = get_settings()
    return {
        "prefix": keys.prefix,
        "redis": redact_url(settings.redis_url) or "embedded",
        "time": time.time(),
        "robots": rows,
        "workers": workers,
        "a2a": live_a2a_servers(connection, keys),
        "runs": runs,
        "abandoned": [t for r in runs for t in r["abandoned"]],
        "lost": [t for r in runs for t in r["lost"]],
        "unknown": unknown,
        "problems": problems,
    }


def unknown_robots(connection: RedisClient, keys: Keys, names: list[str], workers: list[dict[str, Any]],
                   runs: list[dict[str, Any]]) -> list[str]:
    """The names among ``names`` that nothing of this prefix knows (a typo, another prefix)."""
    known = set(known_robots(connection, keys, workers, runs))
    candidates = [n for n in names if n not in known]
    if not candidates:
        return []
    # one key per EXISTS: on Redis Cluster these keys sit in different slots
    rq = rq_connection(connection)
    pipe, rq_pipe = connection.pipeline(transaction=False), rq.pipeline(transaction=False)
    for name in candidates:
        pipe.exists(keys.robot_spec(name))
        pipe.exists(keys.inbox(name))
        rq_pipe.exists(_rq_key("queue:" + queue_name(name)))
        rq_pipe.exists(_rq_key("workers:" + queue_name(name)))
    ours, theirs = pipe.execute(), rq_pipe.execute()
    return [n for i, n in enumerate(candidates) if not any(ours[2 * i:2 * i + 2] + theirs[2 * i:2 * i + 2])]


def orphan_inbox_problems(connection: RedisClient, keys: Keys, rows: list[dict[str, Any]],
                          runs: list[dict[str, Any]]) -> list[str]:
    """An inbox is an orphan when it is registered but no robot of that name is published,
    served (robot-lab worker, rq worker, bus consumer) or used by an active run -- what a
    mistyped ``send --create`` leaves behind."""
    in_runs = {robot for run in runs for robot in run["robots"]}
    candidates = [r for r in rows if r["robot"] not in in_runs and not r["workers"] and not r["bus_workers"]
                  and not r["rq_workers"] and not r["bus_consumers"]]
    if not candidates:
        return []
    registered = {_s(r) for r in _shared_index(connection, "smembers", keys.registry())}
    candidates = [r for r in candidates if r["robot"] in registered]
    pipe = connection.pipeline(transaction=False)
    for row in candidates:
        pipe.exists(keys.robot_spec(row["robot"]))
    return [
        f"orphan inbox {row['robot']!r}: registered, but no robot of that name is published or served "
        f"({row['bus_length']} message(s) in it; a mistyped `send --create`? remove it with "
        f"`robot-lab bus remove {row['robot']}`)"
        for row, published in zip(candidates, pipe.execute()) if not published
    ]


def recent_runs(connection: RedisClient | None = None, keys: Keys | None = None, limit: int = 20,
                status: str | None = None) -> list[dict[str, Any]]:
    """The latest runs (newest first): status, duration, task counts, tokens and cost."""

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    out: list[dict[str, Any]] = []
    now = time.time()
    for raw in _shared_index(connection, "zrevrange", keys.runs_index(), 0, max(limit * 4, limit) - 1):
        run_id = _s(raw)
        key = keys.run(run_id)
        meta = connection.hmget(key, "network", "status", "created_at", "finished_at")
        if meta[0] is None:
            continue
        run_status = _s(meta[1])
        if status and run_status != status:
            continue
        created = float(meta[2] or 0)
        finished = float(meta[3]) if meta[3] else None
        states = [_s(v) for v in connection.hvals(key + ":state")]
        tokens_in = tokens_out = 0
        cost = 0.0
        for value in connection.hvals(key + ":results"):
            try:
                result = json.loads(value)
            except ValueError:
                continue
            tokens_in += int(result.get("input_tokens") or 0)
            tokens_out += int(result.get("output_tokens") or 0)
            cost += float(result.get("cost") or 0.0)
        out.append({
            "run_id": run_id, "network": _s(meta[0]), "status": run_status,
            "created_at": created, "finished_at": finished,
            "duration": round((finished or now) - created, 3) if created else None,
            "tasks": len(states), "done": states.count("done"), "failed": states.count("failed"),
            "skipped": states.count("skipped"), "waiting": states.count("waiting"),
            "input_tokens": tokens_in, "output_tokens": tokens_out, "tokens": tokens_in + tokens_out,
            "cost": round(cost, 6),
        })
        if len(out) >= limit:
            break
    return out
