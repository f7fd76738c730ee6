"""OpenTelemetry spans for robot-lab, a no-op unless tracing is configured.

Tracing is *on* in a process when opentelemetry is importable and either

* the application installed an SDK ``TracerProvider`` itself (``trace.set_tracer_provider``), or
* a standard ``OTEL_*`` variable asks for an exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``): then robot-lab installs
  an SDK provider with a batching OTLP exporter (or ``console``) configured by those variables,

and ``OTEL_SDK_DISABLED`` is not ``true``. The decision is taken once, at the first hook, and
cached: when tracing is off, a hook costs one global read (bench/observability.py), and an
unconfigured process never even imports opentelemetry.

Spans nest through OpenTelemetry's own context (contextvars), and cross processes through the
W3C ``traceparent`` that ``robot_lab.tracing`` writes on every envelope and task job: the
receiving side opens its span with that traceparent as remote parent.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from robot_lab.logging import get_logger
from robot_lab.observability import genai

log = get_logger("robot_lab.observability")

F = TypeVar("F", bound=Callable[..., Any])
Attrs = Mapping[str, Any]

_UNRESOLVED = object()
_tracer: Any = _UNRESOLVED  # an opentelemetry Tracer, None when tracing is off, or unresolved
_EXPORTER_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER")


class _NullSpan:
    """What a hook gets when tracing is off: a context manager that records nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        return None

    def traceparent(self) -> str | None:
        return None


NULL_SPAN = _NullSpan()


def tracer() -> Any:
    """The tracer, or None when tracing is off (resolved once per process)."""
    global _tracer
    if _tracer is _UNRESOLVED:
        _tracer = _resolve()
    return _tracer


def enabled() -> bool:
    return tracer() is not None


def configure(provider: Any) -> None:
    """Trace with ``provider`` (an SDK TracerProvider) in this process, without touching the
    global provider; ``None`` turns tracing off. For applications and tests that own their
    provider."""
    global _tracer
    _tracer = provider.get_tracer("robot_lab") if provider is not None else None


def reset() -> None:
    """Resolve again at the next hook (after installing or removing a provider, in tests)."""
    global _tracer
    _tracer = _UNRESOLVED


def _resolve() -> Any:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    configured = any(os.environ.get(name) for name in _EXPORTER_VARS)
    if not configured and "opentelemetry.trace" not in sys.modules:
        return None  # nobody set up OpenTelemetry: do not even import it
    try:
        from opentelemetry import trace  # lazy: start-up time
    except ImportError:
        if configured:
            log.warning("otel.not_installed", hint="pip install 'robot-lab[otel]' to export traces")
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        if not configured or os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
            return None
        provider = _install_sdk_provider()
        if provider is None:
            return None
    return provider.get_tracer("robot_lab")


def _install_sdk_provider() -> Any:
    """An SDK provider exporting by the OTEL_* variables (the exporters read them themselves)."""
    try:
        from opentelemetry import trace  # lazy: start-up time
        from opentelemetry.sdk.resources import Resource  # lazy: start-up time
        from opentelemetry.sdk.trace import TracerProvider  # lazy: start-up time
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter  # lazy: start-up time
    except ImportError:
        log.warning("otel.sdk_not_installed", hint="pip install 'robot-lab[otel]' to export traces")
        return None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "robot-lab"}
    provider = TracerProvider(resource=Resource.create(attributes))
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    try:
        if kind == "console":
            exporter: Any = ConsoleSpanExporter()
        elif os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").startswith("grpc"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # lazy: start-up time

            exporter = OTLPSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter  # lazy: start-up time

            exporter = HttpExporter()
    except ImportError as exc:
        log.warning("otel.exporter_not_installed", exporter=kind, error=str(exc))
        return None
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("otel.configured", exporter=kind)
    return trace.get_tracer_provider()


def flush(timeout_ms: int = 5000) -> None:
    """Export buffered spans now: a process that ends with ``os._exit`` (a forked worker
    child) never runs the SDK's atexit flush."""
    if tracer() is None:
        return
    from opentelemetry import trace  # lazy: start-up time

    force = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force is not None:
        force(timeout_ms)


class _Span:
    """A live span as a hook sees it: ``set(**attributes)`` after the fact."""

    __slots__ = ("_manager", "span")

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.span: Any = None

    def __enter__(self) -> _Span:
        self.span = self._manager.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        if isinstance(exc[1], Exception):  # as the SDK: an Exception, not a BaseException, is a failure
            _mark(self.span, exc[1])
        return self._manager.__exit__(*exc)

    def set(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(_attr_name(key), _attr_value(value))

    def traceparent(self) -> str | None:
        return format_traceparent(self.span.get_span_context())


def _attr_name(key: str) -> str:
    return key if "." in key else f"robot_lab.{key}"


def _attr_value(value: Any) -> Any:
    """A value OpenTelemetry takes: a primitive, a list of strings (finish reasons, stop
    sequences), else its text."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return str(value)


def _mark(span: Any, exc: BaseException) -> None:
    """Status ERROR and ``error.type`` (what the SDK does not set itself)."""
    from opentelemetry.trace import Status, StatusCode  # lazy: start-up time

    span.set_attribute(genai.ERROR_TYPE, genai.error_type(exc))
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _current_recording() -> Any:
    """The current OpenTelemetry span when tracing is on and it records, else None."""
    if tracer() is None or _untraced.get():
        return None
    from opentelemetry import trace  # lazy: start-up time

    span = trace.get_current_span()
    return span if span.is_recording() else None


def mark_failed(exc: BaseException) -> None:
    """The current span ended in ``exc`` although nothing propagates (a tool whose error
    becomes text for the model): status ERROR, ``error.type`` and the exception event, as
    the SDK records an exception that leaves a span. A no-op when tracing is off."""
    span = _current_recording()
    if span is not None:
        span.record_exception(exc)
        _mark(span, exc)


def set_current(**attributes: Any) -> None:
    """Add attributes to the current span, once its hook learns them (a run's resolved model).
    A no-op when tracing is off."""
    span = _current_recording()
    if span is not None:
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(_attr_name(key), _attr_value(value))


_untraced: contextvars.ContextVar[bool] = contextvars.ContextVar("robot_lab_untraced", default=False)


@contextmanager
def untraced() -> Iterator[None]:
    """No span inside this block (a worker's warm-up call: no one-span trace per start)."""
    token = _untraced.set(True)
    try:
        yield
    finally:
        _untraced.reset(token)


def span(name: str, attributes: Attrs | None = None, *, parent: str | None = None, kind: str = "internal"
         ) -> _Span | _NullSpan:
    """A span around a block: ``with span("llm.call", {"model": m}) as s: ... s.set(tokens=n)``.

    ``parent`` is a W3C traceparent from another process (the span continues that trace);
    without it the span is a child of the current one. ``kind``: internal, producer, consumer,
    client or server.
    """
    t = tracer()
    if t is None or _untraced.get():
        return NULL_SPAN
    from opentelemetry import trace  # lazy: start-up time

    context = None
    if parent:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # lazy: start-up time

        context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    attrs = {_attr_name(k): _attr_value(v) for k, v in (attributes or {}).items() if v is not None}
    return _Span(t.start_as_current_span(name, context=context, kind=getattr(trace.SpanKind, kind.upper()),
                                         attributes=attrs))


def traced(name: str | Callable[..., str], attributes: Callable[..., Attrs] | None = None, *,
           kind: str = "internal", result: Callable[[_Span, Any], None] | None = None) -> Callable[[F], F]:
    """Decorator form of :func:`span`, for one-line hooks on methods.

    ``name`` is the span's name, or computes it from the call (a GenAI span is named after
    its model, tool or robot); ``attributes(*args, **kwargs)`` computes the span's attributes from the call;
    ``result(span, returned)`` may add more from the return value. With tracing off the
    wrapper calls the function straight away. A coroutine function gets an async wrapper
    (the span lasts until the awaited result).
    """

    def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return name(*args, **kwargs) if callable(name) else name

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                if _tracer is None or tracer() is None:
                    return await fn(*args, **kwargs)
                with span(_named(args, kwargs), attributes(*args, **kwargs) if attributes else None,
                          kind=kind) as s:
                    returned = await fn(*args, **kwargs)
                    if result is not None:
                        result(s, returned)  # type: ignore[arg-type]
                    return returned

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None or tracer() is None:
                return fn(*args, **kwargs)
            with span(_named(args, kwargs), attributes(*args, **kwargs) if attributes else None, kind=kind) as s:
                returned = fn(*args, **kwargs)
                if result is not None:
                    result(s, returned)  # type: ignore[arg-type]
                return returned

        return wrapper  # type: ignore[return-value]

    return decorate


def format_traceparent(context: Any) -> str | None:
    """W3C traceparent of a SpanContext, None when it is not valid."""
    if context is None or not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The current OpenTelemetry span as a traceparent (None when tracing is off or no span)."""
    if tracer() is None:
        return None
    from opentelemetry import trace  # lazy: start-up time

    return format_traceparent(trace.get_current_span().get_span_context())


@contextmanager
def remote_span(name: str, traceparent: str | None, attributes: Attrs | None = None,
                *, kind: str = "consumer", flush_after: bool = False) -> Iterator[str | None]:
    """A span continuing another process's trace; yields its own traceparent (None when off).
    ``flush_after`` exports at once when it ends (see :func:`flush`)."""
    try:
        with span(name, attributes, parent=traceparent, kind=kind) as s:
            yield s.traceparent()
    finally:
        if flush_after:
            flush()
