"""One run plan: the cascade settings -> network -> robot -> task -> run call,
every RobotSpec field round-tripping, the finite global max_tool_rounds, provider reaching
litellm, nothing accepted and ignored, and the serving policy of a served robot."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fakeredis
import msgspec
import pytest

import robot_lab
from robot_lab.errors import ConfigurationError, ToolLoopError
from robot_lab.llm import recording
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import Robot, build
from robot_lab.runtime.run_config import RunConfig
from robot_lab.schemas import RobotSpec
from robot_lab.schemas.validation import convert
from tests.fixtures.tools import add, lookup_order

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


@pytest.fixture(autouse=True)
def _fresh_record() -> None:
    recording.clear_recorded_calls()


def calls_of(robot: str) -> list[dict[str, Any]]:
    return [c for c in recording.recorded_calls() if c["robot"] == robot]


def every_option_robot() -> Robot:
    return build(
        "every-option",
        template="helper",
        template_dirs=[str(TEMPLATES)],
        system_prompt="Be exact.",
        context={"company": "Acme", "tone": "dry"},
        description="all of it",
        local_tools=["tests.fixtures.tools:add", "tests.fixtures.tools:lookup_order"],
        model="scripted/echo",
        provider="anthropic",
        mcp_servers=[{"name": "calc", "transport": "stdio", "command": "python",
                      "args": ["-m", "tests.mcp_servers.calculator"]}],
        mcp=["calc"],
        tools=["add"],
        enable_cache=False,
        skills=["concise"],
        temperature=0.4,
        top_p=0.9,
        top_k=5,
        max_tokens=300,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        stop=["END"],
        max_tool_rounds=7,
        token_budget=10_000,
        cost_budget=2.5,
        doom_loop_threshold=4,
        mcp_discovery=True,
        config={"max_tools": 9, "compact_threshold": 0.7, "auto_compact": "none"},
        hooks=["tests.fixtures.hooks:Recorder"],
        skill_mode="tool",
        serve_tools=["add"],
        serve_mcp="none",
        a2a_agents=["http://agents.example/robots/b/.well-known/agent-card.json",
                    {"url": "http://agents.example/networks/n/", "name": "ask_n", "timeout": 5}],
    )


def test_every_robot_spec_field_round_trips_through_json() -> None:
    spec = every_option_robot().to_spec()
    defaults = RobotSpec(name="x")
    unset = [f for f in spec.__struct_fields__ if getattr(spec, f) == getattr(defaults, f) and f != "name"]
    assert unset == []  # the robot above sets every field, so the comparison below covers all
    wire = msgspec.json.encode(spec)
    rebuilt = Robot.from_spec(msgspec.json.decode(wire, type=RobotSpec))
    assert rebuilt.to_spec() == spec
    assert msgspec.json.encode(rebuilt.to_spec()) == wire
    assert rebuilt.skill_mode == "tool" and rebuilt.provider == "anthropic" and rebuilt.mcp_discovery
    assert rebuilt.config.temperature == 0.4 and rebuilt.config.max_tool_rounds == 7


def test_app_build_robot_keeps_skill_mode() -> None:
    app = robot_lab.App("plan-app")
    app.robot("tooly", skill_mode="tool", model="scripted/echo")
    assert app.build_robot("tooly").skill_mode == "tool"


def test_cascade_in_process_later_layers_win() -> None:
    robot = build("layered", model="scripted/text:robot", temperature=0.5, max_tokens=100)
    robot.run("hi", network_config={"model": "scripted/text:network", "top_p": 0.3, "temperature": 0.1},
              task_config={"temperature": 0.7}, config={"max_tokens": 50})
    [call] = calls_of("layered")
    # network model is under the robot's; its top_p fills a gap; task beats robot; run call beats all
    assert call["model"] == "scripted/text:robot"
    assert call["params"] == {"temperature": 0.7, "top_p": 0.3, "max_tokens": 50}


def test_plan_describes_where_each_value_came_from() -> None:
    from robot_lab.runtime.robot.plan import resolve_plan

    robot = build("described", temperature=0.5)
    plan = resolve_plan(robot, network_config={"top_p": 0.3}, task_config={"temperature": 0.9})
    described = plan.describe()
    assert described["model"] == {"value": "scripted/echo", "from": "settings"}
    assert described["top_p"] == {"value": 0.3, "from": "network"}
    assert described["temperature"] == {"value": 0.9, "from": "task"}
    assert described["max_tool_rounds"] == {"value": 25, "from": "settings"}


def test_network_model_and_task_temperature_reach_the_model_call() -> None:
    net = create_network("cascade", config={"model": "scripted/text:from-network"})
    net.task("only", build("cascaded"), config={"temperature": 0.25})
    result = net.run("go", connection=fakeredis.FakeRedis())
    assert result.status == "completed" and result.reply == "from-network"
    [call] = calls_of("cascaded")
    assert call["model"] == "scripted/text:from-network" and call["params"] == {"temperature": 0.25}


def test_task_model_beats_network_model_in_a_worker() -> None:
    net = create_network("cascade2", config={"model": "scripted/text:from-network"})
    net.task("only", build("cascaded2"), config={"model": "scripted/text:from-task"})
    assert net.run("go", connection=fakeredis.FakeRedis()).reply == "from-task"


def test_a_looping_robot_stops_at_the_global_default() -> None:
    robot = build("looper", model="scripted/loop:add", local_tools=[add])
    result = robot.run_safely("forever", tools="inherit")
    assert result.failed and "ToolLoopError" in result.error
    assert "26 tool calls exceeded max_tool_rounds (25)" in result.error
    with pytest.raises(ToolLoopError):
        build("looper2", model="scripted/loop:add", local_tools=[add]).run("x", tools="inherit")


def test_max_tool_rounds_setting_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_MAX_TOOL_ROUNDS", "2")
    robot = build("short-loop", model="scripted/loop:add", local_tools=[add])
    with pytest.raises(ToolLoopError, match=r"3 tool calls exceeded max_tool_rounds \(2\)"):
        robot.run("x", tools="inherit")


def test_max_iterations_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.settings import reload_settings

    monkeypatch.setenv("ROBOT_LAB_MAX_ITERATIONS", "5")
    with pytest.raises(ValueError, match="max_iterations is not supported"):
        reload_settings()


def test_enable_cache_true_and_a_non_bus_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="enable_cache=True is not supported"):
        build("cached", enable_cache=True)
    with pytest.raises(ConfigurationError, match="enable_cache=True is not supported"):
        RunConfig(enable_cache=True)
    with pytest.raises(ConfigurationError, match="bus must be a robot_lab.Bus"):
        build("bussed", bus="redis://nope")


def test_provider_reaches_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.llm import gateway
    from robot_lab.settings import reload_settings

    build("prov", model="scripted/echo", provider="anthropic").run("hi")
    assert calls_of("prov")[0]["provider"] == "anthropic"
    monkeypatch.setenv("ROBOT_LAB_PROVIDER", "mistral")
    reload_settings()
    build("prov2", model="scripted/echo").run("hi")
    assert calls_of("prov2")[0]["provider"] == "mistral"  # the settings layer under the robot

    seen: dict[str, Any] = {}
    litellm = gateway.litellm_module()

    def fake_completion(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setenv("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")  # the credential check passes
    reload_settings()
    monkeypatch.setattr(litellm, "completion", fake_completion)
    robot = build("bare", model="claude-sonnet-4-5", provider="anthropic",
                  gateway=gateway.LLMGateway(max_retries=0))
    assert robot.run_safely("hi").failed
    assert seen["model"] == "claude-sonnet-4-5" and seen["custom_llm_provider"] == "anthropic"


@contextmanager
def served(robot: Robot, client: Any = None) -> Iterator[Any]:
    """``robot`` served by a BusPoller (on a fresh fakeredis by default); yields the Bus."""
    from robot_lab.bus import Bus, BusPoller

    client = client if client is not None else fakeredis.FakeRedis()
    poller = BusPoller(robot.name, redis=client, block_ms=50).serve(robot)
    poller.start()
    try:
        yield Bus(client)
    finally:
        poller.stop()


def test_robot_bus_is_used_for_delegation_by_name() -> None:
    with served(build("helper-bot", model="scripted/echo", local_tools=[add])) as bus:
        result = build("boss", bus=bus).delegate("helper-bot", "add things", timeout=30)
    # served: the helper offered its tool (the serving policy), over the robot's own bus
    assert result.reply == "echo: add things\nTool results:\n- add: 0"


def test_served_robot_offers_its_tools_and_headers_only_narrow() -> None:
    robot = build("served", model="scripted/echo", local_tools=[add, lookup_order], serve_tools=["add"])
    with served(robot) as bus:
        full = bus.request("served", "sum", timeout=30).content
        narrowed = bus.request("served", "sum", timeout=30, headers={"tools": "none"}).content
        widened = bus.request("served", "sum", timeout=30, headers={"tools": "add,lookup_order"}).content
    assert full == "echo: sum\nTool results:\n- add: 0"
    assert narrowed == "echo: sum"
    assert widened == full  # the spec serves only add: a header never widens to lookup_order
    assert [c["tools"] for c in calls_of("served")] == [["add"], ["add"], [], ["add"], ["add"]]


def test_a_spawned_robot_is_served_with_its_tools_on_the_spawners_bus() -> None:
    from robot_lab.bus import Bus
    from robot_lab.runtime.registry import published_spec

    client = fakeredis.FakeRedis()
    bus = Bus(client)
    handle = build("spawner", model="scripted/echo", provider="anthropic", bus=bus).spawn(
        "spawned-adder", local_tools=["tests.fixtures.tools:add"])
    spec = published_spec("spawned-adder", connection=client, keys=bus.keys)
    assert spec is not None and spec.provider == "anthropic"  # inherited, published on the spawner's bus
    with served(Robot.from_spec(spec), client):  # what `robot-lab worker --spawned` does
        assert handle.ask("sum", timeout=30) == "echo: sum\nTool results:\n- add: 0"


def test_spec_serving_policy_none_keeps_tools_off() -> None:
    robot = build("quiet", model="scripted/echo", local_tools=[add], serve_tools="none")
    spec = convert(msgspec.to_builtins(robot.to_spec()), RobotSpec)
    assert Robot.from_spec(spec).serve_policy() == {"tools": "none", "mcp": "inherit"}


def test_in_process_run_still_defaults_to_no_tools() -> None:
    robot = build("plain", model="scripted/echo", local_tools=[add])
    assert robot.run("hi").reply == "echo: hi"


def test_run_config_merge_is_a_new_config_and_still_checks_mappings() -> None:
    """``merge`` builds the result without checking its fields again (both sides were
    checked): the result is still independent of both sides, and a mapping is checked."""
    from robot_lab.errors import ConfigurationError
    from robot_lab.runtime.run_config import RunConfig

    base, top = RunConfig(model="a", temperature=0.1), RunConfig(model="b", max_tokens=5)
    merged = base.merge(top)
    assert merged.to_dict() == {"model": "b", "temperature": 0.1, "max_tokens": 5}
    merged.set("temperature", 0.9)
    copy = base.merge(None)
    copy.set("model", "c")
    assert base.to_dict() == {"model": "a", "temperature": 0.1} and top.to_dict() == {"model": "b", "max_tokens": 5}
    assert base.merge({"top_p": 0.5, "stop": None}).to_dict() == {"model": "a", "temperature": 0.1, "top_p": 0.5}
    with pytest.raises(ConfigurationError):
        base.merge({"no_such_field": 1})
    with pytest.raises(ConfigurationError):
        base.merge({"on_content": "not callable"})


def test_run_config_none_is_unset_and_unknown_names_are_refused() -> None:
    from robot_lab.errors import ConfigurationError
    from robot_lab.runtime.run_config import RunConfig

    config = RunConfig({"model": "a", "temperature": None}, max_tokens=None, top_p=0.2)
    assert config.to_dict() == {"model": "a", "top_p": 0.2} and "temperature" not in config
    with pytest.raises(ConfigurationError):
        RunConfig(no_such_field=None)
    with pytest.raises(ConfigurationError):
        RunConfig({"no_such_field": 1})
