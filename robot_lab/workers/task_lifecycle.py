"""The lifecycle ``robot-lab worker`` runs network task jobs on, beside rq's own.

:func:`task_job_lifecycle` wraps an rq worker class; :meth:`perform_task_job` is the one
entry point of every network task a ``robot-lab worker`` runs (one at a time or in flight).
"""

from __future__ import annotations

import sys
from typing import Any


def task_job_lifecycle(base: type) -> type:
    """``base`` (an rq worker class) running the Ruby gem's network task jobs on a lean
    lifecycle of its own; every other job goes through rq's ``perform_job``.

    A task job needs little of rq's per-job lifecycle: it has no dependents, callbacks or
    repeats, its claim, lease and result are the run's Lua transitions (which record a
    result exactly once), and rq's part is bookkeeping -- started registry and execution,
    status, result, finished registry. rq's lifecycle spends two MULTI pipelines to start a
    job, a WATCH/MULTI pair to finish it (for dependents), a re-save of the whole job hash
    and a job heartbeat: ~40% of an in-flight worker's interpreter time at a thousand tasks
    in hand (bench/concurrency.py). Here the same records ride with the task's own round
    trips -- the start ones in the claim's pipeline, the finish ones in the result script's
    (a pipeline each on Redis Cluster, where rq's keys sit in other slots) -- so ``rq info``,
    the registries and ``job.latest_result()`` read the same; a job that raises (or times
    out) before its result goes to rq's own failure handling (retries, failed registry). A plain ``rq worker robot:<name>`` runs the same jobs with rq's
    lifecycle."""
    import uuid  # lazy: start-up time

    from rq.executions import Execution, ExecutionRegistry  # lazy: start-up time
    from rq.job import JobStatus  # lazy: start-up time
    from rq.results import Result  # lazy: start-up time
    from rq.timeouts import JobTimeoutException  # lazy: start-up time
    from rq.utils import now, utcformat  # lazy: start-up time
    from rq.worker import WorkerStatus  # lazy: start-up time

    from robot_lab.network.enqueue import JOB_FUNC  # lazy: start-up time
    from robot_lab.logging import get_logger  # lazy: start-up time
    from robot_lab.randomness import random_bytes  # lazy: start-up time
    from robot_lab.rq_connection import data_connection  # lazy: start-up time

    log = get_logger("robot_lab.worker")

    def _create_execution(job: Any, ttl: int, pipe: Any, worker_name: str) -> Any:
        """``Execution.create(job, ttl, pipeline=pipe, worker_name=worker_name)``, the same
        records (execution hash, the job's execution registry, the started registry, the
        worker's execution index), with its uuid4 id from robot_lab.randomness: rq's
        ``uuid4()`` is an ``os.urandom`` system call, which hands the interpreter lock to
        another of a thousand threads and queues this one behind them."""
        execution = Execution(id=uuid.UUID(bytes=random_bytes(16), version=4).hex, job_id=job.id,
                              connection=job.connection, worker_name=worker_name)
        execution._job = job
        execution.save(ttl=ttl, pipeline=pipe)
        ExecutionRegistry(job_id=job.id, connection=pipe).add(execution=execution, ttl=ttl, pipeline=pipe)
        job.started_job_registry.add_execution(execution, pipeline=pipe, ttl=ttl, xx=False)
        if worker_name:  # the worker's execution index; its heartbeat keeps the TTL refreshed
            pipe.sadd(execution.worker_executions_key, execution.composite_key)
            pipe.expire(execution.worker_executions_key, ttl + 60)
        return execution

    class TaskJobLifecycle(base):  # type: ignore[misc, valid-type]
        def execute_job(self, job: Any, queue: Any) -> Any:
            if job.func_name != JOB_FUNC:
                return super().execute_job(job, queue)
            return self.perform_task_job(job, queue)

        def perform_task_job(self, job: Any, queue: Any) -> bool:
            """Start, run and finish one network task job (the entry point of every task
            this worker runs; the job function is robot_lab.workers.run_task)."""
            try:
                return self._perform_task_job(job, queue)
            finally:
                # job.rq_finish's closure refers to the job: left in place, every task's job,
                # execution and queued records (~36 objects) were garbage in a reference cycle
                # that only the cyclic collector frees (tests/test_freed_without_gc.py)
                job.rq_finish = job.rq_start = None

        def _perform_task_job(self, job: Any, queue: Any) -> bool:
            execution = self._start_task_job(job, queue)
            try:
                timeout = job.timeout or self.queue_class.DEFAULT_TIMEOUT
                with self.death_penalty_class(timeout, JobTimeoutException, job_id=job.id):
                    value = job.perform()  # the job function, with rq's current job set
            except BaseException:  # noqa: BLE001 - rq's failure handling: retries, failed registry
                info = sys.exc_info()
                finish = getattr(job, "rq_finish", None)
                if finish is not None and finish.written:  # the task's result and rq's end are recorded
                    log.warning("worker.task_job_raised_after_result", job_id=job.id,
                                error=f"{info[0].__name__ if info[0] else 'error'}: {info[1]}")
                    self.executions.pop(execution.id, None)
                    self.set_state(WorkerStatus.IDLE)
                    return True
                self._flush_start(job)
                self._finalize_failure(job, queue, execution, info)
                self.set_state(WorkerStatus.IDLE)
                return False
            self._flush_start(job)
            self._finish_task_job(job, execution, value)
            return True

        def _start_task_job(self, job: Any, queue: Any) -> Any:
            """rq's prepare_execution + prepare_job_execution: the execution in the started
            registry, the worker busy, the job started by it, off the intermediate list.

            Where rq's keys and the run's live on one server (not Redis Cluster) these
            writes go out in the same pipeline as the task's claim (``job.rq_start``, a
            :class:`~robot_lab.network.task_job.DeferredWrites` that run_task replays into
            its claim): one round trip per task less. Elsewhere, and for a job that ends
            before its claim, :meth:`_flush_start` writes them in a pipeline of their own."""
            from robot_lab.network.task_job import DeferredWrites  # lazy: start-up time

            pipe = self.connection.pipeline(transaction=False)
            execution = _create_execution(job, self.get_heartbeat_ttl(job), pipe, self.name)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            job.prepare_for_execution(self.name, pipeline=pipe)
            pipe.persist(job.key)
            if len(self.queues) == 1:
                pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            job.rq_start = DeferredWrites(pipe)
            if data_connection(self.connection) is not self.connection:  # Cluster: rq's keys elsewhere
                self._flush_start(job)
            self.executions[execution.id] = execution
            self._offer_finish(job, execution)
            return execution

        def _flush_start(self, job: Any) -> None:
            """rq's start records, unless the task's claim wrote them already."""
            deferred = getattr(job, "rq_start", None)
            if deferred is not None:
                deferred.flush(self.connection)

        def _finish_task_job(self, job: Any, execution: Any, value: Any) -> None:
            """rq's success handling for a job with no dependents, callbacks or repeats, in one
            pipeline (:meth:`_queue_finish`) -- or none: where the task's result script took
            them along (``job.rq_finish``, see :meth:`_offer_finish`), only a result that
            differs from the one recorded there is written (a newest rq result)."""
            deferred = getattr(job, "rq_finish", None)
            if deferred is not None and deferred.written:
                self._ended(job)
                if deferred.value != value:  # the transition answered other than ok: rq's newest result says so
                    with self.connection.pipeline(transaction=False) as pipe:
                        self._queue_result(job, execution, value, job.get_result_ttl(self.default_result_ttl), pipe)
                        pipe.execute()
                job._result = value
                self.executions.pop(execution.id, None)
                return
            with self.connection.pipeline(transaction=False) as pipe:
                self._queue_finish(job, execution, value, pipe)
                pipe.execute()
            self._ended(job)
            self.executions.pop(execution.id, None)

        def _ended(self, job: Any) -> None:
            """The worker's own state once the job's end is written (see :meth:`_queue_finish`)."""
            state = getattr(job, "rq_state_after", None)
            if state is not None:
                self._state = state

        def _queue_finish(self, job: Any, execution: Any, value: Any, pipe: Any) -> None:
            """rq's finish records on ``pipe``: status and end time, the result, the finished
            registry, the job's expiry, the execution gone, the worker's counters and state."""
            job.ended_at = now()
            job._result = value
            job._status = JobStatus.FINISHED
            result_ttl = job.get_result_ttl(self.default_result_ttl)
            pipe.hset(job.key, mapping={"status": JobStatus.FINISHED.value, "ended_at": utcformat(job.ended_at)})
            if result_ttl != 0:
                self._queue_result(job, execution, value, result_ttl, pipe)
                job.finished_job_registry.add(job, result_ttl, pipe)
            job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
            execution.delete(job=job, pipeline=pipe)
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            # ``idle`` is written with the job's end, but the worker takes it itself only once
            # that write is done (:meth:`_ended`): rq's SIGTERM handler raises StopRequested
            # wherever the main thread is when the worker looks idle, so a SIGTERM while this
            # round trip was on the wire failed the job mid-write, rq retried it, and the worker,
            # its stop swallowed by the job, never stopped.
            busy = self._state
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            job.rq_state_after, self._state = self._state, busy

        def _queue_result(self, job: Any, execution: Any, value: Any, result_ttl: int, pipe: Any) -> None:
            """rq's record of the job's (newest) successful result, on ``pipe``."""
            if result_ttl != 0:
                Result.create(job, Result.Type.SUCCESSFUL, return_value=value, ttl=result_ttl,
                              worker_name=self.name, pipeline=pipe, execution_id=execution.id,
                              execution_started_at=execution.created_at, execution_ended_at=job.ended_at)

        def _offer_finish(self, job: Any, execution: Any) -> None:
            """Let the task's result script carry rq's finish records (``job.rq_finish``,
            :class:`~robot_lab.network.task_job.FinishWrites`): the job's end in the same
            round trip as the task's result. Only where rq's keys and the run's share a server
            (not Redis Cluster)."""
            from robot_lab.network.task_job import FinishWrites  # lazy: start-up time

            if data_connection(self.connection) is self.connection:
                job.rq_finish = FinishWrites(lambda pipe, value: self._queue_finish(job, execution, value, pipe))

    return TaskJobLifecycle
