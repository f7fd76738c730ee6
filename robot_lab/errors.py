"""The robot_lab error hierarchy, kept name-for-name so ported code reads the same.

Every error the project raises on purpose derives from :class:`RobotLabError`, so a caller
can catch the whole family with one ``except`` and still tell the kinds apart.
"""

from __future__ import annotations


class RobotLabError(Exception):
    """Base of every error robot-lab raises on purpose."""


# robot_lab calls its base ``RobotLab::Error``; keep the alias for ported code.
Error = RobotLabError


class ConfigurationError(RobotLabError):
    """A definition, setting, template or file is wrong; fix the input, retrying won't help."""


class DependencyError(ConfigurationError):
    """An optional dependency (extra) is missing."""


class InferenceError(RobotLabError):
    """The model call failed or produced an unusable answer; retryable by default."""


class ToolLoopError(InferenceError):
    """``max_tool_rounds`` circuit breaker tripped; never retryable."""


class ToolNotFoundError(RobotLabError):
    """A tool name was asked for that the robot does not have."""


class _RetryableFlagMixin:
    retryable: bool | None

    def _set_retryable(self, retryable: bool | None) -> None:
        self.retryable = retryable


class MCPError(RobotLabError, _RetryableFlagMixin):
    """An MCP server could not be reached or answered with an error."""

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self._set_retryable(retryable)


class ToolError(RobotLabError, _RetryableFlagMixin):
    """Raised by a tool to report a failure to the model (returned as text, not raised)."""

    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self._set_retryable(retryable)


class BusError(RobotLabError):
    """Bus misuse: unknown channel (robot), bad envelope, closed poller."""


class RemoteError(BusError):
    """The robot a request went to gave up on it (dead-lettered); ``reason`` says why
    (``failed``, ``invalid``, ``expired``, ...)."""

    def __init__(self, message: str = "", *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class RedisOutOfMemory(RobotLabError):
    """Redis refused a write because it reached ``maxmemory`` (policy ``noeviction``); what
    was refused was not written. Raised by ``Bus.publish`` and ``Coordinator.submit``; loops
    ride it out as an outage instead (robot_lab/outage.py)."""


class BudgetExceeded(RobotLabError):
    """Refused *before* a call because the budget is already spent (not an InferenceError)."""


class AwaitTimeout(RobotLabError):
    """A blocking wait (memory read, bus request) ran out of time."""


class DelegationTimeout(RobotLabError):
    """A delegated run did not finish in time."""


class SchemaError(RobotLabError):
    """Wire data failed validation; ``path`` is msgspec's JSON path (e.g. ``$.id``)."""

    def __init__(self, message: str, *, path: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.kind = kind


class SandboxError(RobotLabError):
    """A skill script could not be confined as the settings demand."""


class InputRequired(RobotLabError):
    """A run needs a person's answer (``ask_user``, a tool that ``requires_approval``, or a
    tool raising it). Inside a durable scope that parks (a network task, a served message)
    the run stops here and resumes once answered; elsewhere ``run()`` raises it when no
    ``on_input`` callback and no terminal can answer. ``request`` is the recorded request
    (id, question, choices, default, kind) once the durable layer has one. ``context`` is
    recorded with the request for the tool that asks (where it left off outside: a remote
    agent's task), so a resumed step on any worker continues there."""

    retryable = False

    def __init__(self, question: str, *, choices: list[str] | None = None, default: str | None = None,
                 kind: str = "question", tool: str | None = None, arguments: dict | None = None,
                 timeout: float | None = None, message: str | None = None, context: dict | None = None) -> None:
        super().__init__(message or question)
        self.question = question
        self.choices = list(choices) if choices else None
        self.default = default
        self.kind = kind
        self.tool = tool
        self.arguments = arguments
        self.timeout = timeout
        self.context = context
        self.request: dict | None = None


class StepDivergence(RobotLabError):
    """A replayed step's request no longer matches the step journal (the prompt, model,
    tools or arguments changed between attempts); ``durable.on_divergence=live`` continues
    live from that step instead."""

    retryable = False


class InputTimeout(RobotLabError):
    """An input request passed its ``input_timeout`` with no answer and no default."""

    retryable = False


def retryable(error: BaseException | None) -> bool:
    """The Ruby gem's ``Errors.retryable?``: which failures deserve another attempt."""
    if error is None or isinstance(error, ToolLoopError):
        return False
    if isinstance(error, (MCPError, ToolError)):
        return bool(error.retryable)
    flag = getattr(error, "retryable", None)  # an error may say so itself (a budget overrun: False)
    if isinstance(flag, bool):
        return flag
    return isinstance(error, InferenceError)


RETRYABLE_CLASSES: tuple[type[RobotLabError], ...] = (InferenceError,)

__all__ = [
    "RETRYABLE_CLASSES",
    "AwaitTimeout",
    "InputRequired",
    "InputTimeout",
    "StepDivergence",
    "BudgetExceeded",
    "BusError",
    "ConfigurationError",
    "DelegationTimeout",
    "DependencyError",
    "Error",
    "InferenceError",
    "MCPError",
    "RemoteError",
    "RobotLabError",
    "SandboxError",
    "SchemaError",
    "ToolError",
    "ToolLoopError",
    "ToolNotFoundError",
    "retryable",
]
