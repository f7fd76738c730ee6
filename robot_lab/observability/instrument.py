"""The named hooks that bus, runtime, skills and workers put on their methods, one line each.

Each is a decorator from :func:`otel.traced` with the attributes of its span computed from
the call; ``llm_call`` also feeds the Prometheus counters. The span names, from the outside
in: ``network.run`` > ``network.submit`` > (``task`` in a worker) > ``robot.run`` >
``llm.call`` / ``tool.call`` > ``mcp.call`` or ``skill.script``; ``bus.publish`` >
(``bus.handle`` in the receiver). ``robot.run``, ``llm.call`` and ``tool.call`` are the
GenAI conventions' ``invoke_agent``, ``chat`` and ``execute_tool`` spans, with their
``gen_ai.*`` attributes (and names, with the stability opt-in): see :mod:`.genai`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from robot_lab.observability import genai, metrics, otel

F = TypeVar("F", bound=Callable[..., Any])


def _name(obj: Any) -> str | None:
    return getattr(obj, "name", None)


network_run = otel.traced("network.run", lambda net, *a, **k: {"network": _name(net)},
                          result=lambda s, r: s.set(run_id=getattr(r, "run_id", None)))
network_submit = otel.traced(
    "network.submit", lambda coord, net, *a, **k: {"network": _name(net)},
    result=lambda s, handle: s.set(run_id=getattr(handle, "run_id", None)),
)
def _agent_attributes(robot: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"robot": _name(robot), "task": kwargs.get("task"), "run_id": kwargs.get("run_id"),
            genai.OPERATION: genai.INVOKE_AGENT, genai.AGENT_NAME: _name(robot),
            genai.AGENT_DESCRIPTION: getattr(robot, "description", None) or None,
            genai.CONVERSATION_ID: kwargs.get("conversation_id")}


def _agent_result(s: Any, r: Any) -> None:
    tokens_in, tokens_out = getattr(r, "input_tokens", None), getattr(r, "output_tokens", None)
    s.set(input_tokens=tokens_in, output_tokens=tokens_out, cost=getattr(r, "cost", None),
          **{genai.USAGE_INPUT_TOKENS: tokens_in, genai.USAGE_OUTPUT_TOKENS: tokens_out})


robot_run = otel.traced(
    lambda robot, *a, **k: genai.span_name("robot.run", genai.INVOKE_AGENT, _name(robot)),
    _agent_attributes, result=_agent_result,
)


def agent_model(model: str | None, provider: str | None) -> None:
    """The model and provider a robot's run resolved (its plan), on its ``robot.run`` span:
    known only once the run's configuration layers are merged, inside the span."""
    if otel.tracer() is not None:
        otel.set_current(**{genai.REQUEST_MODEL: model, **genai.provider_attributes(model, provider)})


tool_call = otel.traced(
    lambda tool, *a, **k: genai.span_name("tool.call", genai.EXECUTE_TOOL, _name(tool)),
    lambda tool, *a, **k: {"tool": _name(tool), genai.OPERATION: genai.EXECUTE_TOOL, genai.TOOL_NAME: _name(tool),
                           genai.TOOL_DESCRIPTION: getattr(tool, "description", None) or None,
                           genai.TOOL_TYPE: "function"},
)


def tool_failed(exc: BaseException) -> None:
    """A tool raised and its error went back to the model as text: the ``tool.call`` span
    still ends as failed (status ERROR, ``error.type``)."""
    otel.mark_failed(exc)

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
    """The ``llm.call`` span (the conventions' ``chat``) and the LLM counters around one call;
    the caller appends the response to the yielded list. The span's attributes are computed
    only when tracing is on (the counters alone need none of them)."""
    tracing = otel.tracer() is not None
    attributes = {genai.OPERATION: genai.CHAT, genai.REQUEST_MODEL: model,
                  "stream": kwargs.get("on_chunk") is not None,
                  **genai.request_attributes(kwargs.get("params"))} if tracing else None
    with otel.span(genai.span_name("llm.call", genai.CHAT, model) if tracing else "llm.call", attributes,
                   kind="client") as s:
        box: list[Any] = []
        try:
            yield box
        except BaseException as exc:
            metrics.llm_call(model, None, exc)
            if tracing:
                s.set(**genai.provider_attributes(model, kwargs.get("provider")))
            raise
        response = box[0]
        if tracing:
            s.set(cost=response.cost, **genai.provider_attributes(model, kwargs.get("provider")),
                  **genai.response_attributes(response))
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
