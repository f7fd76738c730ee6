"""The named hooks that bus, runtime, skills and workers put on their methods, one line each.

Each is a decorator from :func:`otel.traced` with the attributes of its span computed from
the call; ``llm_call`` also feeds the Prometheus counters. The span names, from the outside
in: ``network.run`` > ``network.submit`` > (``task`` in a worker) > ``robot.run`` >
``llm.call`` / ``tool.call`` > ``mcp.call`` or ``skill.script``; ``bus.publish`` >
(``bus.handle`` in the receiver).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from robot_lab.observability import metrics, otel

F = TypeVar("F", bound=Callable[..., Any])


def _name(obj: Any) -> str | None:
    return getattr(obj, "name", None)


network_run = otel.traced("network.run", lambda net, *a, **k: {"network": _name(net)},
                          result=lambda s, r: s.set(run_id=getattr(r, "run_id", None)))
network_submit = otel.traced(
    "network.submit", lambda coord, net, *a, **k: {"network": _name(net)},
    result=lambda s, handle: s.set(run_id=getattr(handle, "run_id", None)),
)
robot_run = otel.traced(
    "robot.run", lambda robot, *a, **k: {"robot": _name(robot), "task": k.get("task"), "run_id": k.get("run_id")},
    result=lambda s, r: s.set(input_tokens=getattr(r, "input_tokens", None),
                              output_tokens=getattr(r, "output_tokens", None), cost=getattr(r, "cost", None)),
)
tool_call = otel.traced("tool.call", lambda tool, *a, **k: {"tool": _name(tool)})
mcp_call = otel.traced("mcp.call", lambda client, tool, *a, **k: {"mcp.server": _name(client), "tool": tool},
                       kind="client")
skill_script = otel.traced("skill.script", lambda script, *a, **k: {"tool": _name(script),
                                                                    "skill": getattr(script, "skill_name", None)})
bus_publish = otel.traced("bus.publish", lambda bus, to, *a, **k: {"robot": to, "kind": k.get("kind")},
                          kind="producer")


def _observing() -> bool:
    return otel.tracer() is not None or metrics.enabled()


@contextmanager
def _llm_observed(model: str, kwargs: dict[str, Any]) -> Iterator[list[Any]]:
    """The ``llm.call`` span and the LLM counters around one call; the caller appends the
    response to the yielded list."""
    with otel.span("llm.call", {"gen_ai.request.model": model, "stream": kwargs.get("on_chunk") is not None},
                   kind="client") as s:
        box: list[Any] = []
        try:
            yield box
        except BaseException as exc:
            metrics.llm_call(model, None, exc)
            raise
        response = box[0]
        s.set(**{"gen_ai.usage.input_tokens": response.input_tokens,
                 "gen_ai.usage.output_tokens": response.output_tokens, "cost": response.cost})
        metrics.llm_call(model, response)


def llm_call(fn: F) -> F:
    """Around ``LLMGateway.complete(model, messages, ...)``: an ``llm.call`` span with model,
    tokens and cost, and the LLM counters (calls, tokens, cost per robot and model)."""

    @functools.wraps(fn)
    def wrapper(gateway: Any, model: str, *args: Any, **kwargs: Any) -> Any:
        if not _observing():
            return fn(gateway, model, *args, **kwargs)
        with _llm_observed(model, kwargs) as box:
            box.append(fn(gateway, model, *args, **kwargs))
        return box[0]

    return wrapper  # type: ignore[return-value]


def allm_call(fn: F) -> F:
    """:func:`llm_call` for ``LLMGateway.acomplete``: the same span and counters."""

    @functools.wraps(fn)
    async def wrapper(gateway: Any, model: str, *args: Any, **kwargs: Any) -> Any:
        if not _observing():
            return await fn(gateway, model, *args, **kwargs)
        with _llm_observed(model, kwargs) as box:
            box.append(await fn(gateway, model, *args, **kwargs))
        return box[0]

    return wrapper  # type: ignore[return-value]
