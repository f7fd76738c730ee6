"""The Robot on the scripted model: tool loop, streaming, tokens, breaker, templates, specs."""

from __future__ import annotations

from pathlib import Path

import pytest

import robot_lab
from robot_lab import ConfigurationError, RobotResult, ToolError, ToolLoopError
from robot_lab.runtime.robot import Robot
from robot_lab.runtime.run_config import RunConfig
from robot_lab.schemas import TextMessage, ToolCallMessage, ToolResultMessage
from tests.fixtures.tools import add, lookup_order

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"


def test_two_tool_multi_step_loop() -> None:
    robot = robot_lab.build(name="clerk", system_prompt="You help.", local_tools=[add, lookup_order])
    result = robot.run("check order 7 and add", tools="inherit")
    kinds = [type(m) for m in result.output]
    assert kinds == [ToolCallMessage, ToolResultMessage, ToolResultMessage, TextMessage]
    assert [r.tool.name for r in result.tool_calls] == ["add", "lookup_order"]
    assert result.tool_calls[0].data == "0"  # schema-generated arguments a=0, b=0
    assert '"status": "shipped"' in result.tool_calls[1].data
    assert "- add: 0" in result.reply and "lookup_order" in result.reply
    roles = [m["role"] for m in robot.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]


def test_scripted_tool_calls_with_chosen_arguments() -> None:
    from robot_lab.llm.scripted import register_script, unregister_script

    register_script(
        "adder",
        {"turns": [{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
                   {"tool_calls": [{"name": "add", "arguments": {"a": 5, "b": 10}}]},
                   {"reply": "total {tool_results}"}]},
    )
    try:
        robot = robot_lab.build(name="adder", model="scripted/adder", local_tools=[add])
        result = robot.run("2+3 then +10", tools="inherit")
    finally:
        unregister_script("adder")
    assert [r.data for r in result.tool_calls] == ["5", "15"]
    assert result.reply == "total - add: 5\n- add: 15"


def test_tools_are_not_sent_unless_asked() -> None:
    robot = robot_lab.build(name="quiet", local_tools=[add])
    assert robot.run("hello").tool_calls == []
    assert robot.run("hello", tools=["add"]).tool_calls[0].tool.name == "add"


def test_streaming_chunks_arrive_in_order_stored_callback_first() -> None:
    events: list[tuple[str, str]] = []
    robot = robot_lab.build(name="s", on_content=lambda c: events.append(("stored", c.content)))
    result = robot.run("stream these words please", on_content=lambda c: events.append(("call", c.content)))
    stored = [c for who, c in events if who == "stored"]
    per_call = [c for who, c in events if who == "call"]
    assert "".join(stored) == result.reply == "echo: stream these words please"
    assert stored == per_call and len(stored) > 3
    assert events[0][0] == "stored" and events[1][0] == "call"  # both fire, stored first


def test_token_totals_add_up_across_runs() -> None:
    robot = robot_lab.build(name="t", local_tools=[add])
    first = robot.run("one", tools="inherit")
    second = robot.run("two")
    assert first.input_tokens > 0 and first.output_tokens > 0
    assert robot.total_input_tokens == first.input_tokens + second.input_tokens
    assert robot.total_output_tokens == first.output_tokens + second.output_tokens
    robot.reset_token_totals()
    assert robot.total_input_tokens == 0


def test_max_tool_rounds_breaker_then_reusable_after_clear() -> None:
    robot = robot_lab.build(name="loopy", model="scripted/loop:add", local_tools=[add], max_tool_rounds=3)
    with pytest.raises(ToolLoopError, match=r"Circuit breaker triggered: 4 tool calls exceeded max_tool_rounds \(3\)"):
        robot.run("go", tools="inherit")
    robot.clear_messages()
    assert [m["role"] for m in robot.messages] == []
    robot.with_model("scripted/echo")
    assert robot.run("again").reply == "echo: again"


def test_tool_errors_are_returned_to_the_model_as_text() -> None:
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"cannot {reason}")

    def flaky(x: int) -> int:
        """Fails in a retryable way."""
        raise ToolError("try later", retryable=True)

    robot = robot_lab.build(name="e", local_tools=[explode, flaky])
    result = robot.run("x", tools="inherit")
    errors = [r.error for r in result.tool_calls]
    assert errors == ["Error (explode): cannot a", "Error (flaky): try later (retryable)"]
    assert all(not r.success for r in result.tool_calls)


def test_tool_class_and_tool_create() -> None:
    class Weather(robot_lab.Tool):
        description = "Weather for a city"
        parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

        def execute(self, city: str) -> str:
            return f"sunny in {city}"

    made = robot_lab.Tool.create("echo_args", lambda args: args, description="echo")
    robot = robot_lab.build(name="w", local_tools=[Weather, made])
    result = robot.run("weather?", tools="inherit")
    assert [r.data for r in result.tool_calls] == ["sunny in a", "{}"]
    assert Weather().name == "weather"


def test_unknown_tool_filter_entry_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="pass tool objects as `local_tools:`"):
        robot_lab.build(name="x", tools=[add])


def test_unknown_run_config_field() -> None:
    with pytest.raises(ConfigurationError, match="Unknown RunConfig field: temprature"):
        RunConfig(temprature=0.3)
    with pytest.raises(ConfigurationError, match="Unknown RunConfig field: nope"):
        robot_lab.build(name="x", config={"nope": 1})


def test_run_config_cascade_and_none_deletes() -> None:
    merged = RunConfig.cascade({"model": "a", "temperature": 0.1}, {"temperature": 0.5}, RunConfig(max_tool_rounds=2))
    assert merged.to_dict() == {"model": "a", "temperature": 0.5, "max_tool_rounds": 2}
    merged.set("temperature", None)
    assert "temperature" not in merged
    assert RunConfig(on_content=print).to_json_dict() == {}


def test_template_skills_order_precedence_and_cycle(caplog: pytest.LogCaptureFixture) -> None:
    robot = robot_lab.build(
        template="helper", template_dirs=[TEMPLATES], context={"company": "Acme"}, temperature=0.9,
        system_prompt="Inline rules last.",
    )
    # concise -> polite (cycle back to polite cut) -> helper, then the inline prompt.
    assert robot.instructions == (
        "Keep answers short.\n\nAlways say please.\n\n"
        "You help customers of Acme in a friendly tone.\n\nInline rules last."
    )
    assert robot.config.temperature == 0.9  # constructor beats front matter
    assert robot.config.max_tokens == 300  # from a skill's front matter
    assert robot.description == "A helpful assistant"


def test_template_missing_required_parameter_is_deferred_then_clear() -> None:
    robot = robot_lab.build(template="helper", template_dirs=[TEMPLATES])
    with pytest.raises(ConfigurationError, match=r"Missing required parameters: company for template 'helper' \(.*helper.md\)"):
        robot.run("hi")
    result = robot.run("hi", company="Globex")
    assert "customers of Globex" in robot.instructions
    assert result.reply == "echo: hi"


def test_template_not_found_names_the_search_path() -> None:
    with pytest.raises(ConfigurationError, match="template 'nothere' not found"):
        robot_lab.build(template="nothere", template_dirs=[TEMPLATES])


def test_bad_front_matter_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken.md").write_text("---\nname: [unclosed\n---\nbody\n")
    with pytest.raises(ConfigurationError, match=r"broken.md:\d+: malformed YAML front matter"):
        robot_lab.build(template="broken", template_dirs=[tmp_path])


def test_spec_round_trip_rebuilds_an_equivalent_robot() -> None:
    robot = robot_lab.build(name="billing", system_prompt="Bill.", local_tools=[add], max_tool_rounds=4)
    spec = robot.to_spec()
    assert spec.local_tools == ["tests.fixtures.tools:add"]
    again = Robot.from_spec(spec)
    assert again.instructions == "Bill." and again.config.max_tool_rounds == 4
    assert again.run("x", tools="inherit").tool_calls[0].tool.name == "add"


def test_spec_refuses_unimportable_tools() -> None:
    robot = robot_lab.build(name="x", local_tools=[robot_lab.Tool.create("t", lambda a: 1)])
    with pytest.raises(ConfigurationError, match="tool 't' has no import path"):
        robot.to_spec()


def test_unimportable_tool_path_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot import 'no.such.module:fn'"):
        robot_lab.build(name="x", local_tools=["no.such.module:fn"])


def test_run_safely_turns_failures_into_error_results() -> None:
    robot = robot_lab.build(name="broken", model="scripted/fail:provider down")
    robot._gateway = robot_lab.llm.gateway.LLMGateway(max_retries=0)  # type: ignore[attr-defined]
    result = robot.run_safely("hi")
    assert isinstance(result, RobotResult) and result.failed
    assert result.reply.startswith("Error: InferenceError: scripted/fail:provider down")


def test_unknown_build_keyword_raises_type_error() -> None:
    with pytest.raises(TypeError):
        robot_lab.build(name="x", colour="red")


def test_doom_loop_warning_at_third_identical_call_then_breaker() -> None:
    robot = robot_lab.build(name="doomed", model="scripted/loop:add", local_tools=[add], max_tool_rounds=5)
    with pytest.raises(ToolLoopError):
        robot.run("go", tools="inherit")
    tool_texts = [m["content"] for m in robot.messages if m["role"] == "tool"]
    assert len(tool_texts) == 5
    assert "⚠️" not in tool_texts[0] and "⚠️" not in tool_texts[1]
    assert tool_texts[2].startswith("0\n\n⚠️ Tool 'add' has been called 3+ times consecutively with no progress.")


def test_token_budget_refuses_before_the_call_once_spent() -> None:
    robot = robot_lab.build(name="thrifty", token_budget=40)
    robot.run("short")  # well under budget
    with pytest.raises(robot_lab.InferenceError, match=r"Token budget exceeded: \d+ tokens used, budget is 40"):
        robot.run("a much longer message that will push the running total past the small budget " * 3)
    with pytest.raises(robot_lab.BudgetExceeded, match="budget exceeded for tokens"):
        robot.run("anything")
