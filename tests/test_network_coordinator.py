"""Network runs through the coordinator, the run state in Redis and rq jobs executed by
in-process rq workers: on fakeredis and on a real Redis server (the ``redis_client`` fixture)."""

from __future__ import annotations

import threading
import uuid

import pytest
from rq import Queue

from robot_lab.errors import ConfigurationError
from robot_lab.keys import default_keys
from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.runtime.robot import build
from robot_lab.network.enqueue import enqueue_jobs
from robot_lab.network.run_state import RunStore
from robot_lab.schemas import RobotResult, RobotSpec, TextMessage
from robot_lab.network.embedded import EmbeddedWorkers


@pytest.fixture(autouse=True)
def _no_llm_retries(monkeypatch):
    monkeypatch.setenv("ROBOT_LAB_MAX_RETRIES", "0")


def uid() -> str:
    return uuid.uuid4().hex[:8]


def robot(kind: str, model: str, **kwargs):
    return build(f"{kind}-{uid()}", model=model, **kwargs)


def run(redis_client, net, message, *, threads=4, **kwargs):
    coordinator = Coordinator(connection=redis_client)
    with EmbeddedWorkers(redis_client, sorted({t.robot for t in net.spec.tasks}), threads=threads):
        handle = coordinator.submit(net, message, **kwargs)
        result = handle.wait(timeout=60)
    return result, handle


def events(handle, name=None, task=None):
    return [e for e in handle.events() if (name is None or e.event == name) and (task is None or e.task == task)]


def test_routing_runs_only_the_activated_optional_task(redis_client):
    net = create_network("route")
    net.task("classify", robot("classifier", "scripted/route:technical"), routes=["billing", "technical"])
    net.task("billing", robot("billing", "scripted/text:billing here"), depends_on="optional")
    net.task("technical", robot("technical", "scripted/echo"), depends_on="optional")
    result, handle = run(redis_client, net, "my app crashes")
    assert result.status == "completed" and result.ok  # a skipped task is no failure
    assert events(handle, "run.completed")[0].data == {"status": "completed", "done": 2, "failed": 0,
                                                        "skipped": 1}
    assert result.states == {"classify": "done", "billing": "skipped", "technical": "done"}
    assert result.activated == {"technical"}
    assert not events(handle, "task.started", "billing")
    assert events(handle, "task.skipped", "billing")
    # the routed task gets the request its router received, not the router's decision text
    assert result.reply == "echo: my app crashes"
    assert result.final_task == "technical"
    route_calls = [c for c in result["classify"].tool_calls if c.tool.name == "route"]
    assert route_calls and route_calls[0].tool.input == {"to": ["technical"]}


def test_python_router_by_import_path(redis_client):
    net = create_network("pyroute")
    net.task("start", robot("start", "scripted/text:please go to b"), routes=["a", "b"],
             router="tests.network_helpers:route_by_last_word")
    net.task("a", robot("a", "scripted/text:A"), depends_on="optional")
    net.task("b", robot("b", "scripted/text:B"), depends_on="optional")
    result, _ = run(redis_client, net, "hi")
    assert result.states["a"] == "skipped" and result.states["b"] == "done"
    assert result.reply == "B"


def test_parallel_group_runs_concurrently_and_child_with_two_parents_is_enqueued_once(redis_client):
    net = create_network("fan")
    net.task("start", robot("start", "scripted/text:go"))
    with net.parallel("stage", depends_on="start"):
        net.task("left", robot("left", "scripted/sleep:300"))
        net.task("right", robot("right", "scripted/sleep:300"))
    net.task("join", robot("join", "scripted/echo"), depends_on=["stage"])
    result, handle = run(redis_client, net, "hello")
    assert result.status == "completed"
    started = {e.task: e.ts for e in events(handle, "task.started")}
    finished = {e.task: e.ts for e in events(handle, "task.completed")}
    # both group members were running at the same time
    assert max(started["left"], started["right"]) < min(finished["left"], finished["right"])
    assert len(events(handle, "task.queued", "join")) == 1
    assert handle.store.attempts()["join"] == 1
    # two parents: their replies as sections, in depends_on order
    assert result.reply == "echo: ## left\necho: go\n\n## right\necho: go"
    seqs = [e.seq for e in handle.events()]
    assert seqs == list(range(1, len(seqs) + 1))


def test_two_parents_finishing_at_once_enqueue_the_child_exactly_once(redis_client):
    net = create_network("race")
    net.task("p1", "r1")
    net.task("p2", "r2")
    net.task("child", "r3", depends_on=["p1", "p2"])
    graph = net.validate()
    store = RunStore(redis_client, default_keys(), f"race-{uid()}")
    queued = store.create(graph, message="m", context={}, app=None, max_concurrent=None)
    assert [t for t, _, _ in queued] == ["p1", "p2"]
    for task, job, _ in queued:
        assert store.claim(task, job, "w") == "ok"
    barrier = threading.Barrier(2)
    outcomes = []

    def finish(task, job):
        barrier.wait()
        outcomes.append(store.complete(task, job, RobotResult(robot_name=task, output=[TextMessage(content=task)])))

    threads = [threading.Thread(target=finish, args=(t, j)) for t, j, _ in queued]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    enqueued = [item for _, _, items in outcomes for item in items]
    assert [t for t, _, _ in enqueued] == ["child"]
    # a duplicate completion is refused and enqueues nothing
    status, _, items = store.complete("p1", queued[0][1], RobotResult(robot_name="p1"))
    assert status == "duplicate" and items == []


def test_failing_robot_becomes_an_error_result_and_the_run_goes_on(redis_client):
    net = create_network("fails")
    net.task("bad", robot("bad", "scripted/fail:provider down"), retries=0)
    net.task("after", robot("after", "scripted/echo"), depends_on=["bad"])
    result, handle = run(redis_client, net, "x")
    # the run goes on past the failure, and says so: not a success
    assert result.status == "completed_with_errors" and not result.ok and result.failed_tasks == ["bad"]
    assert result.states == {"bad": "failed", "after": "done"}
    meta = handle.store.meta()
    assert (meta["tasks_done"], meta["tasks_failed"], meta["tasks_skipped"]) == ("1", "1", "0")
    assert events(handle, "run.completed")[0].data == {"status": "completed_with_errors", "done": 1,
                                                        "failed": 1, "skipped": 0}
    bad = result["bad"]
    assert bad.failed and bad.error.startswith("Error: InferenceError:") and "provider down" in bad.error
    assert result.reply.startswith("echo: Error: InferenceError:")
    assert events(handle, "task.failed", "bad")[0].data["error"] == bad.error


def test_a_model_failure_is_retried_by_the_gateway_not_again_by_rq(redis_client):
    """The gateway already spent the call's retries (max_retries, here 0): the task's
    ``retries`` do not run the call again, so one failing task makes one call's requests."""
    net = create_network("retry")
    net.task("flaky", robot("flaky", "scripted/fail:temporary"), retries=2)
    result, handle = run(redis_client, net, "x")
    assert result.states == {"flaky": "failed"}
    assert len(events(handle, "task.retrying", "flaky")) == 0
    assert len(events(handle, "task.started", "flaky")) == 1
    assert len(events(handle, "task.failed", "flaky")) == 1


def test_a_retryable_error_is_retried_by_rq_then_recorded(redis_client, monkeypatch):
    """Another retryable error (here a delegation that failed) is re-run up to ``retries``."""
    from robot_lab.errors import InferenceError
    from robot_lab.runtime.robot import core

    def failing_run(self, *args, **kwargs):
        raise InferenceError("Delegation to 'helper' failed: gone")

    monkeypatch.setattr(core.Robot, "run", failing_run)
    net = create_network("retry-other")
    net.task("flaky", robot("flaky", "scripted/echo"), retries=2)
    result, handle = run(redis_client, net, "x")
    assert result.states == {"flaky": "failed"}
    assert len(events(handle, "task.retrying", "flaky")) == 2
    assert len(events(handle, "task.started", "flaky")) == 3
    assert len(events(handle, "task.failed", "flaky")) == 1


def test_max_concurrent_robots_holds_back_ready_tasks(redis_client):
    net = create_network("limited", config={"max_concurrent_robots": 1})
    with net.parallel("wide"):
        for i in range(3):
            net.task(f"t{i}", robot(f"t{i}", "scripted/sleep:50"))
    result, handle = run(redis_client, net, "x", threads=3)
    assert result.status == "completed"
    running = 0
    for event in handle.events():
        if event.event == "task.started":
            running += 1
            assert running == 1
        elif event.event in ("task.completed", "task.failed"):
            running -= 1


def test_context_and_task_context_reach_the_template(redis_client, tmp_path):
    template = tmp_path / "helper.md"
    template.write_text("Customer {{ customer }} on plan {{ plan }}.\n")
    bot = robot("tmpl", "scripted/echo", template=str(template), context={"customer": "?", "plan": "?"})
    net = create_network("ctx")
    net.task("short", bot, context={"plan": "gold"})
    net.task("long", bot, context={"plan": "platinum " * 100})
    result, _ = run(redis_client, net, "hello", context={"customer": "ACME"})
    assert result["short"].reply == result["long"].reply == "echo: hello"
    # the rendered system prompt is part of what the scripted model counts as input
    assert result["long"].input_tokens > result["short"].input_tokens + 150


def test_bad_input_fails_at_submission_before_any_job(redis_client):
    coordinator = Coordinator(connection=redis_client)
    name = f"ghost-{uid()}"
    net = create_network("bad")
    net.task("a", name)
    with pytest.raises(ConfigurationError, match=f"task 'a' uses unknown robot '{name}'"):
        coordinator.submit(net, "x")
    spec_net = create_network("badtool")
    spec_net.task("a", RobotSpec(name=f"tooly-{uid()}", model="scripted/echo", local_tools=["no_such_mod:fn"]))
    with pytest.raises(ConfigurationError, match="tool cannot import 'no_such_mod:fn'"):
        coordinator.submit(spec_net, "x")
    router_net = create_network("badrouter")
    router_net.task("a", robot("a", "scripted/echo"), routes=["b"], router="no_such_mod:route")
    router_net.task("b", robot("b", "scripted/echo"), depends_on="optional")
    with pytest.raises(ConfigurationError, match="task 'a' router: cannot import"):
        coordinator.submit(router_net, "x")
    cyclic = create_network("cyc")
    cyclic.task("a", robot("a", "scripted/echo"), depends_on=["b"])
    cyclic.task("b", robot("b", "scripted/echo"), depends_on=["a"])
    with pytest.raises(ConfigurationError, match="cycle"):
        coordinator.submit(cyclic, "x")
    keys = default_keys()
    assert not redis_client.exists(keys.runs_index())
    assert Queue(f"robot:{name}", connection=redis_client).count == 0


def test_a_published_robot_spec_is_enough_to_run(redis_client):
    from robot_lab.runtime.registry import publish_specs

    name = f"published-{uid()}"
    publish_specs([RobotSpec(name=name, model="scripted/text:from the registry")], connection=redis_client)
    net = create_network("byname")
    net.task("only", name)
    result, _ = run(redis_client, net, "x")
    assert result.reply == "from the registry"


def test_cancel_drops_queued_tasks(redis_client):
    net = create_network("cancel")
    net.task("a", robot("a", "scripted/echo"))
    net.task("b", robot("b", "scripted/echo"), depends_on=["a"])
    coordinator = Coordinator(connection=redis_client)
    handle = coordinator.submit(net, "x")
    assert handle.cancel() == "cancelled"
    with EmbeddedWorkers(redis_client, sorted({t.robot for t in net.spec.tasks}), threads=1):
        handle.wait(timeout=60)
    result = handle.result()
    assert result.status == "cancelled"
    assert result.states == {"a": "cancelled", "b": "cancelled"}
    assert not events(handle, "task.started")
    assert [e.event for e in handle.events()][-2:] == ["run.cancelled", "stream.ended"]


def test_duplicate_job_and_lost_worker_never_run_a_recorded_task_twice(redis_client):
    net = create_network("lost")
    net.task("only", robot("only", "scripted/text:done once"))
    coordinator = Coordinator(connection=redis_client)
    handle = coordinator.submit(net, "x")
    store = handle.store
    first_job = store.job_id("only")
    # a worker claims the task and dies: no heartbeat, its lease runs out
    assert store.claim("only", first_job, "dead-worker", lease_ms=1500) == "ok"
    assert store.claim("only", first_job, "other-worker") == "busy"
    from tests.redis_server import wait_for

    wait_for(lambda: not redis_client.exists(default_keys().run_lease(handle.run_id, "only")))
    assert coordinator.sweep_run(handle.run_id) == 1
    second_job = store.job_id("only")
    assert second_job != first_job and store.attempts()["only"] == 2
    assert store.claim("only", first_job, "dead-worker") == "stale"
    with EmbeddedWorkers(redis_client, [net.spec.tasks[0].robot], threads=2):
        # the same job delivered twice: the second delivery finds the result recorded
        enqueue_jobs(redis_client, default_keys(), handle.run_id, [("only", second_job, net.spec.tasks[0].robot)])
        result = handle.wait(timeout=30)
        wait_for(lambda: Queue(f"robot:{net.spec.tasks[0].robot}", connection=redis_client).count == 0)
    assert result.reply == "done once"
    assert len(events(handle, "task.completed", "only")) == 1
    assert [e.data["reason"] for e in events(handle, "task.retrying")] == ["worker lost (lease expired)"]


def test_a_task_that_keeps_losing_its_worker_fails_after_max_attempts(redis_client, monkeypatch):
    from tests.redis_server import wait_for

    monkeypatch.setenv("ROBOT_LAB_TASK_MAX_ATTEMPTS", "2")
    net = create_network("cursed")
    net.task("bad", robot("bad", "scripted/text:never"))
    net.task("after", robot("after", "scripted/echo"), depends_on="bad")
    coordinator = Coordinator(connection=redis_client)
    handle = coordinator.submit(net, "x")
    store = handle.store
    for attempt in (1, 2):
        job = store.job_id("bad")
        assert store.claim("bad", job, f"doomed-{attempt}", lease_ms=200) == "ok"  # then the worker dies
        wait_for(lambda: not redis_client.exists(default_keys().run_lease(handle.run_id, "bad")))
        coordinator.sweep_run(handle.run_id)
    assert store.states()["bad"] == "failed"
    assert store.attempts()["bad"] == 2
    failed = events(handle, "task.failed", "bad")
    assert "lost its worker 2 times (max_attempts 2)" in failed[0].data["error"]
    with EmbeddedWorkers(redis_client, [t.robot for t in net.spec.tasks], threads=2):
        result = handle.wait(timeout=30)
    assert result.states == {"bad": "failed", "after": "done"}  # the run goes on, robot_lab style
    assert result.status == "completed_with_errors"  # a task failed in RECLAIM, too
    assert result["bad"].error.startswith("Error: WorkerLost")


def test_embedded_network_run_uses_in_process_workers(redis_client, request):
    if request.node.callspec.params["redis_client"] != "fake":
        pytest.skip("embedded mode is the fakeredis path")
    net = create_network("embedded")
    net.task("a", robot("a", "scripted/text:one"))
    net.task("b", robot("b", "scripted/echo"), depends_on="a")
    result = net.run("go")
    assert result.status == "completed" and result.reply == "echo: one"
    assert net.attach(result.run_id).status == "completed"


def test_enqueueing_a_wide_fan_out_asks_the_server_version_once_per_queue(redis_client, monkeypatch):
    """rq asks the server's version (an INFO round trip) once per Queue object: a fan-out of
    40 tasks on two robots makes two such calls, not 40."""
    from rq import queue as rq_queue

    from robot_lab.keys import Keys

    calls: list[int] = []
    real = rq_queue.get_version
    monkeypatch.setattr(rq_queue, "get_version", lambda connection: calls.append(1) or real(connection))
    run_id = f"fan-{uid()}"
    robots = [f"fan-a-{uid()}", f"fan-b-{uid()}"]
    items = [(f"t{i}", f"rl-{run_id}-t{i}-1", robots[i % 2]) for i in range(40)]
    enqueue_jobs(redis_client, Keys(prefix="x"), run_id, items)
    assert len(calls) == 2
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.rq_connection import rq_connection

    counts = [Queue(f"robot:{r}", connection=rq_connection(redis_client), serializer=JobSerializer).count
              for r in robots]
    assert counts == [20, 20]


def test_a_wide_fan_out_is_enqueued_in_chunks_so_workers_start_early(redis_client, monkeypatch):
    """A task's end that enqueues many jobs sends them ENQUEUE_CHUNK at a time (the first
    ones are on the queue while the rest are built), all of them, in order."""
    from redis.client import Pipeline

    from robot_lab.keys import Keys
    from robot_lab.network import enqueue
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.rq_connection import rq_connection

    monkeypatch.setattr(enqueue, "ENQUEUE_CHUNK", 16)
    queued_at_each_send: list[int] = []
    name = f"chunk-{uid()}"
    queue = Queue(f"robot:{name}", connection=rq_connection(redis_client), serializer=JobSerializer)
    real = Pipeline.execute

    def execute(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(queue.key in map(str, command[0]) for command in self.command_stack):  # ours, not another thread's
            queued_at_each_send.append(queue.count)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "execute", execute)
    run_id = f"chunk-{uid()}"
    items = [(f"t{i}", f"rl-{run_id}-t{i}-1", name) for i in range(40)]
    enqueue_jobs(redis_client, Keys(prefix="x"), run_id, items)
    monkeypatch.setattr(Pipeline, "execute", real)
    assert queued_at_each_send == [0, 16, 32]  # three round trips; jobs already queued before the last
    assert queue.job_ids == [job_id for _, job_id, _ in items]


def test_wait_without_on_event_reads_the_stream_in_batches_and_sees_the_end(redis_client, monkeypatch):
    """``wait()`` with no ``on_event`` reads the events of a run that is still going at most
    once per WAIT_COALESCE (not once per event as they come) and returns its result once
    it is over; on a run that is over already it returns at once."""
    import time

    from robot_lab.network import coordinator as coordinator_module

    net = create_network("batched")
    bot = robot("batched", "scripted/sleep:20")  # events keep coming for a while, a few at a time
    for i in range(24):
        net.task(f"t{i}", bot, depends_on=f"t{i - 1}" if i else None)
    coordinator = Coordinator(connection=redis_client)
    handle = coordinator.submit(net, "go")
    reads: list[int] = []
    store_r = handle.store.r
    real_xread = store_r.xread
    monkeypatch.setattr(store_r, "xread", lambda *a, **k: reads.append(1) or real_xread(*a, **k))
    monkeypatch.setattr(coordinator_module, "WAIT_COALESCE", 0.25)
    done = threading.Event()

    def work() -> None:  # the tasks run while wait() waits
        with EmbeddedWorkers(redis_client, [bot.name], threads=1):
            done.wait(60)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    started = time.monotonic()
    try:
        result = handle.wait(timeout=60)
    finally:
        elapsed = time.monotonic() - started
        done.set()
        worker.join(10)
    assert result.status == "completed" and len(result.context) == 24
    total_events = len(handle.events())
    # one read per coalescing window (and the last one, that sees the end), whatever the pace
    assert len(reads) <= elapsed / 0.25 + 3 < total_events / 3, (len(reads), elapsed, total_events)
    reads.clear()
    assert handle.wait(timeout=5).status == "completed"  # over already: seen on the first look
    assert reads == []
