"""``python tests/otel_proc.py SPANS.json robot-lab-args...``: run a robot-lab command in this
process under an OpenTelemetry SDK provider with the in-memory exporter, and write the
finished spans as JSON to SPANS.json when the process exits (SIGTERM included)."""

from __future__ import annotations

import atexit
import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def span_record(span) -> dict:  # type: ignore[no-untyped-def]
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
    }


def main() -> None:
    out = sys.argv[1]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    def dump() -> None:
        with open(out, "w") as fh:
            json.dump([span_record(s) for s in exporter.get_finished_spans()], fh)

    atexit.register(dump)
    from robot_lab.cli import main as cli

    sys.argv = ["robot-lab", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
