"""The context of the turn in progress, for tools: ``current_turn()``.

A tool is a plain function with JSON arguments from the model, so it cannot be handed live
objects as parameters. Instead the robot's turn (one ``robot.run()`` call) publishes a
:class:`TurnContext` in a contextvar while its tool loop runs: ``current_turn().memory`` is
the turn's active Memory (a network run's shared memory, ``task(memory=...)``'s scope,
``run(memory=...)``, else the robot's own), already writing as the robot. It works the same
in-process, on the bus and in a worker running a network task, because every one of those
turns goes through ``Robot.run``. Outside a turn ``current_turn()`` raises a clear error.
``current_run`` is the same function under its first name (docs/architecture.md, Words).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError

if TYPE_CHECKING:
    from robot_lab.runtime.robot.parts import RobotParts


@dataclass(frozen=True)
class TurnContext:
    """What a tool may reach of the run that called it."""

    robot: RobotParts
    memory: Any
    plan: Any
    task: str | None = None
    run_id: str | None = None
    network: Any = None


_current: ContextVar[TurnContext | None] = ContextVar("robot_lab_current_turn", default=None)


def current_turn() -> TurnContext:
    """The turn in progress in this thread (or task); a tool calls this to reach memory."""
    ctx = _current.get()
    if ctx is None:
        raise ConfigurationError("current_turn() is only available inside a robot's turn "
                                 "(a robot.run() call, e.g. from a tool)")
    return ctx


# The first name of current_turn, from before a robot.run() call was called a turn; kept as
# an alias because tools and examples outside this repository call it.
current_run = current_turn


def current_memory() -> Any:
    """Shorthand for ``current_turn().memory``."""
    return current_turn().memory


class turn_scope:  # noqa: N801 - a context manager used as a function; a class: it runs once per turn
    """Publish ``ctx`` for the duration of a run, and make the run's memory write as the
    robot (the Ruby gem's ``current_writer``; per thread, so parallel runs don't mix)."""

    __slots__ = ("ctx", "_token", "_writing")

    def __init__(self, ctx: TurnContext) -> None:
        self.ctx = ctx
        self._token: Any = None
        self._writing: Any = None

    def __enter__(self) -> TurnContext:
        ctx = self.ctx
        self._token = _current.set(ctx)
        writing = getattr(ctx.memory, "writing_as", None)
        if writing is not None:
            try:
                self._writing = writing(ctx.robot.name)
                self._writing.__enter__()
            except BaseException:
                _current.reset(self._token)
                raise
        return ctx

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._writing is not None:
                self._writing.__exit__(*exc)
        finally:
            _current.reset(self._token)


@dataclass
class ConversationState:
    """A stored conversation's history while one run continues it."""

    messages: list[dict[str, Any]]
    skill_scope: str | None = None


# id(robot) -> the conversation a run of that robot continues in this context (thread or
# task). A context variable, not an attribute swap on the robot: concurrent runs of one
# Robot in different conversations (arun() tasks on one loop, a worker's threads) each see
# their own history.
_conversations: ContextVar[dict[int, ConversationState] | None] = ContextVar("robot_lab_conversations",
                                                                             default=None)


def conversation_state(robot: object) -> ConversationState | None:
    """The conversation ``robot`` is running in this context, None outside one."""
    scoped = _conversations.get()
    return None if scoped is None else scoped.get(id(robot))


@contextmanager
def conversation_scope(robot: object, messages: list[dict[str, Any]], skill_scope: str | None) -> Iterator[ConversationState]:
    """Make ``robot.messages`` read and write ``messages`` in this context while the block
    runs (the robot's own default conversation is untouched)."""
    previous = _conversations.get()
    state = ConversationState(messages, skill_scope)
    _conversations.set({**(previous or {}), id(robot): state})
    try:
        yield state
    finally:
        _conversations.set(previous)  # restore, not reset(): see hooks.hook_scope


# Robots whose default conversation this context is already running (a nested arun of the
# same robot, from an async tool, must not wait for its own turn).
_taking_turn: ContextVar[frozenset[int]] = ContextVar("robot_lab_default_turn", default=frozenset())


@asynccontextmanager
async def default_conversation_turn(robot: object) -> AsyncIterator[None]:
    """``arun`` calls on a robot's default conversation (no ``conversation_id``) take turns,
    one per event loop at a time, so concurrent callers never interleave their messages in
    its one history; each sees the turns before it, as sequential ``run`` calls would."""
    if id(robot) in _taking_turn.get():
        yield
        return
    locks = robot.__dict__.setdefault("_turn_locks", weakref.WeakKeyDictionary())
    loop = asyncio.get_running_loop()
    lock = locks.get(loop)
    if lock is None:
        lock = locks[loop] = asyncio.Lock()
    async with lock:
        token = _taking_turn.set(_taking_turn.get() | {id(robot)})
        try:
            yield
        finally:
            _taking_turn.reset(token)
