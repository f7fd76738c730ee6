"""Benchmark: an A2A ``message/send`` round trip vs a direct ``Bus.request`` to the same robot.

Run: ``.venv/bin/python bench/a2a.py [--messages 100] [--rounds 3]`` (uses REDIS_URL or
redis://127.0.0.1:6379/0 with a unique key prefix; cleans up after). It starts one
``robot-lab worker echo`` (scripted model) and one ``robot-lab a2a`` process, then alternates,
for ``--rounds`` rounds: (a) ``--messages`` sequential ``Bus.request`` calls to ``echo`` from
this process; (b) as many sequential blocking ``message/send`` calls through the a2a-sdk
client (one HTTP connection, bearer token) to the same robot. Both wait for the robot's
reply; (b) adds the HTTP hop, the JSON-RPC/protobuf layers, the task record and the reply
stream it reads. Prints the medians per message, the ratio (the median of the rounds'
ratios) and the CPU time the a2a process spent per message (steadier than wall time on a
loaded machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this file is named a2a.py: its own folder first on sys.path would shadow the a2a-sdk package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")

APP = 'from robot_lab import App\napp = App("bench", import_path="bench_a2a_app:app")\napp.robot("echo", model="scripted/echo")\n'
TOKEN = "bench-token"


def _url() -> str:
    return os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit("processes did not come up")
        time.sleep(0.2)


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_bus(bus, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        reply = bus.request("echo", f"bus {i}", timeout=30, from_="bench")
        assert reply.content == f"echo: bus {i}", reply.content
    return (time.perf_counter() - started) / n


async def bench_a2a(base: str, n: int) -> float:
    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        client = await create_client(f"{base}/robots/echo", client_config=ClientConfig(streaming=False, httpx_client=http))
        started = time.perf_counter()
        for i in range(n):
            request = SendMessageRequest(message=Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER,
                                                         parts=[Part(text=f"a2a {i}")]))
            async for response in client.send_message(request):
                assert response.task.artifacts[0].parts[0].text == f"echo: a2a {i}", response
        return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import httpx
    import redis

    prefix = f"bench-a2a-{uuid.uuid4().hex[:6]}"
    url = _url()
    os.environ.update(REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix)
    directory = Path(tempfile.mkdtemp(prefix="bench-a2a-"))
    (directory / "bench_a2a_app.py").write_text(APP)
    env = dict(os.environ, PYTHONPATH=f"{directory}:{ROOT}", ROBOT_LAB_LOG_LEVEL="WARNING",
               ROBOT_LAB_A2A__TOKENS=f'{{"bench": "{TOKEN}"}}')
    exe = str(Path(sys.executable).parent / "robot-lab")
    port = _port()
    procs = [subprocess.Popen([exe, "worker", "echo", "--app", "bench_a2a_app:app"], env=env,
                              stdout=open(directory / "worker.log", "wb"), stderr=subprocess.STDOUT),
             subprocess.Popen([exe, "a2a", "--app", "bench_a2a_app:app", "--port", str(port)], env=env,
                              stdout=open(directory / "a2a.log", "wb"), stderr=subprocess.STDOUT)]
    base = f"http://127.0.0.1:{port}"
    conn = redis.Redis.from_url(url)
    try:
        def up() -> bool:
            try:
                groups = conn.xinfo_groups(f"{prefix}:bus:echo")
                return any(g["consumers"] for g in groups) and httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except Exception:
                return False

        _wait(up)
        from robot_lab.bus import Bus

        bus = Bus()
        bench_bus(bus, 5)
        asyncio.run(bench_a2a(base, 5))  # warm both paths
        direct, over_a2a, ratios, tier_cpu = [], [], [], []
        for _ in range(args.rounds):
            d = bench_bus(bus, args.messages)
            before = _cpu(procs[1].pid)
            a = asyncio.run(bench_a2a(base, args.messages))
            tier_cpu.append((_cpu(procs[1].pid) - before) / args.messages)
            direct.append(d)
            over_a2a.append(a)
            ratios.append(a / d)
        print(f"{args.messages} messages x {args.rounds} rounds, robot 'echo' (scripted), one worker, one a2a process")
        print(f"(a) Bus.request round trip      : {statistics.median(direct) * 1000:7.2f} ms/message")
        print(f"(b) A2A message/send round trip : {statistics.median(over_a2a) * 1000:7.2f} ms/message")
        print(f"ratio (b)/(a), median of rounds: {statistics.median(ratios):.2f}x")
        print(f"CPU of the a2a process per message: {statistics.median(tier_cpu) * 1000:.2f} ms "
              f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
        for key in conn.scan_iter(match="rq:*:robot:echo", count=1000):
            conn.delete(key)


if __name__ == "__main__":
    main()
