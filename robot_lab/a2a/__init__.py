"""robot-lab over the Agent2Agent protocol (``a2a-sdk``): every robot and network of an app
served as an A2A agent by ``robot-lab a2a`` (docs/a2a.md).

The tier is stateless: an A2A task is a bus message to a robot's workers or a network run,
and everything an A2A process knows about a task it reads from Redis (``store.py``), so any
number of them serve the same tasks behind one Redis. Importing this package needs the
``[a2a]`` extra only for the server parts (``server.py``).
"""

from __future__ import annotations

__all__ = ["build_a2a_app", "AgentEntry"]


def __getattr__(name: str):  # lazy: the SDK and Starlette load only when the server is built
    if name in __all__:
        from robot_lab.a2a import asgi as server  # lazy: start-up time

        return getattr(server, name)
    raise AttributeError(name)
