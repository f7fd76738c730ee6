"""The task's round trips, batched: the claim reads what the job needs in the
same script, and the result goes out with the events the task still owes and the input its
robot received -- the same events, in the same order, as when each was its own call."""

from __future__ import annotations

import uuid

import msgspec

from robot_lab.network.coordinator import Coordinator
from robot_lab.network.dsl import create_network
from robot_lab.network.embedded import EmbeddedWorkers
from robot_lab.runtime.robot import build
from robot_lab.schemas import RobotResult, TextMessage
from tests.network_helpers import fan
from tests.redis_server import wait_for


def uid() -> str:
    return uuid.uuid4().hex[:8]


def result(text: str) -> RobotResult:
    return RobotResult(robot_name="r", output=[TextMessage(content=text)])


def submit(redis_client, net):  # type: ignore[no-untyped-def]
    """Submit with no worker: returns the handle, its store and the queued tasks' job ids."""
    handle = Coordinator(connection=redis_client).submit(net, "go")
    jobs = {k.decode(): v.decode() for k, v in handle.store.r.hgetall(handle.store.key + ":jobs").items()}
    return handle, handle.store, jobs


def test_start_task_claims_and_reads_the_run_fields_and_the_parents_results(redis_client) -> None:  # type: ignore[no-untyped-def]
    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("reads")
    net.task("a", bot)
    net.task("b", bot)
    net.task("join", bot, depends_on=["b", "a"])
    handle, store, jobs = submit(redis_client, net)
    first = store.start_task("a", jobs["a"], "w1", 5000, ["network", "message", "stream", "nosuchfield"])
    assert first.status == "ok" and first.sources == []
    assert first.meta == {"network": "reads", "message": '"go"', "stream": "1"}  # absent fields left out
    assert store.start_task("a", jobs["a"], "w2", 5000, ["network"]).status == "busy"  # leased: no data
    assert store.states()["a"] == "running"
    for task in ("a", "b"):
        store.start_task(task, jobs[task], "w1", 5000, [])
        _, _, items = store.complete(task, jobs[task], result(f"{task} says"))
    (join, join_job, _), = items
    start = store.start_task(join, join_job, "w1", 5000, ["network"])
    # the parents' results, in the order the task lists its parents
    assert [msgspec.json.decode(s, type=RobotResult).reply for s in start.sources] == ["b says", "a says"]


def test_complete_sends_the_owed_events_first_and_records_the_input_once(redis_client) -> None:  # type: ignore[no-untyped-def]
    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("owed")
    net.task("only", bot)
    handle, store, jobs = submit(redis_client, net)
    store.start_task("only", jobs["only"], "w1", 5000, [])
    owed = [("text.delta", {"delta": "hel"}), ("memory.changed", {"scope": "run:x", "key": "k", "op": "set",
                                                                  "version": 1, "writer": bot.name})]
    status, _, _ = store.complete("only", jobs["only"], result("hello"), usage={"input_tokens": 1, "output_tokens": 1},
                                  input="the input", events=owed)
    assert status == "ok"
    again = store.complete("only", jobs["only"], result("hello"), input="other", events=owed)
    assert again[0] == "duplicate"
    events = [e for _, e in store.events()]
    tail = [(e.event, e.task, e.robot, e.data) for e in events if e.task == "only" and e.event != "task.queued"]
    assert [name for name, *_ in tail] == ["task.started", "text.delta", "memory.changed", "usage.updated",
                                           "task.completed"]
    assert tail[1][1:] == ("only", bot.name, {"delta": "hel"}) and tail[2][3]["key"] == "k"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # one sequence, no gap, no repeat
    assert store.r.hget(store.key + ":inputs", "only") == b"the input"


def test_a_streamed_chain_sends_each_tasks_text_and_input(redis_client) -> None:  # type: ignore[no-untyped-def]
    first = build(f"hp-{uid()}", model="scripted/echo")
    second = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("chain")
    net.task("one", first)
    net.task("two", second, depends_on="one")
    with EmbeddedWorkers(redis_client, [first.name, second.name], threads=2):
        handle = Coordinator(connection=redis_client).submit(net, "hi there")
        outcome = handle.wait(timeout=60)
    assert outcome.reply == "echo: echo: hi there"
    for task, text in (("one", "echo: hi there"), ("two", "echo: echo: hi there")):
        names = [e.event for e in handle.events() if e.task == task]
        assert names == ["task.queued", "task.started", "step.started", "text.delta", "step.completed",
                         "usage.updated", "task.completed"], names
        assert "".join(e.data["delta"] for e in handle.events() if e.task == task and e.event == "text.delta") == text
    inputs = handle.store.r.hgetall(handle.store.key + ":inputs")
    assert inputs == {b"one": b"hi there", b"two": b"echo: hi there"}


def test_one_keeper_thread_keeps_every_running_tasks_lease(redis_client) -> None:  # type: ignore[no-untyped-def]
    import threading

    from robot_lab.outage import OutageTracker
    from robot_lab.network.lease import LeaseHeartbeat

    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("leases")
    net.task("a", bot)
    net.task("b", bot)
    handle, store, jobs = submit(redis_client, net)
    lease_ms = 3000  # a beat every second: a keeper starved for a moment on a loaded machine keeps it
    for task in ("a", "b"):
        assert store.start_task(task, jobs[task], "w1", lease_ms, []).status == "ok"
    lowest: dict[str, int] = {}
    beaten: set[str] = set()

    def beats() -> bool:
        """Whether each lease's time to live went back up (a beat) since it was lowest."""
        for task in ("a", "b"):
            ttl = store.r.pttl(f"{store.key}:lease:{task}")
            if ttl > lowest.setdefault(task, ttl):
                beaten.add(task)
            lowest[task] = min(lowest[task], ttl)
        return beaten == {"a", "b"}

    with LeaseHeartbeat(store, "a", "w1", lease_ms, OutageTracker("a")) as a, \
            LeaseHeartbeat(store, "b", "w1", lease_ms, OutageTracker("b")) as b:
        wait_for(beats, interval=0.05)
        assert len([t for t in threading.enumerate() if t.name == "lease-keeper"]) == 1
    store.complete("a", jobs["a"], result("done"))  # the result deletes the lease
    assert not store.r.exists(f"{store.key}:lease:a") and not a.lost and not b.lost
    wait_for(lambda: not store.r.exists(f"{store.key}:lease:b"))  # no beats once its task ended: it expires


def test_a_job_stranded_in_rqs_intermediate_list_is_requeued_by_the_sweep(redis_client) -> None:  # type: ignore[no-untyped-def]
    """A worker moved the job off its queue (rq's BLMOVE into ``<queue>:intermediate``) and a
    Redis crash lost what came next: the rq job still says ``queued`` but sits in no queue.
    The sweep finds it (LPOS) and enqueues it again; a job still on its queue is left alone."""
    from rq import Queue

    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("stranded")
    net.task("a", bot)
    net.task("b", bot)
    handle, store, jobs = submit(redis_client, net)
    queue = Queue(f"robot:{bot.name}", connection=redis_client)
    assert redis_client.lrem(queue.key, 0, jobs["a"]) == 1  # taken off the queue ...
    redis_client.rpush(f"{queue.key}:intermediate", jobs["a"])  # ... and stranded there
    assert store.repair_queued(grace=0) == []  # first seen off its queue: it may be starting
    assert store.repair_queued(grace=60) == []  # seen again, but not yet for 60 s
    items = store.repair_queued(grace=0)
    assert items == [("a", jobs["a"], bot.name)]  # b is still on its queue: not touched
    assert store.repair_queued(grace=0) == []  # requeued: it starts over
    redis_client.delete(queue.key, f"{queue.key}:intermediate")


def test_jobs_an_in_flight_worker_holds_are_never_stranded_while_it_lives(redis_client) -> None:  # type: ignore[no-untyped-def]
    """The in-flight worker takes a batch of jobs off the queue at once, and one may wait
    seconds for a thread: each is held (``R:held:<task>``, beaten by the lease keeper), so a
    sweep never takes it for stranded. Once its holds are gone (the worker died: they expire),
    the jobs are requeued as any stranded job."""
    from rq import Queue

    from robot_lab.network.lease import release_holds
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.workers.inflight import in_flight_worker_class

    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("held")
    with net.parallel("all"):
        for i in range(3):
            net.task(f"t{i}", bot)
    handle, store, jobs = submit(redis_client, net)
    queue = Queue(f"robot:{bot.name}", connection=redis_client, serializer=JobSerializer)
    worker = in_flight_worker_class()([queue], connection=redis_client, serializer=JobSerializer, in_flight=8)
    taken = worker._dequeue_batch(8)
    assert sorted(job.id for job, _ in taken) == sorted(jobs.values()) and redis_client.llen(queue.key) == 0
    held = [store.keys.run_held(store.run_id, task) for task in jobs]
    assert redis_client.exists(*held) == 3
    assert store.repair_queued(grace=0) == []
    assert store.repair_queued(grace=0) == []  # seen off its queue twice: held, so not stranded
    release_holds(list(worker._holds.values()))
    redis_client.delete(*held)  # what a dead worker's holds do within a lease time
    assert store.repair_queued(grace=0) == []  # first sighting
    assert sorted(t for t, _, _ in store.repair_queued(grace=0)) == sorted(jobs)
    redis_client.delete(queue.key, f"{queue.key}:intermediate")


def test_a_task_reads_its_robots_learnings_with_its_claim_and_still_injects_them(redis_client) -> None:  # type: ignore[no-untyped-def]
    """The robot's stored learnings ride on the claim's round trip once the run's graph is
    known here (every task after the first of a run in this process); either way the request
    starts with them, and a lesson learned between two tasks reaches the second."""
    from robot_lab.memory.store import Memory

    bot = build(f"hp-{uid()}", model="scripted/echo")
    Memory.for_robot(bot.name, redis=redis_client).set("learnings", ["check the order id"])
    net = create_network("learned")
    net.task("one", bot)
    net.task("two", bot, depends_on=["one"])
    with EmbeddedWorkers(redis_client, [bot.name], threads=1):
        first = Coordinator(connection=redis_client).submit(net, "refund").wait(timeout=60)
        Memory.for_robot(bot.name, redis=redis_client).set("learnings", ["say please"])
        second = Coordinator(connection=redis_client).submit(net, "refund").wait(timeout=60)
    lesson = "echo: LEARNINGS FROM PREVIOUS RUNS:\n- {}\n\n"
    assert first.context["one"].reply == lesson.format("check the order id") + "refund"
    assert first.context["two"].reply.startswith(lesson.format("check the order id") + "echo: LEARNINGS")
    assert second.context["one"].reply == lesson.format("say please") + "refund"


def test_the_first_tasks_of_a_run_arriving_at_once_compile_its_graph_once(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    from robot_lab.network import graphs as graph_cache

    handle, store, _ = submit(redis_client, fan(build(f"hp-{uid()}", model="scripted/echo"), 20, "once"))
    compiled: list[int] = []
    real = graph_cache.compile_network

    def slow_compile(spec):  # type: ignore[no-untyped-def]
        compiled.append(1)
        time.sleep(0.2)  # long enough for every thread to arrive meanwhile
        return real(spec)

    monkeypatch.setattr(graph_cache, "compile_network", slow_compile)
    start = threading.Barrier(20, timeout=10)
    graphs: list[object] = []

    def task() -> None:
        start.wait()
        graphs.append(graph_cache.graph_for(store))

    threads = [threading.Thread(target=task) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(compiled) == 1 and len(graphs) == 20 and all(g is graphs[0] for g in graphs)
    assert set(graphs[0].tasks) == {f"t{i}" for i in range(20)}


def test_the_graph_cache_keeps_a_bounded_number_of_tasks_evicting_idle_graphs_first(redis_client,  # type: ignore[no-untyped-def]
                                                                                    monkeypatch) -> None:
    from robot_lab.network import graphs as graph_cache

    monkeypatch.setattr(graph_cache, "_graph_cache", graph_cache.OrderedDict())
    monkeypatch.setattr(graph_cache, "_graph_tasks", 0)
    monkeypatch.setattr(graph_cache, "GRAPH_CACHE_TASKS", 25)
    now = [1000.0]
    monkeypatch.setattr(graph_cache, "_clock", lambda: now[0])
    bot = build(f"hp-{uid()}", model="scripted/echo")
    stores = [submit(redis_client, fan(bot, 10, f"c{i}"))[1] for i in range(4)]
    compiled: list[int] = []
    real = graph_cache.compile_network

    def counting(spec):  # type: ignore[no-untyped-def]
        compiled.append(1)
        return real(spec)

    monkeypatch.setattr(graph_cache, "compile_network", counting)
    a, b, c, d = stores
    graph_a = graph_cache.graph_for(a)
    graph_cache.graph_for(b)
    graph_cache.graph_for(c)  # 30 tasks > 25, but a and b are in use: nothing evicted
    assert graph_cache.cached_graph(a) is graph_a and graph_cache.cached_graph(b) is not None
    assert graph_cache._graph_tasks == 30 and len(compiled) == 3
    now[0] += graph_cache.GRAPH_IDLE + 1
    graph_cache.graph_for(a)  # a hit: a is the most recently used now
    graph_cache.graph_for(d)  # over the bound: b, then c, idle and least recently used, go
    assert graph_cache.cached_graph(b) is None and graph_cache.cached_graph(c) is None
    assert graph_cache.cached_graph(a) is graph_a and graph_cache.cached_graph(d) is not None
    assert graph_cache._graph_tasks == 20 and len(compiled) == 4
    again = graph_cache.graph_for(b)  # an evicted run's next task compiles it again from the record
    assert set(again.tasks) == {f"t{i}" for i in range(10)} and len(compiled) == 5


def test_one_graph_larger_than_the_cache_is_still_kept(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.network import graphs as graph_cache

    monkeypatch.setattr(graph_cache, "_graph_cache", graph_cache.OrderedDict())
    monkeypatch.setattr(graph_cache, "_graph_tasks", 0)
    monkeypatch.setattr(graph_cache, "GRAPH_CACHE_TASKS", 5)
    store = submit(redis_client, fan(build(f"hp-{uid()}", model="scripted/echo"), 10, "big"))[1]
    graph = graph_cache.graph_for(store)
    assert graph_cache.cached_graph(store) is graph and graph_cache._graph_tasks == 10


def _commands(client) -> int:  # type: ignore[no-untyped-def]
    """Commands the server has run so far (scripts' own calls included)."""
    return sum(int(stats["calls"]) for name, stats in client.info("commandstats").items())


def test_a_result_costs_the_same_redis_commands_in_a_wide_run_as_in_a_narrow_one() -> None:
    """Recording a result touches only the task's dependents (the run's counters say what
    else changed): no transition reads every task's state, which made a wide fan-out cost
    O(tasks) per result (O(tasks^2) per run)."""
    import redis

    from tests.redis_server import RedisServer

    server = RedisServer()
    url = server.start(private=True)  # commandstats: nothing else may run commands on it
    if url is None:
        import pytest

        pytest.skip(server.reason)
    try:
        client = redis.Redis.from_url(url)
        costs = {}
        for width in (5, 400):
            bot = build(f"wide-{uid()}", model="scripted/echo")
            net = create_network(f"fan{width}")
            net.task("start", bot)
            with net.parallel("fan", depends_on="start"):
                for i in range(width):
                    net.task(f"t{i}", bot)
            net.task("join", bot, depends_on=["fan"])
            handle, store, jobs = submit(client, net)
            store.start_task("start", jobs["start"], "w", 5000, [])
            _, _, items = store.complete("start", jobs["start"], result("go on"))
            assert len(items) == width  # the start's end queued the whole fan at once
            jobs = {task: job for task, job, _ in items}
            store.start_task("t1", jobs["t1"], "w", 5000, [])
            before = _commands(client)
            _, _, more = store.complete("t1", jobs["t1"], result("one"))
            costs[width] = _commands(client) - before
            assert more == []  # the join waits for the rest
            for i in range(width):
                if i != 1:
                    store.start_task(f"t{i}", jobs[f"t{i}"], "w", 5000, [])
                    _, _, more = store.complete(f"t{i}", jobs[f"t{i}"], result("x"))
            assert [task for task, _, _ in more] == ["join"]  # queued by the last parent's result only
            join_job = more[0][1]
            store.start_task("join", join_job, "w", 5000, [])
            store.complete("join", join_job, result("all"))
            assert store.status() == "completed"
        assert costs[400] == costs[5]
    finally:
        server.stop()


def test_a_run_written_before_the_counters_is_upgraded_by_its_next_transition(redis_client) -> None:  # type: ignore[no-untyped-def]
    """A run submitted by a version without the counters (no ``open``/``active``, no
    ``R:counts``, graph entries without ``i``/``dependents``) gets them built from its task
    states by the first transition that touches it, then runs on as before: skips, the
    join, the end."""
    import json

    bot = build(f"old-{uid()}", model="scripted/echo")
    net = create_network("old")
    net.task("a", bot)
    net.task("b", bot)
    net.task("router", bot, routes=["maybe"])
    net.task("maybe", bot, depends_on="optional")
    net.task("join", bot, depends_on=["a", "b"])
    handle, store, jobs = submit(redis_client, net)
    store.start_task("a", jobs["a"], "w", 5000, [])
    store.complete("a", jobs["a"], result("a done"))
    r = store.r  # now strip what this version adds, as the previous one wrote runs
    r.hdel(store.key, "open", "active")
    r.delete(store.key + ":counts", store.key + ":ready")
    for task, raw in r.hgetall(store.key + ":graph").items():
        entry = json.loads(raw)
        entry.pop("i"), entry.pop("dependents")
        r.hset(store.key + ":graph", task, json.dumps(entry))
    store.start_task("router", jobs["router"], "w", 5000, [])
    _, _, items = store.complete("router", jobs["router"], result("no route"))  # the upgrade, then: skipped
    assert items == [] and store.states()["maybe"] == "skipped"
    counts = {k.decode(): int(v) for k, v in r.hgetall(store.key + ":counts").items()}
    assert counts["l:join"] == 1 and counts["r:join"] == 1  # b open, a ran
    assert r.hget(store.key, "open") == b"2"  # b and join
    store.start_task("b", jobs["b"], "w", 5000, [])
    _, _, items = store.complete("b", jobs["b"], result("b done"))
    [(join, job, _)] = items
    store.start_task(join, job, "w", 5000, [])
    store.complete(join, job, result("joined"))
    assert store.status() == "completed"
    assert store.states() == {"a": "done", "b": "done", "router": "done", "maybe": "skipped", "join": "done"}


def test_max_concurrent_queues_ready_tasks_in_the_runs_order(redis_client) -> None:  # type: ignore[no-untyped-def]
    """Tasks held back by ``max_concurrent`` wait in the run's ready set and go in the order
    the network defines them, one per slot freed."""
    bot = build(f"mc-{uid()}", model="scripted/echo")
    net = create_network("mc")
    with net.parallel("fan"):
        for i in range(6):
            net.task(f"t{i}", bot)
    handle = Coordinator(connection=redis_client).submit(net, "go", max_concurrent=2)
    store = handle.store
    jobs = {k.decode(): v.decode() for k, v in store.r.hgetall(store.key + ":jobs").items()}
    assert sorted(jobs) == ["t0", "t1"]
    went = []
    queue = list(jobs.items())
    while queue:
        task, job = queue.pop(0)
        store.start_task(task, job, "w", 5000, [])
        _, _, items = store.complete(task, job, result(task))
        went += [t for t, _, _ in items]
        queue += [(t, j) for t, j, _ in items]
    assert went == ["t2", "t3", "t4", "t5"]
    assert store.status() == "completed"


def test_a_task_after_routed_tasks_runs_when_the_activated_one_ran(redis_client) -> None:  # type: ignore[no-untyped-def]
    """A task depending on a router's optional tasks runs once they all ended, because the
    one activated ran (the skipped ones count as ended, not as run), and is skipped only
    when every one of them was."""
    bot = build(f"rt-{uid()}", model="scripted/echo")
    net = create_network("routed")
    net.task("classify", bot, routes=["billing", "technical", "general"])
    for name in ("billing", "technical", "general"):
        net.task(name, bot, depends_on="optional")
    net.task("sentiment", bot, depends_on=["billing", "technical", "general"])
    handle, store, jobs = submit(redis_client, net)
    store.start_task("classify", jobs["classify"], "w", 5000, [])
    _, _, items = store.complete("classify", jobs["classify"], result("technical"), activate=["technical"])
    [(task, job, _)] = items
    assert task == "technical" and store.states()["billing"] == "skipped" == store.states()["general"]
    store.start_task(task, job, "w", 5000, [])
    _, _, items = store.complete(task, job, result("fixed"))
    assert [t for t, _, _ in items] == ["sentiment"]
    store.start_task("sentiment", items[0][1], "w", 5000, [])
    store.complete("sentiment", items[0][1], result("calm"))
    assert store.status() == "completed" and store.states()["sentiment"] == "done"


def _steps_pipelines(monkeypatch) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """Every coalesced pipeline that writes a step journal, as its command names."""
    from robot_lab import coalesce

    seen: list[list[str]] = []
    real = coalesce.execute

    def spy(pipe, *args, **kwargs):  # type: ignore[no-untyped-def]
        commands = [(str(c[0][0]), str(c[0][1])) for c in pipe.command_stack]
        if any(name == "HSET" and ":steps:" in key for name, key in commands):
            seen.append([name for name, _ in commands])
        return real(pipe, *args, **kwargs)

    monkeypatch.setattr(coalesce, "execute", spy)
    return seen


def test_a_tasks_last_model_step_is_journaled_in_its_results_round_trip(redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A model reply that asks for no tool ends the task: its journal record goes out ahead
    of the result script in the same pipeline, not in a round trip of its own."""
    seen = _steps_pipelines(monkeypatch)
    bot = build(f"hp-{uid()}", model="scripted/echo")
    net = create_network("last")
    net.task("only", bot)
    with EmbeddedWorkers(redis_client, [bot.name], threads=1):
        done = Coordinator(connection=redis_client).submit(net, "hi").wait(timeout=60)
    assert done.context["only"].reply == "echo: hi"
    assert seen and all(names[:3] == ["HSET", "EXPIRE", "EVALSHA"] for names in seen), seen


def test_a_model_step_asking_for_a_tool_is_in_the_journal_before_the_tool_runs(redis_client) -> None:  # type: ignore[no-untyped-def]
    from robot_lab.llm.recording import clear_recorded_calls, recorded_calls
    from robot_lab.llm.scripted import register_script

    script = f"journal-{uid()}"
    register_script(script, {"turns": [{"tool_calls": [{"name": "journal_steps", "arguments": {}}]},
                                       {"reply": "done"}]})
    bot = build(f"hp-{uid()}", model=f"scripted/{script}",
                local_tools=["tests.fixtures.durable_tools:journal_steps"])
    net = create_network("tooled")
    net.task("only", bot, tools="inherit")
    clear_recorded_calls()
    with EmbeddedWorkers(redis_client, [bot.name], threads=1):
        done = Coordinator(connection=redis_client).submit(net, "hi").wait(timeout=60)
    assert done.context["only"].reply == "done"
    assert done.context["only"].tool_calls[0].content == {"data": "0"}  # the step that asked, already in Redis
    assert sum(1 for c in recorded_calls() if c["robot"] == bot.name) == 2
