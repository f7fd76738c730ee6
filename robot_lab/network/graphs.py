"""Compiled graphs of runs, cached per process.

A run's network spec never changes once submitted, so every process compiles it once: the
coordinator to collect results, and each worker before its first task of the run (then a
task's claim reads no spec at all, see :func:`robot_lab.network.task_job.run_task`).
"""

from __future__ import annotations

import threading

import msgspec

from robot_lab.network.dag import Graph, NetworkSpec, compile_network
from robot_lab.network.run_state import RunStore

_graph_cache: dict[str, Graph] = {}
_graph_lock = threading.Lock()
_compiling: dict[str, threading.Lock] = {}  # run key -> held by the thread compiling its graph


def cached_graph(store: RunStore) -> Graph | None:
    """The run's compiled graph if this process has it already (no Redis call)."""
    with _graph_lock:
        return _graph_cache.get(f"{store.keys.prefix}:{store.run_id}")


def graph_for(store: RunStore, spec_json: str | None = None) -> Graph:
    """The compiled graph of a run (cached per process: a run's spec never changes);
    ``spec_json`` is the run record's ``spec`` when the caller has read it already."""
    key = f"{store.keys.prefix}:{store.run_id}"
    with _graph_lock:
        graph = _graph_cache.get(key)
        if graph is not None:
            return graph
        compiling = _compiling.setdefault(key, threading.Lock())
    with compiling:  # the first tasks of a run arrive at once: one compiles, the rest wait for it
        with _graph_lock:
            graph = _graph_cache.get(key)
        if graph is None:
            graph = compile_network(load_network_spec(spec_json) if spec_json is not None else store.spec())
            with _graph_lock:
                if len(_graph_cache) > 256:
                    _graph_cache.clear()
                _graph_cache[key] = graph
                _compiling.pop(key, None)
    return graph


def load_network_spec(raw: str | bytes) -> NetworkSpec:
    return msgspec.json.decode(raw, type=NetworkSpec)


__all__ = ["cached_graph", "graph_for", "load_network_spec"]
