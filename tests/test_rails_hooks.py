"""Hooks: order, around nesting, rewriting, short-circuits, errors, import paths, Narrator."""

from __future__ import annotations

import io

import pytest

import robot_lab
from robot_lab.runtime.rails import hooks as hooks_mod
from robot_lab.runtime.rails.hooks import Hook, HookRegistry, Narrator
from robot_lab.runtime.robot import Robot
from tests.fixtures import hooks as fixture_hooks
from tests.fixtures.tools import add


@pytest.fixture(autouse=True)
def _clean_global_hooks():
    hooks_mod.clear_hooks()
    fixture_hooks.EVENTS.clear()
    yield
    hooks_mod.clear_hooks()


def make_tracer(name: str, log: list[str]) -> type[Hook]:
    class Tracer(Hook):
        namespace = name

        @classmethod
        def before_run(cls, ctx):
            log.append(f"{name}.before")

        @classmethod
        def around_run(cls, ctx, call_next):
            log.append(f"{name}.around>")
            result = call_next()
            log.append(f"{name}.around<")
            return result

        @classmethod
        def after_run(cls, ctx):
            log.append(f"{name}.after")

    return Tracer


def test_order_global_robot_per_run_and_first_around_outermost() -> None:
    log: list[str] = []
    robot_lab.runtime.rails.hooks.on(make_tracer("g", log))
    robot = robot_lab.build(name="h", hooks=[make_tracer("r", log)])
    robot.run("hi", hooks=make_tracer("p", log))
    assert log == [
        "g.before", "r.before", "p.before",
        "g.around>", "r.around>", "p.around>", "p.around<", "r.around<", "g.around<",
        "g.after", "r.after", "p.after",
    ]


def test_before_run_can_rewrite_the_request() -> None:
    class Rewriter(Hook):
        @classmethod
        def before_run(cls, ctx):
            ctx.request = ctx.request.upper()

    assert robot_lab.build(name="w", hooks=[Rewriter]).run("quiet please").reply == "echo: QUIET PLEASE"


def test_around_tool_call_can_short_circuit_the_tool() -> None:
    calls: list[int] = []

    def counted(x: int) -> int:
        """Counts calls."""
        calls.append(x)
        return x

    class Cache(Hook):
        @classmethod
        def around_tool_call(cls, ctx, call_next):
            ctx.tool_result = "cached!"
            return None

    result = robot_lab.build(name="c", local_tools=[counted], hooks=[Cache]).run("x", tools="inherit")
    assert calls == []
    assert result.tool_calls[0].data == "cached!"


def test_errors_fire_on_error_and_reraise() -> None:
    seen: list[str] = []

    class Boom(Hook):
        @classmethod
        def before_llm_generation(cls, ctx):
            raise RuntimeError("hook failed")

        @classmethod
        def on_error(cls, ctx):
            seen.append(f"{ctx.event}:{ctx.error}")

    with pytest.raises(RuntimeError, match="hook failed"):
        robot_lab.build(name="b", hooks=[Boom]).run("x")
    assert seen == ["run:hook failed"]  # on_error exists for run, not llm_generation


def test_local_state_is_per_namespace_and_registration_context_defaults() -> None:
    class Counter(Hook):
        @classmethod
        def before_run(cls, ctx):
            ctx.local.count = (ctx.local.count or 0) + ctx.local.step

        @classmethod
        def after_run(cls, ctx):
            ctx.local.seen = ctx.ext("counter").count

    robot = robot_lab.build(name="n")
    robot.on(Counter, context={"step": 5})
    robot.run("x")  # no error: local reads/writes happen inside the namespace


def test_registration_rejects_non_hooks_and_base_hook() -> None:
    with pytest.raises(robot_lab.ConfigurationError, match="must be a robot_lab Hook subclass"):
        HookRegistry().on(object)
    with pytest.raises(robot_lab.ConfigurationError, match="no namespace"):
        HookRegistry().on(Hook)
    with pytest.raises(robot_lab.ConfigurationError, match="cannot import"):
        HookRegistry().on("nowhere.mod:Hook")


def test_hooks_travel_in_specs_by_import_path() -> None:
    robot = robot_lab.build(name="spec", local_tools=[add], hooks=["tests.fixtures.hooks:Recorder"])
    spec = robot.to_spec()
    assert spec.hooks == ["tests.fixtures.hooks:Recorder"]
    Robot.from_spec(spec).run("ping", tools="inherit")
    assert fixture_hooks.EVENTS[0] == "before_run:ping"
    assert fixture_hooks.EVENTS[1] == "tool:add"
    assert fixture_hooks.EVENTS[-1].startswith("after_run:echo: ping")


def test_narrator_prints_short_lines_and_never_raises() -> None:
    out = io.StringIO()
    Narrator.enable(output=out)
    robot_lab.build(name="talker", local_tools=[add]).run("x", tools="inherit")
    lines = out.getvalue().splitlines()
    assert lines[0] == "  · talker: thinking…"
    assert lines[1].startswith("  · → add a=")
    assert all(len(line) <= Narrator.MAX for line in lines)
