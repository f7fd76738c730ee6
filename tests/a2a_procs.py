"""Real processes for the A2A tests: `robot-lab worker`s and `robot-lab a2a` servers on a
real Redis, an app module written for them, and the SDK's own client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port
from tests.redis_server import wait_for
from tests.worker_procs import VENV_BIN, Processes, child_env

TOKEN = "s3cret-token"
OTHER_TOKEN = "another-callers-token"

APP_MODULE = '''
from robot_lab import App, build
from robot_lab.llm.scripted import register_script

register_script("a2a-asker", {{"turns": [
    {{"tool_calls": [{{"name": "ask_user", "arguments": {{"question": "Which order?", "choices": ["A1", "B2"]}}}}]}},
    {{"reply": "refunding {{tool_results}}"}}]}})

app = App("a2atest", import_path="a2a_app:app")
app.robot("echo", model="scripted/echo", description="Echoes what it is told.")
app.robot("slow", model="scripted/sleep:{slow_ms}", description="Echoes, slowly.")
app.robot("asker", model="scripted/a2a-asker", description="Asks which order, then refunds it.",
          local_tools=["robot_lab.runtime.durable.human:AskUser"])
pipeline = app.network("pipeline", description="Three echo steps in a row.")
pipeline.task("first", "slow")
pipeline.task("second", "slow", depends_on="first")
pipeline.task("third", "slow", depends_on="second")
'''

CALLER_MODULE = '''
from robot_lab import App

app = App("callers", import_path="a2a_caller:app")
app.robot("caller", model="scripted/echo", a2a_agents=[{remote!r}], serve_tools="inherit")
desk = app.network("desk")
desk.task("ask", "caller", tools="inherit")
'''

# a robot in a network that calls a remote agent (the asker, behind another process) which asks
ASKING_CALLER_MODULE = '''
from robot_lab import App
from robot_lab.llm.scripted import register_script

register_script("a2a-ask-remote", {{"turns": [
    {{"tool_calls": [{{"name": "a2a_asker", "arguments": {{"message": "refund please"}}}}]}},
    {{"reply": "{{tool_results}}"}}]}})

app = App("asking", import_path="a2a_asking_caller:app")
app.robot("asking-caller", model="scripted/a2a-ask-remote", a2a_agents=[{remote!r}], serve_tools="inherit")
desk = app.network("asking-desk")
desk.task("ask", "asking-caller", tools="inherit")
'''


def write_app(directory: Path, slow_ms: int = 400) -> None:
    (directory / "a2a_app.py").write_text(APP_MODULE.format(slow_ms=slow_ms))


def a2a_env(url: str, prefix: str, directory: Path, **extra: str) -> dict[str, str]:
    env = child_env(url, prefix, ROBOT_LAB_A2A__TOKENS=f'{{"tester": "{TOKEN}", "other": "{OTHER_TOKEN}"}}', **extra)
    env["PYTHONPATH"] = f"{directory}:{env['PYTHONPATH']}"
    return env


def start_worker(procs: Processes, env: dict[str, str], app: str, robots: list[str], name: str) -> Any:
    return procs.start([str(VENV_BIN / "robot-lab"), "worker", *robots, "--app", app], env, name)


def start_server(procs: Processes, env: dict[str, str], app: str, name: str, *args: str) -> str:
    port = free_port()
    procs.start([str(VENV_BIN / "robot-lab"), "a2a", "--app", app, "--port", str(port), "--name", name, *args],
                env, name)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, interval=0.2)
    except AssertionError:
        raise AssertionError(f"a2a server {name} did not come up:\n{procs.logs()}") from None
    return base


def wait_for_bus_worker(connection: Any, prefix: str, robot: str, timeout: float = 60) -> None:
    """A robot's inbox has a consumer group with a consumer (its worker reads it)."""
    def ready() -> bool:
        try:
            return any(g["consumers"] for g in connection.xinfo_groups(f"{prefix}:bus:{robot}"))
        except Exception:
            return False

    wait_for(ready, timeout=timeout, interval=0.2)


async def sdk_client(agent_base: str, token: str | None = TOKEN, *, streaming: bool = True,
                     polling: bool = False) -> Any:
    """The a2a-sdk client of the agent whose card is under ``agent_base``."""
    from a2a.client import ClientConfig, create_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=60)
    return await create_client(agent_base, client_config=ClientConfig(streaming=streaming, polling=polling, httpx_client=http))


def user_message(text: str, **kw: Any) -> Any:
    from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest

    from robot_lab.schemas import new_id

    return SendMessageRequest(message=Message(message_id=new_id(), role=Role.ROLE_USER, parts=[Part(text=text)], **kw))


__all__ = ["OTHER_TOKEN", "TOKEN", "a2a_env", "free_port", "sdk_client", "start_server", "start_worker", "user_message",
           "wait_for_bus_worker", "write_app", "ASKING_CALLER_MODULE", "CALLER_MODULE", "sys"]
