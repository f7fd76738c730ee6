"""Durable scopes: which runs keep a step journal, and the step a tool is running in.

The owner of a durable run -- the network task job, the bus serve path, ``run(durable_id=)``
-- opens a :class:`DurableScope` around ``robot.run()`` with :func:`durable_scope`. The tool
loop of that run *takes* it (:func:`take_scope`): a robot run nested inside one of its tools
(an in-process delegation, say) does not share the journal, it runs live. While a tool
runs, :func:`current_step` tells it its step, whose ``idempotency_key`` is the same on every
attempt of the scope, so a tool can deduplicate against the outside world.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.durable.journal import Journal
from robot_lab.inputs import InputStore
from robot_lab.keys import default_keys
from robot_lab.settings import get_settings

Emit = Callable[[str, dict[str, Any]], None]


@dataclass
class DurableScope:
    """One durable scope. ``journal`` holds its steps; ``inputs`` records input requests
    (None: this scope cannot park, a request is an error); ``owner`` is recorded with each
    request so an answer knows what to resume; ``emit`` sends run events (``step.*``,
    ``hitl.*``); ``interactive`` lets a terminal prompt answer (in-process runs only)."""

    id: str
    journal: Journal
    inputs: InputStore | None = None
    owner: dict[str, Any] = field(default_factory=dict)
    emit: Emit | None = None
    interactive: bool = False
    ttl: int = 7 * 86_400


@dataclass
class Asks:
    """The input requests one tool step made, in order (an approval, then a question inside
    the tool, then one of a robot run nested in it...), and how many this attempt used."""

    ids: list[str] = field(default_factory=list)
    used: int = 0

    def next_recorded(self) -> str | None:
        """The id of the next request this step made on an earlier attempt, if any."""
        return self.ids[self.used] if self.used < len(self.ids) else None


@dataclass(frozen=True)
class StepInfo:
    """The step a tool runs in: ``index`` in the scope, ``kind`` (model | tool), ``name``,
    ``idempotency_key`` (``<scope>:<index>``, stable across attempts; None outside a durable
    scope) and ``asks``, the input requests it made before it parked (shared with the steps
    of a robot run nested in it)."""

    index: int
    kind: str
    name: str
    idempotency_key: str | None
    scope: str | None = None
    asks: Asks = field(default_factory=Asks)

    @property
    def request_id(self) -> str | None:
        """The latest input request of this step, if any."""
        return self.asks.ids[-1] if self.asks.ids else None


_pending: ContextVar[DurableScope | None] = ContextVar("robot_lab_durable_scope", default=None)
_on_input: ContextVar[Callable[..., Any] | None] = ContextVar("robot_lab_on_input", default=None)
_step: ContextVar[StepInfo | None] = ContextVar("robot_lab_durable_step", default=None)
_runner: ContextVar[Any] = ContextVar("robot_lab_step_runner", default=None)


class _Setting:
    """``with``: ``var`` holds ``value`` inside the block (a class, not a generator: every
    robot run enters two of these)."""

    __slots__ = ("var", "value", "result", "_token")

    def __init__(self, var: ContextVar[Any], value: Any, result: Any) -> None:
        self.var, self.value, self.result, self._token = var, value, result, None

    def __enter__(self) -> Any:
        self._token = self.var.set(self.value)
        return self.result

    def __exit__(self, *exc: Any) -> None:
        self.var.reset(self._token)


_NOTHING: AbstractContextManager[None] = nullcontext()  # reusable: it keeps no state


def durable_scope(scope: DurableScope | None) -> AbstractContextManager[DurableScope | None]:
    """Make ``scope`` the durable scope of the next robot run in this context."""
    return _Setting(_pending, scope, scope)


def input_handler(on_input: Callable[..., Any] | None) -> AbstractContextManager[None]:
    """Answer input requests of runs in this context with ``on_input(request) -> answer``."""
    return _NOTHING if on_input is None else _Setting(_on_input, on_input, None)


def current_scope() -> DurableScope | None:
    """The pending scope, not taken."""
    return _pending.get()


def take_scope() -> DurableScope | None:
    """The pending scope, taken: runs nested in this one's tools do not see it."""
    scope = _pending.get()
    if scope is not None:
        _pending.set(None)
    return scope


def on_input_handler() -> Callable[..., Any] | None:
    return _on_input.get()


def current_runner() -> Any:
    """The step runner of the tool loop in progress in this context (None outside one)."""
    return _runner.get()


def current_step() -> StepInfo:
    """The step the calling tool runs in (``current_step().idempotency_key``)."""
    step = _step.get()
    if step is None:
        raise ConfigurationError("current_step() is only available inside a robot's tool call")
    return step


SERVED_PREFIX = "bus:"  # durable ids of served bus messages: bus:<robot>:<from>:<id> (bus/poller.py)


def local_scope(durable_id: str, preloaded: Any = None) -> DurableScope:
    """The scope of a ``run(durable_id=...)``: journal and requests on the configured Redis
    (embedded fakeredis without ``REDIS_URL``), 7 days. Ids starting ``bus:`` are served bus
    messages, whose requests are answered by ``answer`` envelopes (bus/parking.py).
    ``preloaded``: the journal's hash, read by the caller with other reads (Journal)."""
    from robot_lab.connection import get_redis  # lazy: start-up time

    redis, keys = get_redis(), default_keys()
    ttl = 7 * 86_400
    journal = Journal(redis, keys.durable_steps(durable_id), ttl, scope=f"durable:{durable_id}",
                      on_divergence=get_settings().durable.on_divergence, preloaded=preloaded)
    served = durable_id.startswith(SERVED_PREFIX)  # a served bus message: never a terminal prompt
    owner = ({"kind": "message", "robot": durable_id.split(":")[1], "durable_id": durable_id} if served
             else {"kind": "local", "durable_id": durable_id})
    return DurableScope(id=f"durable:{durable_id}", journal=journal, inputs=InputStore(redis, keys),
                        owner=owner, interactive=not served, ttl=ttl)
