"""What one ``robot-lab worker`` process costs: time to ready, resident memory and import
time, for a robot on the scripted model and for a robot on a provider model (which needs
litellm), beside an idle plain ``rq worker`` on a queue of its own (the baseline).

For each model a real ``robot-lab worker <robot>`` process is started (bus poller, sweeper,
rq worker, as in production) with ``-X importtime``. *Ready* is the time from spawn until it
serves both doors: rq lists it on the robot's queue and its bus poller reads the inbox (a
consumer in the inbox's group). Its RSS is read from /proc then; for the provider model also
once litellm has loaded in the background (the worker's ``worker.litellm_loaded`` line);
then one network task runs through it and the RSS is read again. Printed per worker: ready
seconds, RSS at ready, RSS with litellm loaded, RSS after a task, whether litellm was
imported, the total import time and the costliest packages, and each figure's ratio to the
idle ``rq worker``. (The provider model's task is refused offline --
``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0`` -- so no request leaves the machine.)

``--narrow`` also measures whether litellm can be imported narrowly: the CPU and peak RSS of
a process importing ``litellm``, one of its submodules, and ``openai`` + ``httpx`` alone.

    python bench/worker_memory.py [--narrow]   # REDIS_URL or redis://127.0.0.1:6379/0, unique key prefix
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ["ROBOT_LAB_ALLOW_MODEL_REQUESTS"] = "0"

MODELS = {"scripted": "scripted/echo", "litellm": "openai/gpt-4o-mini"}
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def import_profile(stderr: str) -> tuple[float, dict[str, float]]:
    """Total import time (s) and each top-level package's own cumulative import time (s),
    from ``-X importtime`` output."""
    total = 0.0
    packages: dict[str, float] = {}
    for line in stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if not match:
            continue
        cumulative, indent, name = int(match.group(2)) / 1e6, len(match.group(3)), match.group(4)
        if indent == 1:  # a module imported by no other module (at start-up or lazily)
            total += cumulative
        if "." not in name:
            packages[name] = max(packages.get(name, 0.0), cumulative)
    return total, packages


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (a worker's warm shutdown), then SIGKILL to its session after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def inbox_served(connection, inbox: str, group: str) -> bool:
    """The bus poller reads the inbox: its group has a consumer (created on the first read)."""
    try:
        return any(c.get("name") for c in connection.xinfo_consumers(inbox, group))
    except Exception:  # noqa: BLE001 - no stream or no group yet
        return False


def wait_for_log(log: Path, needle: str, proc: subprocess.Popen, timeout: float) -> float | None:
    """Seconds until ``needle`` appears in ``log`` (None if the process exits or time runs out)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if needle in log.read_text(errors="replace"):
            return time.monotonic() - started
        if proc.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def measure_rq(url: str, workdir: Path) -> dict[str, object]:
    """An idle plain ``rq worker`` on a queue of its own: spawn -> listed by rq, and its RSS."""
    import redis
    from rq import Queue, Worker

    connection = redis.Redis.from_url(url)
    name = f"rlbench-rq-{uuid.uuid4().hex[:6]}"
    rq = shutil.which("rq") or str(Path(sys.executable).parent / "rq")
    started = time.monotonic()
    with open(workdir / "rq.err", "wb") as err:
        proc = subprocess.Popen([rq, "worker", "--url", url, name], stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    try:
        queue = Queue(name, connection=connection)
        while not Worker.all(queue=queue):
            if proc.poll() is not None or time.monotonic() - started > 120:
                raise RuntimeError(f"rq worker did not start:\n{(workdir / 'rq.err').read_text()[-3000:]}")
            time.sleep(0.05)
        ready = time.monotonic() - started
        time.sleep(0.5)
        return {"ready": ready, "warm": rss_mb(proc.pid)}
    finally:
        stop(proc)


def narrow_imports() -> list[tuple[str, float, float]]:
    """(statement, CPU seconds, peak RSS MiB) of a fresh interpreter running each import."""
    rows = []
    for statement in ("import litellm", "import litellm.types.utils", "import litellm.llms.openai.openai",
                      "import openai, httpx"):
        code = (f"{statement}\nimport resource\nu = resource.getrusage(resource.RUSAGE_SELF)\n"
                "print(u.ru_utime + u.ru_stime, u.ru_maxrss / 1024)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env=dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True"))
        cpu, rss = out.stdout.split()[-2:]
        rows.append((statement, float(cpu), float(rss)))
    return rows


def measure(url: str, label: str, model: str, prefix: str, workdir: Path) -> dict[str, object]:
    import redis
    from rq import Queue, Worker

    from robot_lab.runtime.registry import publish_specs
    from robot_lab.keys import Keys
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    connection = redis.Redis.from_url(url)
    keys = Keys(prefix=prefix)
    bot = build(f"mem-{label}-{uuid.uuid4().hex[:6]}", model=model)
    publish_specs([bot.to_spec()], connection=connection, keys=keys)
    env = dict(os.environ, REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix, PYTHONPROFILEIMPORTTIME="1",
               ROBOT_LAB_LOG_LEVEL="INFO")  # for worker.litellm_loaded
    script = shutil.which("robot-lab") or str(Path(sys.executable).parent / "robot-lab")
    log = workdir / f"{label}.err"
    started = time.monotonic()
    with open(log, "wb") as err:
        proc = subprocess.Popen([script, "worker", bot.name], env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    try:
        queue = Queue(f"robot:{bot.name}", connection=connection)
        deadline = time.monotonic() + 120
        while not (Worker.all(queue=queue) and inbox_served(connection, keys.inbox(bot.name), bot.name)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        ready = time.monotonic() - started
        warm = rss_mb(proc.pid)
        litellm_at = None
        loaded = warm
        if not model.startswith("scripted/"):
            waited = wait_for_log(log, "worker.litellm_loaded", proc, 180)
            litellm_at = None if waited is None else ready + waited
            loaded = rss_mb(proc.pid)
        network = create_network(f"mem-{label}")
        network.task("only", bot)
        handle = Coordinator(connection=connection, keys=keys).submit(network, "hi")
        handle.wait(timeout=60)
        after = rss_mb(proc.pid)
    finally:
        stop(proc)
    total, packages = import_profile(log.read_text(errors="replace"))
    return {"model": model, "ready": ready, "warm": warm, "loaded": loaded, "litellm_at": litellm_at,
            "after": after, "litellm": "litellm" in packages, "import_s": total, "packages": packages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=6, help="how many of the costliest imports to list")
    parser.add_argument("--narrow", action="store_true", help="also measure narrow litellm imports")
    args = parser.parse_args()
    import redis

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"rlbench-{uuid.uuid4().hex[:8]}"
    connection = redis.Redis.from_url(url)
    print(f"redis: {url}  prefix: {prefix}  python {sys.version.split()[0]}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            baseline = measure_rq(url, Path(tmp))
            rows = {label: measure(url, label, model, prefix, Path(tmp)) for label, model in MODELS.items()}
    finally:
        found = list(connection.scan_iter(match=f"{prefix}*", count=1000))
        if found:
            connection.delete(*found)
    print(f"{'worker serving':28} {'ready':>7} {'RSS ready':>10} {'+litellm':>9} {'after task':>11} "
          f"{'imports':>8} {'litellm':>8}")
    print(f"{'idle rq worker (baseline)':28} {baseline['ready']:6.2f}s {baseline['warm']:7.0f} MB")
    for label, row in rows.items():
        print(f"{label + ' (' + str(row['model']) + ')':28} {row['ready']:6.2f}s {row['warm']:7.0f} MB "
              f"{row['loaded']:6.0f} MB {row['after']:8.0f} MB {row['import_s']:7.2f}s "
              f"{'yes' if row['litellm'] else 'no':>8}")
    for label, row in rows.items():
        line = (f"  {label}: ready {row['ready'] / baseline['ready']:.2f}x the rq worker's, RSS at ready "
                f"{row['warm'] / baseline['warm']:.2f}x, after a task {row['after'] / baseline['warm']:.2f}x")
        if row["litellm_at"] is not None:
            line += f"; litellm loaded in the background {row['litellm_at']:.1f} s after spawn"
        print(line)
    for label, row in rows.items():
        packages = row["packages"]
        assert isinstance(packages, dict)
        top = sorted(packages.items(), key=lambda item: -item[1])[: args.top]
        print(f"  costliest imports, {label}: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in top))
    saved = rows["litellm"]["loaded"] - rows["scripted"]["warm"]  # type: ignore[operator]
    print(f"a scripted-model worker saves {saved:.0f} MB of RSS by not loading litellm")
    if args.narrow:
        print("narrow litellm imports (fresh interpreter each): CPU s, peak RSS")
        for statement, cpu, rss in narrow_imports():
            print(f"  {statement:38} {cpu:5.2f} s {rss:6.0f} MB")


if __name__ == "__main__":
    main()
