"""structlog set up once: JSON lines for workers and pipes, a readable console on a TTY.

Context (robot, run_id, task, message_id) rides in contextvars, so every line logged while
a message or task is handled carries it without passing loggers around. Values that look
like secrets are masked by a processor, whatever the caller logged.

structlog itself is imported when the first line at or above the configured level is logged,
not when a module asks for its logger (every module does, at import) nor for a line the level
filters out, and :func:`log_context` keeps its values in a context variable of this module:
a CLI command or a first run that logs nothing at WARNING does not pay for structlog (which
also imports rich) -- bench/startup.py.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

_configured = False
_applied = False  # structlog.configure called with _pending
_pending: tuple[str, str] = ("INFO", "json")
_SECRET_KEY_RE = re.compile(r"(api[_-]?key|secret|token|password|authorization)", re.I)
# Key shapes of the common providers; masked wherever they appear in a value.
_SECRET_VALUE_RE = re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|sk-ant-[A-Za-z0-9_\-]{8,}|AIza[0-9A-Za-z_\-]{20,})")
_declared_secrets: set[str] = set()
_NOT_SECRET_KEYS = {"input_tokens", "output_tokens", "total_tokens", "token_budget", "tokens"}
# What log_context bound (robot, run_id, task, message_id, trace ids): merged into each line
# by a processor. Our own variable, not structlog's contextvars, so binding costs no import.
_context: ContextVar[dict[str, Any]] = ContextVar("robot_lab_log_context", default={})
# Numeric levels of the logger methods a line can be filtered on before structlog is loaded.
_METHOD_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                  "warn": logging.WARNING, "error": logging.ERROR, "exception": logging.ERROR,
                  "critical": logging.CRITICAL, "fatal": logging.CRITICAL}


def declare_secret(value: str | None) -> None:
    """Mask this exact value in every later log line (skill secrets, API keys)."""
    if value and len(value) >= 4:
        _declared_secrets.add(value)


def _mask(value: Any) -> Any:
    if isinstance(value, str):
        for secret in _declared_secrets:
            if secret in value:
                value = value.replace(secret, "***")
        return _SECRET_VALUE_RE.sub("***", value)
    if isinstance(value, dict):
        return {k: _mask_pair(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mask(v) for v in value)
    return value


def _mask_pair(key: Any, value: Any) -> Any:
    if isinstance(key, str) and key not in _NOT_SECRET_KEYS and _SECRET_KEY_RE.search(key):
        return "***" if value else value
    return _mask(value)


def merge_log_context(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Add what :func:`log_context` bound; the line's own keys win (as structlog's
    ``merge_contextvars`` does)."""
    bound = _context.get()
    return {**bound, **event_dict} if bound else event_dict


def log_context_values() -> dict[str, Any]:
    """What :func:`log_context` has bound here (the ``robot`` a metric is labelled with)."""
    return dict(_context.get())


def redact_secrets(_: Any, __: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: _mask_pair(k, v) for k, v in event_dict.items()}


def _env_api_keys() -> None:
    for name, value in os.environ.items():
        if name.endswith(("_API_KEY", "_TOKEN", "_SECRET")):
            declare_secret(value)


class _StderrLogger:
    """Writes to whatever ``sys.stderr`` is at the time of the call, not at configure time
    (test runners and daemons swap and close streams)."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        try:
            stream.write(message + "\n")
            stream.flush()
        except ValueError:  # the stream was closed under us; logging must not break work
            pass

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _logger_factory(*_: Any) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(level: str | None = None, fmt: str | None = None, *, force: bool = False) -> None:
    """Configure structlog and stdlib logging once per process (structlog is set up when
    the first line is logged, or now if it was already)."""
    global _configured, _pending
    if _configured and not force:
        return
    from robot_lab.settings import get_settings  # lazy: start-up time

    settings = get_settings()
    level = (level or settings.log_level).upper()
    fmt = fmt or settings.log_format
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    _env_api_keys()
    _pending = (level, fmt)
    _configured = True
    if _applied:
        _apply()
    _warn_unknown_variables()


_structlog_lock = threading.Lock()
_structlog: Any = None


def structlog_module() -> Any:
    """structlog, imported once under a lock (lazily: start-up time). Its modules import each
    other, so two threads importing it at once -- an embedded run's worker threads logging
    their first lines -- can meet a partially initialized module and fail with ImportError."""
    global _structlog
    if _structlog is None:
        with _structlog_lock:
            if _structlog is None:
                import structlog  # lazy: start-up time
                import structlog.contextvars  # noqa: F401  (the same import, whole, under the lock)
                import structlog.dev  # noqa: F401  (likewise)
                import structlog.processors  # noqa: F401  (likewise)
                import structlog.testing  # noqa: F401  (likewise)

                _structlog = structlog
    return _structlog


def _apply() -> None:
    global _applied
    structlog = structlog_module()

    if _capturing(structlog):
        return  # structlog.testing.capture_logs is active: its processors stay; applied after it
    level, fmt = _pending
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,  # what other code bound in structlog's own
            merge_log_context,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level, logging.INFO)),
        logger_factory=_logger_factory,
        cache_logger_on_first_use=False,
    )
    _applied = True


def _warn_unknown_variables() -> None:
    """Once per process: a misspelt ``ROBOT_LAB_*`` variable would otherwise be ignored
    without a word (pydantic-settings ignores extra variables)."""
    from robot_lab.settings import unknown_variables  # lazy: start-up time

    for name, suggestion in unknown_variables():
        hint = f"; did you mean {suggestion}?" if suggestion else ""
        get_logger("robot_lab.settings").warning(
            "settings.unknown_variable", variable=name, hint=f"no setting reads {name}{hint}"
        )


def _capturing(structlog: Any) -> bool:
    return any(isinstance(p, structlog.testing.LogCapture) for p in structlog.get_config().get("processors", ()))


class _Logger:
    """A module's structlog logger, made on its first use."""

    __slots__ = ("_name", "_initial", "_logger")

    def __init__(self, name: str | None, initial: dict[str, Any]) -> None:
        self._name, self._initial, self._logger = name, initial, None

    def _real(self) -> Any:
        if self._logger is None or not _applied:
            configure_logging()
            if not _applied:
                _apply()
            logger = structlog_module().get_logger(self._name)
            self._logger = logger.bind(**self._initial) if self._initial else logger
        return self._logger

    def __getattr__(self, name: str) -> Any:
        threshold = _METHOD_LEVELS.get(name)
        if threshold is not None and "structlog" not in sys.modules:
            # structlog not loaded yet (by anyone): a line the configured level drops needs no import
            configure_logging()
            if threshold < getattr(logging, _pending[0], logging.INFO):
                return _drop
        return getattr(self._real(), name)


def _drop(*_: Any, **__: Any) -> None:
    """A filtered-out log line."""


def get_logger(name: str | None = None, **initial: Any) -> Any:
    return _Logger(name, initial)


@contextmanager
def log_context(**values: Any) -> Iterator[None]:
    """Bind robot/run_id/task/message_id for the duration of a block: every line logged in
    it (this thread or task, contextvars) carries them."""
    clean = {k: v for k, v in values.items() if v is not None}
    token = _context.set({**_context.get(), **clean})
    try:
        yield
    finally:
        _context.reset(token)
