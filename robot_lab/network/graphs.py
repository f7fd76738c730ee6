"""Compiled graphs of runs, cached per process.

A run's network spec never changes once submitted, so every process compiles it once: the
coordinator to collect results, and each worker before its first task of the run (then a
task's claim reads no spec at all, see :func:`robot_lab.network.task_job.run_task`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import msgspec

from robot_lab.network.dag import Graph, NetworkSpec, compile_network
from robot_lab.network.run_state import RunStore

# The cache keeps compiled graphs of at most this many tasks in all (a 5000-task fan-out's
# graph is ~4 MB and ~20,000 objects that each full collection of the collector walks) and
# at most GRAPH_CACHE_RUNS runs, least recently used out first -- but only a graph unused for
# GRAPH_IDLE seconds: the graphs of runs in progress stay even over the bounds, so runs that
# take turns never evict each other's graph task after task (an evicted graph is compiled
# again from the run record: the spec read with the claim, ~3 us a task). It was 256 runs of
# any size, cleared all at once: a worker that had served 256 large runs held ~1 GB of graphs.
GRAPH_CACHE_TASKS = 20_000
GRAPH_CACHE_RUNS = 256
GRAPH_IDLE = 30.0
_clock = time.monotonic  # (tests move it)

_graph_cache: OrderedDict[str, tuple[Graph, float]] = OrderedDict()  # run key -> (graph, last used)
_graph_tasks = 0  # the tasks of every cached graph
_graph_lock = threading.Lock()
_compiling: dict[str, threading.Lock] = {}  # run key -> held by the thread compiling its graph


def _lookup(key: str) -> Graph | None:
    """The cached graph of ``key``, now the most recently used (call under ``_graph_lock``)."""
    entry = _graph_cache.get(key)
    if entry is None:
        return None
    _graph_cache[key] = (entry[0], _clock())
    _graph_cache.move_to_end(key)
    return entry[0]


def _remember(key: str, graph: Graph) -> None:
    """Cache ``graph``; then, while over a bound, evict the least recently used graph if it
    has been idle for ``GRAPH_IDLE`` (call under ``_graph_lock``)."""
    global _graph_tasks
    if key in _graph_cache:
        return
    now = _clock()
    _graph_cache[key] = (graph, now)
    _graph_tasks += len(graph.tasks)
    while _graph_tasks > GRAPH_CACHE_TASKS or len(_graph_cache) > GRAPH_CACHE_RUNS:
        oldest, (evicted, used) = next(iter(_graph_cache.items()))
        if oldest == key or now - used < GRAPH_IDLE:
            break
        del _graph_cache[oldest]
        _graph_tasks -= len(evicted.tasks)


def cached_graph(store: RunStore) -> Graph | None:
    """The run's compiled graph if this process has it already (no Redis call)."""
    with _graph_lock:
        return _lookup(f"{store.keys.prefix}:{store.run_id}")


def graph_for(store: RunStore, spec_json: str | None = None) -> Graph:
    """The compiled graph of a run (cached per process: a run's spec never changes);
    ``spec_json`` is the run record's ``spec`` when the caller has read it already."""
    key = f"{store.keys.prefix}:{store.run_id}"
    with _graph_lock:
        graph = _lookup(key)
        if graph is not None:
            return graph
        compiling = _compiling.setdefault(key, threading.Lock())
    with compiling:  # the first tasks of a run arrive at once: one compiles, the rest wait for it
        with _graph_lock:
            graph = _lookup(key)
        if graph is None:
            graph = compile_network(load_network_spec(spec_json) if spec_json is not None else store.spec())
            with _graph_lock:
                _remember(key, graph)
                _compiling.pop(key, None)
    return graph


def load_network_spec(raw: str | bytes) -> NetworkSpec:
    return msgspec.json.decode(raw, type=NetworkSpec)


__all__ = ["cached_graph", "graph_for", "load_network_spec"]
