"""W3C trace context (``traceparent``) carried by every envelope and every task job.

A process that handles a message or a task continues the sender's trace: the trace id stays,
the span id is new, and both are bound to the log context (``log_context``), so the log lines of one
request can be joined across processes. When OpenTelemetry is configured
(``robot_lab/observability/otel.py``) the same header carries real spans: ``continue_trace``
opens a span whose remote parent is the sender's, and ``outgoing_traceparent`` names the
current span, so the spans of all processes form one trace.
Format: ``00-<32 hex trace id>-<16 hex span id>-01``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from robot_lab.logging import log_context
from robot_lab.observability import otel
from robot_lab.randomness import random_bytes

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_current: ContextVar[str | None] = ContextVar("robot_lab_traceparent", default=None)


def _hex(nbytes: int) -> str:
    value = random_bytes(nbytes).hex()  # buffered: see robot_lab/randomness.py
    return value if value.strip("0") else _hex(nbytes)  # all-zero ids are invalid


def new_traceparent() -> str:
    return f"00-{_hex(16)}-{_hex(8)}-01"


def parse(traceparent: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags), or None when absent or malformed."""
    match = _TRACEPARENT.match((traceparent or "").strip().lower())
    return match.groups() if match else None  # type: ignore[return-value]


def child_of(traceparent: str | None) -> str:
    """A new span in the same trace (a new trace when the parent is missing or malformed)."""
    parsed = parse(traceparent)
    if parsed is None:
        return new_traceparent()
    trace_id, _, flags = parsed
    return f"00-{trace_id}-{_hex(8)}-{flags}"


def current_traceparent() -> str | None:
    return otel.current_traceparent() or _current.get()


def outgoing_traceparent() -> str:
    """What to put on a message or job sent now: the current OpenTelemetry span when tracing
    is on, else a child of the current span, else a new trace."""
    return otel.current_traceparent() or child_of(_current.get())


@contextmanager
def continue_trace(traceparent: str | None, span: str = "robot_lab.handle", *, kind: str = "consumer",
                   flush: bool = False, **attributes: Any) -> Iterator[str]:
    """Handle work under the sender's trace (a child span), bound in the log context.

    With OpenTelemetry on, this is a real span ``span`` (with ``attributes``) whose remote
    parent is ``traceparent``; ``flush`` exports it when it ends (forked worker children).
    """
    if otel.tracer() is None:
        with _bound(child_of(traceparent)) as current:
            yield current
        return
    with otel.remote_span(span, traceparent, attributes, kind=kind, flush_after=flush) as own, \
            _bound(own or child_of(traceparent)) as current:
        yield current


@contextmanager
def _bound(traceparent: str) -> Iterator[str]:
    token = _current.set(traceparent)
    try:
        with log_context(trace_id=traceparent.split("-")[1], traceparent=traceparent):
            yield traceparent
    finally:
        _current.reset(token)
