"""The one retry policy of a model call: which provider errors deserve another attempt, how
long to wait (exponential backoff with jitter, at least the provider's ``Retry-After``), and
the call's deadline that bounds all of it.

Why one policy: litellm's openai client retries inside each attempt, rq re-runs a failed
task and the bus redelivers a failed message, and each layer multiplies the others. The
gateway passes ``max_retries=0`` to litellm and owns the retries here; the error it raises
once they are spent says ``retryable = False``, so a task or a message is not run again for
the same provider failure (docs/robot.md, "Retries and timeouts").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from robot_lab.errors import ConfigurationError, InferenceError
from robot_lab.logging import get_logger
from robot_lab.llm import scripted

log = get_logger("robot_lab.llm")

# Who hears of a retry instead of the log: ``robot-lab chat`` without -v sets one, so a
# retry is one plain line on stderr, never a JSON log line inside the streamed reply.
retry_notice: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "robot_lab_retry_notice", default=None)

# litellm exception class names worth another attempt (network, overload, rate limits).
RETRYABLE_PROVIDER_ERRORS = frozenset(
    {
        "RateLimitError",
        "APIConnectionError",
        "Timeout",
        "ServiceUnavailableError",
        "InternalServerError",
        "BadGatewayError",
        "APIError",
    }
)

# Provider answers that another attempt cannot change: a wrong or missing key, an unknown
# model, a request the provider rejects. Checked before RETRYABLE_PROVIDER_ERRORS, because
# litellm's classes all derive from openai's APIError.
PERMANENT_PROVIDER_ERRORS = frozenset(
    {
        "AuthenticationError",
        "PermissionDeniedError",
        "NotFoundError",
        "BadRequestError",
        "UnprocessableEntityError",
        "ContextWindowExceededError",
        "ContentPolicyViolationError",
        "UnsupportedParamsError",
    }
)

# The longest Retry-After honoured as such; a longer one ends the call (the deadline says).
_MAX_RETRY_AFTER = 3600.0


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps (litellm keeps the original in ``original_exception``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "original_exception", None) or current.__cause__ or current.__context__


def short_error(exc: BaseException, limit: int = 300) -> str:
    """First line of an exception's text, capped: litellm appends tracebacks and links."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, scripted.ScriptedProviderError):
        return True
    if isinstance(exc, InferenceError):
        return getattr(exc, "retryable", None) is not False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & PERMANENT_PROVIDER_ERRORS:
        return False
    return bool(names & RETRYABLE_PROVIDER_ERRORS)


def permanent_error(exc: BaseException, model: str) -> ConfigurationError | None:
    """The ConfigurationError to raise at once for ``exc``, or None when it may pass."""
    for inner in chain(exc):
        if isinstance(inner, ConfigurationError):  # e.g. an unknown scripted behaviour
            return inner
    if {cls.__name__ for cls in type(exc).__mro__} & PERMANENT_PROVIDER_ERRORS:
        return ConfigurationError(f"{model}: {short_error(exc)} (not retried: another attempt cannot fix this)")
    return None


def retry_after(exc: BaseException) -> float | None:
    """The seconds a provider asked to wait (``Retry-After`` / ``retry-after-ms``), if any."""
    for inner in chain(exc):
        response = getattr(inner, "response", None)
        headers = getattr(response, "headers", None) or getattr(inner, "litellm_response_headers", None)
        if not headers:
            continue
        try:
            ms = headers.get("retry-after-ms")
            if ms is not None:
                return max(0.0, float(ms) / 1000)
            value = headers.get("retry-after")
            if value is not None:
                return max(0.0, float(value))
        except (TypeError, ValueError):  # an HTTP date: not worth a parser, the backoff applies
            return None
    return None


def final_error(message: str) -> InferenceError:
    """The call's failure once its retries are spent: not retried again by a task or a
    message (the gateway already did)."""
    error = InferenceError(message)
    error.retryable = False  # type: ignore[attr-defined]
    return error


@dataclass
class CallBudget:
    """One call's attempts and deadline: the per-attempt timeout and the wait before the
    next attempt, or the error that ends the call."""

    model: str
    max_retries: int
    retry_interval: float
    backoff_factor: float
    randomness: float
    request_timeout: float
    deadline_s: float
    attempt: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.started + self.deadline_s

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def attempt_timeout(self) -> float:
        """The timeout of the next attempt: ``request_timeout``, cut to what the deadline leaves."""
        left = self.remaining()
        if left <= 0:
            raise final_error(f"{self.model}: no answer within the call deadline ({self.deadline_s:g} s)")
        return max(0.001, min(self.request_timeout, left))

    def check_deadline(self) -> None:
        """Between a stream's parts: a provider that trickles cannot outlast the deadline."""
        if time.monotonic() > self.deadline:
            raise final_error(f"{self.model}: the reply did not finish within the call deadline ({self.deadline_s:g} s)")

    @contextlib.asynccontextmanager
    async def async_deadline(self) -> AsyncIterator[None]:
        """One async attempt, cancelled when the deadline passes."""
        try:
            async with asyncio.timeout(max(0.001, self.remaining())):
                yield
        except TimeoutError as exc:
            if time.monotonic() < self.deadline:
                raise  # the request's own timeout, not the deadline: retried as such
            raise final_error(f"{self.model}: no answer within the call deadline ({self.deadline_s:g} s)") from exc

    def after_failure(self, exc: BaseException, *, delivered: bool = False) -> float:
        """Seconds to wait before the next attempt after ``exc``; raises when the error is
        permanent, part of the reply was already delivered, the retries are spent or the
        wait would pass the deadline."""
        if isinstance(exc, ConfigurationError) or (isinstance(exc, InferenceError) and getattr(exc, "retryable", None) is False):
            raise exc
        permanent = permanent_error(exc, self.model)
        if permanent is not None:
            raise permanent from exc
        text = f"{self.model}: {short_error(exc)}"
        if delivered:
            raise final_error(f"{text} (after part of the reply was streamed: not retried)") from exc
        if self.attempt >= self.max_retries or not is_retryable(exc):
            tries = f" (after {self.attempt + 1} attempts)" if self.attempt else ""
            raise final_error(text + tries) from exc
        delay = self.retry_interval * (self.backoff_factor**self.attempt)
        delay += delay * self.randomness * random.random()
        asked = retry_after(exc)
        if asked is not None:
            delay = max(delay, min(asked, _MAX_RETRY_AFTER))
        if delay >= self.remaining():
            raise final_error(f"{text} (the next attempt, in {delay:.1f} s, would pass the call deadline "
                              f"of {self.deadline_s:g} s)") from exc
        self.attempt += 1
        announce = retry_notice.get()
        if announce is None:
            log.warning("llm.retry", model=self.model, attempt=self.attempt, delay=round(delay, 3),
                        error=short_error(exc))
        else:
            log.debug("llm.retry", model=self.model, attempt=self.attempt, delay=round(delay, 3),
                      error=short_error(exc))
            announce(f"{short_error(exc)}: retrying in {delay:.1f} s (attempt {self.attempt + 1} of "
                     f"{self.max_retries + 1})")
        return delay
