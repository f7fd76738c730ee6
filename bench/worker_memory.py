"""What one ``robot-lab worker`` process costs: resident memory and import time, for a robot on
the scripted model and for a robot on a provider model (which needs litellm).

For each model a real ``robot-lab worker <robot>`` process is started (bus poller, sweeper,
rq worker, as in production) with ``-X importtime``; once rq sees it (it has warmed up) its
RSS is read from /proc, then one network task runs through it and the RSS is read again.
Printed per model: RSS warm, RSS after a task, whether litellm was imported, the total import
time and the packages that cost most to import. (The provider model's task is refused
offline -- ``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0`` -- so no request leaves the machine.)

    python bench/worker_memory.py   # REDIS_URL or redis://127.0.0.1:6379/0, unique key prefix
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
    env = dict(os.environ, REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix, PYTHONPROFILEIMPORTTIME="1")
    script = shutil.which("robot-lab") or str(Path(sys.executable).parent / "robot-lab")
    log = workdir / f"{label}.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([script, "worker", bot.name], env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    try:
        queue = Queue(f"robot:{bot.name}", connection=connection)
        deadline = time.monotonic() + 120
        while not Worker.all(queue=queue):  # registered with rq = warmed up
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        time.sleep(0.5)
        warm = rss_mb(proc.pid)
        network = create_network(f"mem-{label}")
        network.task("only", bot)
        handle = Coordinator(connection=connection, keys=keys).submit(network, "hi")
        handle.wait(timeout=60)
        after = rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    total, packages = import_profile(log.read_text(errors="replace"))
    return {"model": model, "warm": warm, "after": after, "litellm": "litellm" in packages,
            "import_s": total, "packages": packages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=6, help="how many of the costliest imports to list")
    args = parser.parse_args()
    import redis

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"rlbench-{uuid.uuid4().hex[:8]}"
    connection = redis.Redis.from_url(url)
    print(f"redis: {url}  prefix: {prefix}  python {sys.version.split()[0]}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = {label: measure(url, label, model, prefix, Path(tmp)) for label, model in MODELS.items()}
    finally:
        found = list(connection.scan_iter(match=f"{prefix}*", count=1000))
        if found:
            connection.delete(*found)
    print(f"{'worker serving':28} {'RSS warm':>9} {'after task':>11} {'imports':>8} {'litellm':>8}")
    for label, row in rows.items():
        print(f"{label + ' (' + str(row['model']) + ')':28} {row['warm']:7.0f} MB {row['after']:8.0f} MB "
              f"{row['import_s']:7.2f}s {'yes' if row['litellm'] else 'no':>8}")
    for label, row in rows.items():
        packages = row["packages"]
        assert isinstance(packages, dict)
        top = sorted(packages.items(), key=lambda item: -item[1])[: args.top]
        print(f"  costliest imports, {label}: " + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in top))
    saved = rows["litellm"]["warm"] - rows["scripted"]["warm"]  # type: ignore[operator]
    print(f"a scripted-model worker saves {saved:.0f} MB of RSS by not loading litellm")


if __name__ == "__main__":
    main()
