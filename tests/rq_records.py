"""What ``rq info`` and ``job.latest_result()`` read after a worker ran a small network (one
task, then three in parallel): shared by the tests that compare robot-lab's task lifecycle
with rq's own."""

from __future__ import annotations

import uuid
from typing import Any


def network_rq_records(client: Any, worker_class: type, **kwargs: Any) -> dict[str, Any]:
    """Run the network's jobs on ``worker_class`` (burst) against ``client``; return its rq
    records: job statuses and results, the registries, executions left, the worker's count."""
    from rq import Queue
    from rq.job import Job

    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.network.serializer import JobSerializer
    from robot_lab.runtime.robot import build

    bot = build(f"lean-{uuid.uuid4().hex[:6]}", model="scripted/echo")
    net = create_network("lean")
    net.task("a", bot)
    with net.parallel("fan", depends_on="a"):
        for i in range(3):
            net.task(f"b{i}", bot)
    handle = Coordinator(connection=client).submit(net, "hi")
    queue = Queue(f"robot:{bot.name}", connection=client, serializer=JobSerializer)
    worker = worker_class([queue], connection=client, serializer=JobSerializer, **kwargs)
    worker.work(burst=True, logging_level="WARNING")
    assert handle.status == "completed"
    job_ids = [v.decode() for v in client.hvals(handle.store.key + ":jobs")]
    jobs = [Job.fetch(j, connection=client, serializer=JobSerializer) for j in job_ids]
    out = {
        "statuses": sorted(job.get_status() for job in jobs),
        "results": sorted(job.latest_result().return_value["status"] for job in jobs),
        "finished": sorted(queue.finished_job_registry.get_job_ids()) == sorted(job_ids),
        "started": len(queue.started_job_registry),
        "intermediate": client.llen(queue.intermediate_queue_key),
        "executions": sum(1 for _ in client.scan_iter(match="rq:execution:*")
                          if any(j in _.decode() for j in job_ids)),
        "ended": all(job.started_at is not None and job.ended_at is not None and job.worker_name == worker.name
                     for job in jobs),
    }
    worker.refresh()
    out["successful"] = worker.successful_job_count
    queue.delete(delete_jobs=True)
    return out


def rq_simple_worker() -> type:
    """rq's own SimpleWorker, but for its command listener (``RidesOutages.subscribe``, as
    ``robot-lab worker``'s): rq's waits up to 60 s to stop (redis-py 8), and by then the worker
    key whose counter these records read (kept 60 s after the worker's death) was gone."""
    from rq.worker import SimpleWorker

    from robot_lab.workers.supervision import RidesOutages

    class RqSimpleWorker(SimpleWorker):  # type: ignore[misc]
        subscribe = RidesOutages.subscribe

    return RqSimpleWorker
