"""What a fresh process loads for its first run: a robot built and run in process, with a
tool call on the scripted model and no memory use, imports neither redis-py, fakeredis nor
litellm; a tool that does reach the run's memory opens the robot's own memory then, writing
as the robot. CLI commands whose robots run on the scripted model never load litellm, nor
does a provider call refused for a missing key. The fleet commands and a refused chat build no
pydantic settings models and load no rich. Figures: bench/startup.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.redis_server import REPO_ROOT

FIRST_RUN = r"""
import json, sys
from robot_lab.runtime.robot import build
from robot_lab.runtime.tools import tool

@tool
def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

@tool
def remember(note: str) -> str:
    '''Keep a note in the run's memory.'''
    from robot_lab.runtime.robot.context import current_memory
    current_memory().set("note", note)
    return "kept"

robot = build("first", model="scripted/echo", local_tools=[add, remember] if sys.argv[1] == "memory" else [add])
result = robot.run("hello", tools="inherit")
loaded = sorted({name.split(".")[0] for name in sys.modules})
out = {"reply": result.reply, "loaded": loaded}
if sys.argv[1] == "memory":
    change = robot.memory.changes(since_version=0)[-1]
    out["note"] = robot.memory.get("note")
    out["writer"] = change.writer
print("OUT=" + json.dumps(out), flush=True)
"""


def _first_run(mode: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "0", "HOME": "/tmp"}
    done = subprocess.run([sys.executable, "-c", FIRST_RUN, mode], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUT=")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("OUT="))


def test_a_first_run_with_a_tool_call_and_no_memory_loads_no_redis_client() -> None:
    out = _first_run("plain")
    assert "Tool results:" in out["reply"] and "- add: 0" in out["reply"]
    assert not {"redis", "fakeredis", "litellm", "rq", "numpy"} & set(out["loaded"]), out["loaded"]


def test_a_tool_reaching_the_runs_memory_opens_the_robots_own_and_writes_as_the_robot() -> None:
    out = _first_run("memory")
    assert "- remember: kept" in out["reply"]
    assert out["note"] == "a" and out["writer"] == "first"
    assert "fakeredis" in out["loaded"]  # embedded mode: opened on first use


CLI_RUN = r"""
import sys
from robot_lab.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException as exc:  # a command's clear error (or exit) is what some of these test
    print(f"RAISED={type(exc).__name__}: {exc}", flush=True)
print("LITELLM=" + str("litellm" in sys.modules), flush=True)
"""


@pytest.mark.parametrize("args", [
    ["chat", "hi"],
    ["chat", "-m", "openai/gpt-4o-mini", "hello"],  # no key: refused before litellm loads
    ["demo", "--plain"],
    ["status"],
    ["runs"],
])
def test_cli_commands_on_the_scripted_model_never_load_litellm(args: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "1", "HOME": "/tmp", "ROBOT_LAB_DEMO_DELAY_MS": "0"}
    done = subprocess.run([sys.executable, "-c", CLI_RUN, *args], env=env, capture_output=True, text=True, timeout=120)
    assert "LITELLM=False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    if "openai/gpt-4o-mini" in args:
        assert "no credentials: set OPENAI_API_KEY" in done.stdout + done.stderr


# What no everyday CLI command may load unless its work needs it: the model SDK, the embedded
# server, the embedding and ONNX stack, MCP, the web and A2A tiers, metrics, structlog (nothing
# is logged at the CLI's WARNING level) and jinja2 (no template). Asserted on the modules the
# process holds when the command returns, not on time (bench/startup.py has the figures).
HEAVY = {"litellm", "fakeredis", "numpy", "mcp", "fastembed", "onnxruntime", "starlette", "uvicorn", "a2a",
         "prometheus_client", "structlog", "jinja2", "lupa", "httpx", "openai", "tiktoken"}

# What the fleet commands (status, runs, send) and a refused chat do not load either: settings
# are read from CoreSettings (settings/core.py), not built as pydantic models, unless a setting
# beyond those fields is configured; tables are plain text, not rich; no config file, no YAML.
NO_MODELS = {"pydantic", "pydantic_settings", "pydantic_core", "annotated_types", "rich", "yaml"}

MODULES_RUN = r"""
import json, sys
from robot_lab.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException as exc:  # a command's clear error (or exit) is part of what it does
    print(f"RAISED={type(exc).__name__}: {exc}", flush=True)
print("MODULES=" + json.dumps(sorted(sys.modules)), flush=True)
"""


def _modules_of(args: list[str], **extra: str) -> tuple[set[str], str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ROBOT_LAB_ALLOW_MODEL_REQUESTS": "0", "HOME": "/tmp", **extra}
    done = subprocess.run([sys.executable, "-c", MODULES_RUN, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("MODULES=")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return set(json.loads(lines[0].removeprefix("MODULES="))), done.stdout + done.stderr


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["runs"], ["send", "nobody", "hi"]])
def test_fleet_commands_load_neither_the_robot_runtime_nor_anything_heavy(
        args: list[str], real_redis_url: str, key_prefix: str) -> None:
    """``status``, ``runs`` and ``send`` on a real Redis read keys: no robot runtime, model
    gateway, memory or skills, no DAG engine for a prefix without robots (rq's keys are not
    prefixed: the robot queues other prefixes left on this shared server must not load it), no
    bus poller, nothing of HEAVY."""
    modules, output = _modules_of(args, REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    if args[0] == "send":
        assert "Unknown channel" in output, output  # it did its work: the one-line refusal
    else:
        assert "RAISED" not in output, output
    tops = {name.split(".")[0] for name in modules}
    assert not (HEAVY | NO_MODELS) & tops, sorted((HEAVY | NO_MODELS) & tops)
    ours = {name for name in modules if name.startswith("robot_lab.")}
    assert "robot_lab.settings.models" not in ours
    # of the DAG engine's package only its lazy __init__ and builds (reads the builds' keys: the
    # stalled-on-build lines) may load
    light = {"robot_lab.network", "robot_lab.network.builds"}
    assert not {n for n in ours - light if n.startswith(("robot_lab.runtime", "robot_lab.network", "robot_lab.llm",
                                                         "robot_lab.memory", "robot_lab.skills"))}, sorted(ours)
    assert "robot_lab.bus.poller" not in ours, sorted(ours)
    assert not {"robot_lab.network.dsl", "robot_lab.network.dag"} & ours, sorted(ours)
    if args[0] == "runs":  # a runs listing reads run records: no bus at all
        assert not {n for n in ours if n.startswith("robot_lab.bus")}, sorted(ours)


def test_status_with_a_robot_names_its_queues_without_loading_the_dag_engine(real_redis_url: str, key_prefix: str) -> None:
    """With a robot inbox, status reads the robot's rq queue (the network's queue naming), but
    builds no network: neither the DSL nor the DAG compiler is loaded."""
    import redis

    from robot_lab.bus import Bus
    from robot_lab.keys import Keys

    Bus(redis.Redis.from_url(real_redis_url), keys=Keys(prefix=key_prefix)).register("billing")
    modules, output = _modules_of(["status"], REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    assert "billing" in output, output
    ours = {name for name in modules if name.startswith("robot_lab.")}
    assert "robot_lab.network.enqueue" in ours  # it named the robot's queue
    assert not {"robot_lab.network.dsl", "robot_lab.network.dag", "robot_lab.network.coordinator"} & ours, sorted(ours)
    # it read the inbox's statistics (bus/inbox_stats.py) without building a Bus (envelope
    # schemas, msgspec, signing), on the bus section's defaults: no models
    assert "robot_lab.bus.inbox_stats" in ours and "robot_lab.settings.models" not in ours
    assert not {"robot_lab.bus.core", "robot_lab.schemas"} & ours and "msgspec" not in modules, sorted(ours)
    assert not NO_MODELS & {name.split(".")[0] for name in modules}, sorted(NO_MODELS & modules)


def test_a_configured_section_still_builds_the_full_settings(real_redis_url: str, key_prefix: str) -> None:
    """A setting beyond the plain top-level fields (here the bus section) is read by the full
    pydantic Settings, layers and validation as before: a bad value is one clear line."""
    modules, output = _modules_of(["runs"], REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix,
                                  ROBOT_LAB_BUS__MAXLEN="500")
    assert "RAISED" not in output and "robot_lab.settings.models" in modules, output
    _, output = _modules_of(["runs"], REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix,
                            ROBOT_LAB_BUS__MAXLEN="many")
    assert "RAISED" in output and "bus.maxlen" in output, output


@pytest.mark.parametrize("args", [["chat", "hi"], ["chat", "-m", "openai/gpt-4o-mini", "hi"]])
def test_chat_on_the_scripted_model_or_refused_loads_no_redis_client_nor_anything_heavy(args: list[str]) -> None:
    """A chat that uses no memory needs no Redis client, and a provider model refused by
    ROBOT_LAB_ALLOW_MODEL_REQUESTS=0 is refused before the robot (its runtime) is built."""
    modules, output = _modules_of(args)
    tops = {name.split(".")[0] for name in modules}
    if "-m" in args:
        assert "model requests are disabled (ROBOT_LAB_ALLOW_MODEL_REQUESTS=0)" in output, output
        assert not {n for n in modules if n.startswith("robot_lab.runtime")}, sorted(modules)
        assert not NO_MODELS & tops, sorted(NO_MODELS & tops)  # refused on the light settings
    else:
        assert "RAISED" not in output, output
        # the runtime's own types use pydantic; the settings it reads are CoreSettings fields
        assert not {"pydantic_settings", "yaml", "rich"} & tops and "robot_lab.settings.models" not in modules
    assert not (HEAVY | {"redis", "rq"}) & tops, sorted((HEAVY | {"redis", "rq"}) & tops)


def test_the_bus_package_exports_lazily_and_every_name_resolves() -> None:
    """``robot_lab.bus`` loads a module when one of its names is first used, so a reader of
    inbox statistics (``Bus`` from ``.core``) does not load the poller's modules."""
    code = ("import sys, robot_lab.bus as bus\n"
            "assert 'robot_lab.bus.core' not in sys.modules\n"
            "from robot_lab.bus import Bus\n"
            "assert 'robot_lab.bus.poller' not in sys.modules\n"
            "assert sorted(bus.__all__) == sorted(bus._EXPORTS)\n"
            "print(sorted(type(getattr(bus, n)).__name__ for n in bus.__all__))\n")
    done = subprocess.run([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT),
                                                              "HOME": "/tmp"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "robot_lab.bus.poller" not in done.stderr and "'type'" in done.stdout
