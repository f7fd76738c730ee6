"""One run core, two drivers: how ``Robot.run`` and ``Robot.arun`` share the tool loop.

The run (:mod:`.turn`) and its tool loop (:mod:`.loop`) are written once, as coroutines.
Everything in them that waits goes through an ``io`` object:

* :data:`SYNC` (``Robot.run``): every operation is the plain blocking call, so the
  coroutine never suspends; :func:`run_sync` steps it to its result with no event loop at
  all. ``run()`` therefore behaves (and costs) as it always did, works in any thread, and
  inside a running event loop it blocks that loop like any other sync call.
* :data:`ASYNC` (``Robot.arun``): the model call is awaited (litellm's ``acompletion``), an
  async tool (``Tool.is_async``: an ``async def`` function or ``execute``) is awaited, a sync tool and
  the remaining blocking steps (Redis reads and writes of conversations, budgets and
  learnings, skill matching, MCP connection) run in ``asyncio.to_thread``, and hooks go
  through :func:`~robot_lab.runtime.rails.hooks.arun_hooks`. A step that has nothing to
  wait on in this run (no MCP servers, no skills or workspace, learnings already read or no
  store, compaction off) runs in place (:meth:`AsyncIO.maybe_blocking`, each step's own
  ``*_may_block`` predicate beside its code).

This is the seam that keeps "the sync API over the same core" true without a second copy of
the loop, and without paying for an event loop per sync run (the per-task hot path of
bench/dag.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from robot_lab.runtime.rails.hooks import arun_hooks, run_hooks

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RunnableRobot

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (one driven by :data:`SYNC`)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("internal error: a synchronous robot run awaited an asynchronous operation")


class SyncIO:
    """Blocking operations, called in place (``Robot.run``)."""

    is_async = False

    async def complete(self, gateway: Any, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        return gateway.complete(model, messages, **kwargs)

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return fn(*args, **kwargs)

    async def maybe_blocking(self, may_block: Callable[..., bool], fn: Callable[..., T], *args: Any,
                             **kwargs: Any) -> T:
        return fn(*args, **kwargs)  # (the predicate is the async driver's: not even asked here)

    async def call_tool(self, tool: Any, arguments: dict[str, Any]) -> str:
        return tool.call(arguments)  # type: ignore[no-any-return]

    async def hooks(self, family: str, ctx: Any, core: Callable[[], Awaitable[T]]) -> T:
        return run_hooks(family, ctx, lambda: run_sync(core()))  # type: ignore[arg-type, no-any-return]

    async def either(self, sync_fn: Callable[..., T], async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """An operation with both forms (``store.load`` / ``store.aload``): the sync one."""
        return sync_fn(*args)

    async def run(self, robot: RunnableRobot, message: str | None, **kwargs: Any) -> Any:
        return robot.run(message, **kwargs)


class AsyncIO:
    """The same operations without blocking the event loop (``Robot.arun``)."""

    is_async = True

    async def complete(self, gateway: Any, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        acomplete = getattr(gateway, "acomplete", None)
        if acomplete is None:  # a custom gateway with a sync complete() only
            return await asyncio.to_thread(gateway.complete, model, messages, **kwargs)
        return await acomplete(model, messages, **kwargs)

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def maybe_blocking(self, may_block: Callable[..., bool], fn: Callable[..., T], *args: Any,
                             **kwargs: Any) -> T:
        """``fn`` in a thread when ``may_block(*args, **kwargs)`` (the step's own predicate,
        called with the step's arguments, says it may wait on Redis, disk or a server), else
        in place: a hop to a thread costs ~60 us of CPU (executor, future, two loop wake-ups),
        several times what a step with nothing to do costs, and five of them made ``arun``
        cost twice a thread's run (bench/robot_floor.py)."""
        if may_block(*args, **kwargs):
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def call_tool(self, tool: Any, arguments: dict[str, Any]) -> str:
        if getattr(tool, "is_async", False):
            return await tool.acall(arguments)  # type: ignore[no-any-return]
        return await asyncio.to_thread(tool.call, arguments)

    async def hooks(self, family: str, ctx: Any, core: Callable[[], Awaitable[T]]) -> T:
        return await arun_hooks(family, ctx, core)  # type: ignore[no-any-return]

    async def either(self, sync_fn: Callable[..., T], async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """An operation with both forms: the awaited one (redis-py's asyncio client)."""
        return await async_fn(*args)

    async def run(self, robot: RunnableRobot, message: str | None, **kwargs: Any) -> Any:
        return await robot.arun(message, **kwargs)


SYNC = SyncIO()
ASYNC = AsyncIO()
IO = SyncIO | AsyncIO
