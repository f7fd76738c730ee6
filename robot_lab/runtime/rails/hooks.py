"""Hooks: the Ruby gem's seven families with before / around / after (+ on_error for run,
network_run and task), registered globally, per network, per robot and per run.

A handler is a class whose hook methods are classmethods (``def before_run(cls, ctx)``);
``around_*`` take ``(cls, ctx, call_next)`` and return the result. Handlers may be given as
import paths (``"pkg.mod:Tracer"``), which is how specs carry them to workers: each family
fires in the process where its work happens (network_run in the coordinator, task / run /
llm_generation / tool_call in the worker).

Dispatch order is global -> network -> robot -> per-run; the first registered ``around`` is
the outermost. Errors set ``ctx.error``, fire ``on_error`` and re-raise: hooks never
swallow an exception.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from robot_lab.errors import ConfigurationError

if TYPE_CHECKING:
    from robot_lab.runtime.robot.named import NamedRobot

FAMILIES = ("run", "llm_generation", "tool_call", "network_run", "task", "compaction", "learn")
ON_ERROR_FAMILIES = frozenset({"run", "network_run", "task"})
POINT_HOOKS = ("on_compaction", "on_learn")
RESULT_FIELD = {"run": "response", "network_run": "result", "task": "result", "llm_generation": "generation_response"}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Hook:
    """Base class of hook handlers. ``namespace`` defaults to the snake_case class name
    and is not inherited; the base class itself cannot be registered."""

    namespace: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "namespace" not in cls.__dict__:
            cls.namespace = _snake(cls.__name__)

    @classmethod
    def implements(cls, event: str) -> bool:
        return not event.startswith("_") and callable(getattr(cls, event, None))


class DotState(dict):  # type: ignore[type-arg]
    """Schemaless per-namespace state; unset attributes read as None (as robot_lab)."""

    def __getattr__(self, key: str) -> Any:
        return self.get(key)

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def merge_defaults(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self.setdefault(key, value)


@dataclass
class HookContext:
    event: str = ""
    metadata: dict[str, DotState] = field(default_factory=dict)
    _namespace: str | None = None
    error: BaseException | None = None

    def ext(self, name: str) -> DotState:
        return self.metadata.setdefault(name, DotState())

    @property
    def local(self) -> DotState:
        if self._namespace is None:
            raise ConfigurationError("No hook namespace active")
        return self.ext(self._namespace)

    @contextmanager
    def with_namespace(self, namespace: str | None) -> Iterator[None]:
        previous, self._namespace = self._namespace, namespace
        try:
            yield
        finally:
            self._namespace = previous

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "metadata"}


@dataclass
class RunHookContext(HookContext):
    robot: NamedRobot | None = None
    network: Any = None
    task: Any = None
    memory: Any = None
    config: Any = None
    request: Any = None
    response: Any = None
    run_id: str | None = None


@dataclass
class LlmGenerationHookContext(RunHookContext):
    iteration: int = 0
    generation_response: Any = None


@dataclass
class ToolCallHookContext(HookContext):
    tool: Any = None
    tool_name: str = ""
    tool_args: dict[str, Any] = field(default_factory=dict)
    robot: NamedRobot | None = None
    tool_result: Any = None
    tool_error: BaseException | None = None


@dataclass
class NetworkRunHookContext(HookContext):
    network: Any = None
    memory: Any = None
    config: Any = None
    context: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    run_id: str | None = None


@dataclass
class TaskHookContext(HookContext):
    network: Any = None
    task: Any = None
    task_name: str = ""
    robot: NamedRobot | None = None
    memory: Any = None
    config: Any = None
    result: Any = None
    run_id: str | None = None


@dataclass
class LearnHookContext(HookContext):
    robot: NamedRobot | None = None
    text: str = ""
    learnings_before: tuple[str, ...] = ()
    stored: bool = False


@dataclass
class CompactionHookContext(HookContext):
    robot: NamedRobot | None = None
    messages_before: tuple[Any, ...] = ()
    config: Any = None
    strategy: str = "context_window"
    compacted_messages: list[Any] | None = None

    @property
    def handled(self) -> bool:
        return self.compacted_messages is not None


@dataclass(frozen=True)
class Registration:
    handler: type[Hook]
    context: dict[str, Any] = field(default_factory=dict)


def resolve_handler(handler: Any) -> type[Hook]:
    if isinstance(handler, str):
        from robot_lab.runtime.tools import import_object  # lazy: start-up time

        handler = import_object(handler)
    if not (isinstance(handler, type) and issubclass(handler, Hook)):
        raise ConfigurationError(f"hook handler must be a robot_lab Hook subclass or its import path, got {handler!r}")
    if not handler.namespace:
        raise ConfigurationError(f"hook handler {handler.__name__} has no namespace (the base Hook cannot be registered)")
    return handler


class HookRegistry:
    def __init__(self, handlers: Iterable[Any] = ()) -> None:
        self._registrations: list[Registration] = []
        for handler in handlers:
            self.on(handler)

    def on(self, handler: Any, context: dict[str, Any] | None = None) -> HookRegistry:
        self._registrations.append(Registration(resolve_handler(handler), dict(context or {})))
        return self

    @property
    def registrations(self) -> list[Registration]:
        return list(self._registrations)

    def registrations_for(self, event: str) -> list[Registration]:
        return [r for r in self._registrations if r.handler.implements(event)]

    def import_paths(self) -> list[str]:
        return [f"{r.handler.__module__}:{r.handler.__qualname__}" for r in self._registrations]

    def clear(self) -> None:
        self._registrations.clear()

    def __len__(self) -> int:
        return len(self._registrations)


_global = HookRegistry()
# Registries of the enclosing network / robot / run, so that tool calls deep inside a run
# fire network and per-run hooks too (the Ruby gem's thread-local hook scope, as a contextvar).
_scope: ContextVar[tuple[HookRegistry, ...]] = ContextVar("robot_lab_hook_scope", default=())


def global_hooks() -> HookRegistry:
    return _global


def on(handler: Any, context: dict[str, Any] | None = None) -> HookRegistry:
    """Register a global hook (the Ruby gem's ``RobotLab.on``)."""
    return _global.on(handler, context)


def clear_hooks() -> None:
    _global.clear()


def current_scope() -> tuple[HookRegistry, ...]:
    return _scope.get() or (_global,)


class hook_scope:  # noqa: N801 - a context manager used as a function; a class: several per run
    """``with hook_scope(*registries)``: the hooks in effect inside the block (the global
    registry, then ``registries``)."""

    __slots__ = ("scope", "_previous")

    def __init__(self, *registries: HookRegistry | None) -> None:
        self.scope = (_global, *(r for r in registries if r is not None and r is not _global))
        self._previous: tuple[HookRegistry, ...] | None = None

    def __enter__(self) -> tuple[HookRegistry, ...]:
        # Restore the previous value rather than ``reset(token)``: a scope held open by a
        # suspended generator (a streamed run) may close after an enclosing one, and reset()
        # of a token whose old value was "unset" then raises LookupError inside the run.
        self._previous = _scope.get()
        _scope.set(self.scope)
        return self.scope

    def __exit__(self, *exc: Any) -> None:
        _scope.set(self._previous)


def _call(registration: Registration, event: str, ctx: HookContext, *args: Any) -> Any:
    handler = registration.handler
    with ctx.with_namespace(handler.namespace):
        if registration.context:
            ctx.ext(handler.namespace or "").merge_defaults(registration.context)
        return getattr(handler, event)(ctx, *args)


def _registrations(family: str, registries: Sequence[HookRegistry] | None) -> list[Registration]:
    if family not in FAMILIES:
        raise ConfigurationError(f"unknown hook family {family!r}; known: {', '.join(FAMILIES)}")
    scope = tuple(registries) if registries is not None else current_scope()
    return [r for registry in scope for r in registry.registrations]


def _before(family: str, ctx: HookContext, regs: list[Registration]) -> None:
    ctx.event = family
    for r in regs:
        if r.handler.implements(f"before_{family}"):
            _call(r, f"before_{family}", ctx)


def _around_chain(family: str, ctx: HookContext, regs: list[Registration], core: Callable[[], Any]) -> Callable[[], Any]:
    """``core`` wrapped in the ``around_*`` handlers, the first registered outermost."""
    chain = core
    for r in reversed([r for r in regs if r.handler.implements(f"around_{family}")]):
        chain = (lambda reg, inner: (lambda: _call(reg, f"around_{family}", ctx, inner)))(r, chain)
    return chain


def _after(family: str, ctx: HookContext, regs: list[Registration], result: Any) -> Any:
    if family == "tool_call" and result is None and isinstance(ctx, ToolCallHookContext):
        result = ctx.tool_result  # an around hook that short-circuits sets tool_result
    if family in RESULT_FIELD:
        setattr(ctx, RESULT_FIELD[family], result)
    elif isinstance(ctx, ToolCallHookContext):
        ctx.tool_result = result
    for r in regs:
        if r.handler.implements(f"after_{family}"):
            _call(r, f"after_{family}", ctx)
    return result


def _failed(family: str, ctx: HookContext, regs: list[Registration], exc: BaseException) -> None:
    ctx.error = exc
    if family in ON_ERROR_FAMILIES:
        for r in regs:
            if r.handler.implements("on_error"):
                _call(r, "on_error", ctx)


def run_hooks(
    family: str,
    ctx: HookContext,
    core: Callable[[], Any],
    registries: Sequence[HookRegistry] | None = None,
) -> Any:
    """Run ``core`` wrapped in the family's hooks (the Ruby gem's ``Hooks.run``)."""
    regs = _registrations(family, registries)
    if not regs:
        return core()
    try:
        _before(family, ctx, regs)
        return _after(family, ctx, regs, _around_chain(family, ctx, regs, core)())
    except BaseException as exc:
        _failed(family, ctx, regs, exc)
        raise


async def arun_hooks(
    family: str,
    ctx: HookContext,
    core: Callable[[], Awaitable[Any]],
    registries: Sequence[HookRegistry] | None = None,
) -> Any:
    """:func:`run_hooks` for an async ``core``. Handlers stay plain (sync) classmethods:
    ``before_*``/``after_*``/``on_error`` run on the event loop; when ``around_*`` handlers
    exist, their chain runs in a worker thread and the innermost ``call_next()`` hands
    ``core`` back to the loop and blocks only that thread until it is done."""
    regs = _registrations(family, registries)
    if not regs:
        return await core()
    try:
        _before(family, ctx, regs)
        if any(r.handler.implements(f"around_{family}") for r in regs):
            loop = asyncio.get_running_loop()

            def blocking_core() -> Any:
                return asyncio.run_coroutine_threadsafe(core(), loop).result()  # type: ignore[arg-type]

            result = await asyncio.to_thread(_around_chain(family, ctx, regs, blocking_core))
        else:
            result = await core()
        return _after(family, ctx, regs, result)
    except BaseException as exc:
        _failed(family, ctx, regs, exc)
        raise


def call_point_hook(name: str, ctx: HookContext, registries: Sequence[HookRegistry] | None = None) -> None:
    """Fire a point hook (``on_compaction``, ``on_learn``) inside a family's core."""
    scope = tuple(registries) if registries is not None else current_scope()
    for registry in scope:
        for r in registry.registrations_for(name):
            _call(r, name, ctx)


class Narrator(Hook):
    """Prints what robots are doing, one short line each (CLI progress). Never raises."""

    namespace = "narrator"
    MAX: ClassVar[int] = 80
    output: ClassVar[TextIO | None] = None

    @classmethod
    def enable(cls, output: TextIO | None = None) -> None:
        cls.output = output
        if not any(r.handler is cls for r in _global.registrations):
            _global.on(cls)

    @classmethod
    def _say(cls, text: str) -> None:
        try:
            stream = cls.output or sys.stderr
            stream.write((text if len(text) <= cls.MAX else text[: cls.MAX - 1] + "…") + "\n")
            stream.flush()
        except Exception:  # narration must never break a run
            pass

    @classmethod
    def before_llm_generation(cls, ctx: LlmGenerationHookContext) -> None:
        name = getattr(ctx.robot, "name", "robot")
        cls._say(f"  · {name}: thinking…")

    @classmethod
    def before_tool_call(cls, ctx: ToolCallHookContext) -> None:
        args = " ".join(f'{k}="{v}"' for k, v in (ctx.tool_args or {}).items())
        cls._say(f"  · → {ctx.tool_name} {args}".rstrip())

    @classmethod
    def after_tool_call(cls, ctx: ToolCallHookContext) -> None:
        if ctx.tool_error is not None:
            cls._say(f"  · ✗ {ctx.tool_error}")
