"""W3C traceparent: carried by envelopes and runs, continued (same trace, new span) by the
process that handles them, and bound in the log context."""

from __future__ import annotations

import fakeredis

from robot_lab import tracing
from robot_lab.bus import Bus, BusPoller


def test_child_keeps_the_trace_and_makes_a_new_span() -> None:
    parent = tracing.new_traceparent()
    child = tracing.child_of(parent)
    assert tracing.parse(parent)[0] == tracing.parse(child)[0]
    assert tracing.parse(parent)[1] != tracing.parse(child)[1]
    assert tracing.parse(tracing.child_of("garbage")) is not None  # malformed parent: a new trace


def test_envelopes_carry_a_traceparent_and_handlers_continue_it(redis_client) -> None:
    bus = Bus()
    seen: list[str | None] = []
    poller = BusPoller("tracer", bus, block_ms=0)
    poller.on_message(lambda message: seen.append(tracing.current_traceparent()))
    sent = bus.publish("tracer", "hello", create=True)
    assert tracing.parse(sent.headers["traceparent"]) is not None
    given = tracing.new_traceparent()
    bus.publish("tracer", "explicit", headers={"traceparent": given})
    assert poller.poll(max_messages=2, block_ms=0) == 2
    assert [tracing.parse(s)[0] for s in seen] == [tracing.parse(sent.headers["traceparent"])[0], tracing.parse(given)[0]]
    assert tracing.current_traceparent() is None  # unbound after handling


def test_network_runs_record_the_submitter_trace() -> None:
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    net = create_network("traced")
    net.task("only", build("tracee", model="scripted/echo"))
    connection = fakeredis.FakeRedis()
    root = tracing.new_traceparent()
    with tracing.continue_trace(root):
        result = net.run("hi", connection=connection)
    recorded = connection.hget(f"robot_lab:run:{result.run_id}", "traceparent").decode()
    assert tracing.parse(recorded)[0] == tracing.parse(root)[0]  # workers continue this trace
