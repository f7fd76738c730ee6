"""In-process workers for embedded mode: rq ``SimpleWorker`` loops in threads on the same
fakeredis connection, so ``network.run()`` works with no Redis server and no processes.

They are real rq workers (same dequeue, registries, Retry and job function as a worker
process); only signal handling is left out (signals belong to the main thread) and job
timeouts use rq's timer-based death penalty.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from robot_lab.logging import get_logger
from robot_lab.network.enqueue import queue_name
from robot_lab.network.serializer import JobSerializer

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

log = get_logger("robot_lab.network.embedded")


def _worker_class() -> type:
    from rq.timeouts import TimerDeathPenalty  # lazy: start-up time
    from rq.worker import SimpleWorker  # lazy: start-up time

    from robot_lab.network.job_policy import PolicedWorker  # lazy: start-up time

    class ThreadWorker(PolicedWorker, SimpleWorker):
        """Runs only robot-lab's job (job_policy.py)."""

        death_penalty_class = TimerDeathPenalty

        def _install_signal_handlers(self) -> None:  # signals only work in the main thread
            pass

    return ThreadWorker


class EmbeddedWorkers:
    """``threads`` rq workers listening on ``robot:<name>`` for every name in ``queues``."""

    def __init__(self, connection: RedisClient, queues: list[str], *, threads: int = 4,
                 poll_seconds: float = 0.25) -> None:
        self.connection = connection
        self.queue_names = [queue_name(q) for q in queues]
        self.threads_count = max(1, threads)
        self.poll_seconds = poll_seconds
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[Any] = []

    def start(self) -> EmbeddedWorkers:
        from rq import Queue  # lazy: start-up time

        cls = _worker_class()
        for index in range(self.threads_count):
            queues = [Queue(name, connection=self.connection, serializer=JobSerializer)
                      for name in self.queue_names]
            worker = cls(queues, connection=self.connection, serializer=JobSerializer,
                         name=f"embedded-{id(self):x}-{index}")
            self._workers.append(worker)
            thread = threading.Thread(target=self._loop, args=(worker,), name=f"robot-lab-worker-{index}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _loop(self, worker: Any) -> None:
        from rq import Queue  # lazy: start-up time

        worker.register_birth()
        try:
            while not self.stop_event.is_set():
                try:
                    result = Queue.dequeue_any(
                        worker.queues, self.poll_seconds, connection=self.connection,
                        job_class=worker.job_class, serializer=worker.serializer,
                        death_penalty_class=worker.death_penalty_class,
                    )
                except Exception as exc:  # DequeueTimeout and friends
                    if type(exc).__name__ != "DequeueTimeout":
                        log.warning("embedded.dequeue_failed", error=f"{type(exc).__name__}: {exc}")
                    continue
                if result is None:
                    continue
                job, queue = result
                worker.execute_job(job, queue)
        finally:
            try:
                worker.register_death()
            except Exception:
                pass

    def stop(self, timeout: float = 10.0, *, wait: bool = True) -> None:
        """Stop after the current jobs (each thread notices within ``poll_seconds``).
        ``wait=False`` returns at once: the daemon threads finish on their own."""
        self.stop_event.set()
        if wait:
            for thread in self._threads:
                thread.join(timeout)
        self._threads.clear()

    def __enter__(self) -> EmbeddedWorkers:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
