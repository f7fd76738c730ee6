"""``Robot.astream``: a run's streamed text as an async iterator.

The sync API streams through the ``on_content`` callback; the async one turns that same
callback into an iterator: the run is a task on the caller's event loop whose ``on_content``
puts each :class:`~robot_lab.llm.gateway.Chunk` on a queue that ``async for``
drains. Chunks come from the model stream on the loop itself, so the queue needs no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from robot_lab.llm.gateway import Chunk
from robot_lab.schemas.messages import RobotResult

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RunnableRobot

_DONE = object()


class TurnStream:
    """``async for chunk in robot.astream(...)``, then ``await stream.result()``.

    The run starts at the first ``async for`` step (or at ``result()``); its stored
    ``on_content`` callbacks and one passed to ``astream`` still fire. A failed run raises
    from the iteration (after the chunks that came before the failure). To stop a run
    early, leave an ``async with robot.astream(...) as stream:`` block (or call
    :meth:`aclose`): that cancels it at once (a bare ``break`` cancels it only when the
    iterator is collected).
    """

    def __init__(self, robot: RunnableRobot, message: str | None, kwargs: dict[str, Any]) -> None:
        self._robot = robot
        self._message = message
        self._kwargs = kwargs
        self._queue: asyncio.Queue[Any] | None = None
        self._task: asyncio.Task[RobotResult] | None = None

    def _start(self) -> asyncio.Task[RobotResult]:
        if self._task is None:
            queue: asyncio.Queue[Any] = asyncio.Queue()
            user_callback = self._kwargs.pop("on_content", None)

            def on_content(chunk: Chunk) -> None:
                queue.put_nowait(chunk)
                if user_callback is not None:
                    user_callback(chunk)

            async def runner() -> RobotResult:
                try:
                    return await self._robot.arun(self._message, on_content=on_content, **self._kwargs)
                finally:
                    queue.put_nowait(_DONE)

            self._queue = queue
            self._task = asyncio.ensure_future(runner())
        return self._task

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        task = self._start()
        assert self._queue is not None
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    break
                yield item
            await task  # raises the run's exception, if any
        finally:
            if not task.done():
                task.cancel()

    async def aclose(self) -> None:
        """Cancel the run if it is still going (what leaving ``async with`` does)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> TurnStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def result(self) -> RobotResult:
        """The run's RobotResult (waits for the run; chunks not yet iterated are dropped)."""
        return await self._start()
