"""Instrumentation primitives: OpenTelemetry spans (``otel``) and Prometheus metrics
(``metrics``) that bus, runtime and workers call through one-line hooks.

This package sits in the foundation layer (it imports only errors, settings and logging)
so every layer may call it. Both halves are optional extras (``robot-lab[otel]``,
``robot-lab[metrics]``): without the library, or with it installed but not configured,
every hook is one global check and returns -- see docs/observability.md and
bench/observability.py for what that costs.
"""
