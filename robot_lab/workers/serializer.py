"""The rq job serializer under the path operators pass to ``rq worker -S``.

The implementation lives beside the run state that writes jobs
(:mod:`robot_lab.network.serializer`); this module keeps the worker-side name stable.
"""

from __future__ import annotations

from robot_lab.network.serializer import JobSerializer

__all__ = ["JobSerializer"]
