"""The Procfile, started by the real ``honcho`` against a real Redis, runs the demo network
end to end and stops cleanly on SIGTERM (no process of its session left behind).

rq queues (``robot:classifier`` ...) are not prefixed, so this test uses its own Redis
database (index 9 of the test server) and a unique key prefix: no other test's worker can
take the demo's jobs, and its workers take no one else's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.ports import free_port
from tests.redis_server import REPO_ROOT, wait_for
from tests.worker_procs import VENV_BIN, child_env

pytestmark = pytest.mark.slow

DEMO_ROBOTS = ("classifier", "billing", "technical", "general", "sentiment", "urgency", "summarizer")
PROCFILE = REPO_ROOT / "Procfile"
OTHERS = ("coordinator", "metrics", "dashboard", "a2a")


def _free_port(span: int = 1) -> int:
    """A free port with ``span - 1`` more above it in range (honcho's -p base: +100 per type)."""
    while True:
        port = free_port()
        if port + span < 65535:
            return port


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as res:
        return res.read().decode()


def _db_url(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def _descendants(root: int) -> list[int]:
    """Live processes below ``root`` (honcho starts each process type in a session of its
    own, so the session of honcho holds only honcho)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == sid:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(entry.name))
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
    return pids


def test_procfile_process_types():
    lines = [ln for ln in PROCFILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    types = dict(ln.split(":", 1) for ln in lines)
    workers = {name: cmd for name, cmd in types.items() if name not in OTHERS}
    served = " ".join(workers.values())
    for robot in DEMO_ROBOTS:
        assert f" {robot}" in served, robot
    assert all("--app robot_lab.demo:app" in cmd and "--metrics-port $PORT" in cmd for cmd in workers.values())
    assert types["coordinator"].strip() == "robot-lab watch --all"
    assert types["dashboard"].strip().startswith("robot-lab dashboard")
    assert types["metrics"].strip().startswith("robot-lab metrics")
    assert types["a2a"].strip().startswith("robot-lab a2a --app robot_lab.demo:app")


def test_honcho_start_runs_the_demo_network_and_stops_cleanly(real_redis_url, key_prefix, tmp_path):
    url = _db_url(real_redis_url, 9)
    conn = redis.Redis.from_url(url)
    ports = {"DASHBOARD_PORT": str(_free_port()), "METRICS_PORT": str(_free_port()), "A2A_PORT": str(_free_port())}
    env = child_env(url, key_prefix, ROBOT_LAB_DEMO_DELAY_MS="0", ROBOT_LAB_HEALTH_DIR=str(tmp_path / "health"),
                    **ports)
    base_port = _free_port(1000)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ROBOT_LAB_TASK_LEASE_MS")
    log = open(tmp_path / "honcho.log", "wb")
    honcho = subprocess.Popen([str(VENV_BIN / "honcho"), "start", "-f", str(PROCFILE), "-d", str(REPO_ROOT),
                               "-p", str(base_port)],
                              env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        from rq import Queue, Worker

        def all_listening() -> bool:  # (this honcho's workers: see below)
            ours = set(_descendants(honcho.pid))
            return all(any(w.pid in ours for w in Worker.all(queue=Queue(f"robot:{r}", connection=conn)))
                       for r in DEMO_ROBOTS)

        wait_for(all_listening, timeout=75, interval=0.3)
        run = subprocess.run(
            [str(VENV_BIN / "robot-lab"), "run", "robot_lab.demo:support", "The app crashes on login",
             "--json", "--timeout", "40"],
            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        )
        assert run.returncode == 0, run.stdout + run.stderr + (tmp_path / "honcho.log").read_text()[-3000:]
        data = json.loads(run.stdout.strip().splitlines()[-1])
        assert data["status"] == "completed" and data["final_task"] == "summarize"
        assert data["states"]["technical"] == "done" and data["states"]["billing"] == "skipped"
        assert "Technical: the login crash" in data["reply"] and "urgency: high" in data["reply"]
        # this honcho's workers only: a worker of an earlier run on the same Redis that was
        # killed (no deregistration) stays listed for rq's worker TTL
        ours = set(_descendants(honcho.pid))
        workers = {w.name for r in DEMO_ROBOTS for w in Worker.all(queue=Queue(f"robot:{r}", connection=conn))
                   if w.pid in ours}
        assert len(workers) == len(DEMO_ROBOTS)  # one process type per robot

        # observability of the same run: the classifier (the first type) serves on the base
        # port, the exporter and the dashboard on theirs
        classifier = _get(f"http://127.0.0.1:{base_port}/metrics")
        assert 'robot_lab_tasks_total{outcome="done",robot="classifier"} 1.0' in classifier
        gauges = _get(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics")
        assert 'robot_lab_queue_depth{queue="tasks",robot="summarizer"} 0.0' in gauges
        overview = json.loads(_get(f"http://127.0.0.1:{ports['DASHBOARD_PORT']}/api/overview"))
        assert any(r["run_id"] == data["run_id"] and r["status"] == "completed" for r in overview["recent"])
        card = json.loads(_get(f"http://127.0.0.1:{ports['A2A_PORT']}/networks/support/.well-known/agent-card.json"))
        assert card["name"] == "support" and card["capabilities"]["streaming"]

        assert _session_pids(honcho.pid)
        honcho.send_signal(signal.SIGTERM)
        honcho.wait(30)
        deadline = time.monotonic() + 15
        while _session_pids(honcho.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_pids(honcho.pid) == [], (tmp_path / "honcho.log").read_text()[-3000:]
        text = (tmp_path / "honcho.log").read_text()
        assert "SIGTERM received" in text
        assert all(f"{name}.1 stopped" in text for name in (*DEMO_ROBOTS, *OTHERS))
    finally:
        for pid in {*_session_pids(honcho.pid), *_descendants(honcho.pid)}:  # a failed run leaves none behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if honcho.poll() is None:
            honcho.kill()
        honcho.wait(5)
        log.close()
        keys = list(conn.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
        for robot in DEMO_ROBOTS:
            Queue(f"robot:{robot}", connection=conn).delete(delete_jobs=True)
        conn.close()
