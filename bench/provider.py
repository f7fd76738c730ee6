"""What robot-lab adds to a real model call: ``robot.run`` against ``litellm.completion`` and
the ``openai`` SDK, all three calling the same llama.cpp ``llama-server`` (../shared/tools,
the tiny tool-calling model; see tests/provider_servers.py), plain and streamed.

Each round calls every side once with the same messages (temperature 0, the same
``max_tokens``), the order rotating round by round so no side always runs first; printed per
mode: the median wall time per call of each side and the ratios robot/litellm and
robot/SDK. Then, with ``--worker-tasks N``, a real ``robot-lab worker`` serving a robot on
that server runs N network tasks in batches and its RSS is printed after each batch (does
the growth stop?). Needs Redis for that part (REDIS_URL, default redis://127.0.0.1:6379/0).

    python bench/provider.py --rounds 60 --worker-tasks 300
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "WARNING")
os.environ["ROBOT_LAB_ALLOW_MODEL_REQUESTS"] = "1"
# The per-call comparison runs embedded (no Redis in the way); the worker part uses this one.
WORKER_REDIS_URL = os.environ.pop("REDIS_URL", None) or "redis://127.0.0.1:6379/0"

from tests.provider_servers import MODEL_ALIAS, shared_dir, start_llama_server  # noqa: E402

MESSAGES = [{"role": "user", "content": "say something short"}]
MAX_TOKENS = 16


def sides(base_url: str, stream: bool) -> dict[str, Callable[[], str]]:
    import litellm
    import openai

    from robot_lab.runtime.robot import build

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    robot = build("bench", model=f"openai/{MODEL_ALIAS}", api_base=base_url, temperature=0, max_tokens=MAX_TOKENS)
    params = {"temperature": 0, "max_tokens": MAX_TOKENS}

    def sdk() -> str:
        if not stream:
            return client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, **params).choices[0].message.content or ""  # type: ignore[arg-type]
        parts = client.chat.completions.create(model=MODEL_ALIAS, messages=MESSAGES, stream=True,  # type: ignore[arg-type]
                                               stream_options={"include_usage": True}, **params)
        return "".join((p.choices[0].delta.content or "") for p in parts if p.choices)

    def via_litellm() -> str:
        if not stream:
            r = litellm.completion(model=f"openai/{MODEL_ALIAS}", messages=MESSAGES, api_base=base_url,
                                   api_key="none", max_retries=0, **params)
            return r.choices[0].message.content or ""
        parts = litellm.completion(model=f"openai/{MODEL_ALIAS}", messages=MESSAGES, api_base=base_url, api_key="none",
                                   max_retries=0, stream=True, stream_options={"include_usage": True}, **params)
        chunks = list(parts)
        litellm.stream_chunk_builder(chunks, messages=MESSAGES)  # the reply and its usage, as a caller needs
        return "".join((p.choices[0].delta.content or "") for p in chunks if p.choices)

    def via_robot() -> str:
        robot.messages = []
        result = robot.run(MESSAGES[0]["content"], on_content=(lambda c: None) if stream else None)
        return result.reply

    return {"sdk": sdk, "litellm": via_litellm, "robot": via_robot}


def measure(base_url: str, stream: bool, rounds: int) -> dict[str, float]:
    calls = sides(base_url, stream)
    for fn in calls.values():  # warm: imports, connections, the server's prompt cache
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for i in range(rounds):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            started = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker_rss(base_url: str, tasks: int, batch: int) -> None:
    import redis
    from rq import Queue, Worker

    from robot_lab.runtime.registry import publish_specs
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    url = WORKER_REDIS_URL
    prefix = f"bench-provider-{uuid.uuid4().hex[:6]}"
    os.environ.update(REDIS_URL=url, ROBOT_LAB_KEY_PREFIX=prefix)
    from robot_lab.settings import reload_settings

    reload_settings()  # the calls above ran embedded; the worker part talks to this Redis
    client = redis.Redis.from_url(url)
    robot = build(f"llama-{uuid.uuid4().hex[:6]}", model=f"openai/{MODEL_ALIAS}", api_base=base_url,
                  max_tokens=MAX_TOKENS, temperature=0)
    publish_specs([robot.to_spec()], connection=client)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    log = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen([str(Path(sys.executable).parent / "robot-lab"), "worker", robot.name, "--no-bus"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        queue = Queue(f"robot:{robot.name}", connection=client)
        deadline = time.monotonic() + 120
        while not Worker.all(queue=queue) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"worker RSS after start: {rss_mb(proc.pid):.0f} MB")
        coordinator = Coordinator(connection=client)
        done = 0
        while done < tasks:
            net = create_network(f"bench-{done}")
            with net.parallel("all"):
                for i in range(batch):
                    net.task(f"t{i}", robot)
            result = coordinator.submit(net, "say something short").wait(timeout=300)
            failed = [name for name, r in result.context.items() if r.error]
            done += batch
            print(f"worker RSS after {done:4d} tasks: {rss_mb(proc.pid):.0f} MB" + (f" ({len(failed)} failed)" if failed else ""))
    finally:
        proc.terminate()
        proc.wait(20)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        for name in (f"rq:queue:robot:{robot.name}",):
            client.delete(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--worker-tasks", type=int, default=0)
    parser.add_argument("--batch", type=int, default=20)
    args = parser.parse_args()
    shared = shared_dir()
    if shared is None:
        sys.exit("llama-server not found in ../shared/tools (set ROBOT_LAB_TEST_SHARED_DIR)")
    server = start_llama_server(shared, Path(tempfile.mkdtemp(prefix="bench-llama-")) / "server.log")
    try:
        for stream in (False, True):
            medians = measure(server.base_url, stream, args.rounds)
            mode = "streamed" if stream else "plain"
            print(f"{mode:8s} per call (median of {args.rounds}): sdk {medians['sdk'] * 1000:.1f} ms, "
                  f"litellm {medians['litellm'] * 1000:.1f} ms, robot.run {medians['robot'] * 1000:.1f} ms; "
                  f"robot/litellm {medians['robot'] / medians['litellm']:.2f}x, "
                  f"robot/sdk {medians['robot'] / medians['sdk']:.2f}x")
        if args.worker_tasks:
            worker_rss(server.base_url, args.worker_tasks, args.batch)
    finally:
        assert server.process is not None
        server.process.terminate()
        server.process.wait(10)


if __name__ == "__main__":
    main()
