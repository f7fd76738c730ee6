"""Networks: :mod:`.dsl` (the Network builder users write), :mod:`.dag` (validation and the
compiled graph), :mod:`.run_state` (the run's state in Redis), :mod:`.transitions` (the Lua scripts that
move it forward), :mod:`.enqueue` (runnable tasks onto rq queues), :mod:`.coordinator` (submit, wait, collect), :mod:`.serializer` (the data-only rq job
format) and :mod:`.embedded` (in-process rq workers for the server-less mode)."""

from __future__ import annotations

from robot_lab.runtime.network.dsl import Network, create_network

__all__ = ["Network", "create_network"]
