"""Conversation-history tools: compression, search and convergence.

All three work on what the Robot keeps: OpenAI-style message dicts
(``{"role": "user", "content": "..."}``, content either a string or a list of parts such as
``{"type": "text", "text": "..."}``). Objects with ``role``/``content`` attributes work too.
Similarity is the stemmed TF cosine of :mod:`robot_lab.text.analysis` (no IDF: on a
topic-focused conversation IDF would suppress exactly the terms that mark relevance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.text import analysis as ta

MIN_SCORE_LENGTH = 20
DEFAULT_RECENT_TURNS = 3
DEFAULT_KEEP_THRESHOLD = 0.6
DEFAULT_DROP_THRESHOLD = 0.2
DEFAULT_COMPACT_THRESHOLD = 0.80
DEFAULT_CONTEXT_WINDOW = 200_000

# Roles whose messages are never scored or removed. robot_lab pins system, tool and
# tool_result; "function" is OpenAI's legacy spelling of a tool result.
PINNED_ROLES = frozenset({"system", "tool", "tool_result", "function"})

_log = get_logger("robot_lab.history")


def _field(message: Any, name: str) -> Any:
    if isinstance(message, dict):
        return message.get(name)
    return getattr(message, name, None)


def message_role(message: Any) -> str:
    role = _field(message, "role")
    return str(getattr(role, "value", role) or "")


def message_text(message: Any) -> str | None:
    """The plain text of a message: string content as is, list content as its text parts
    joined with a space, anything else None (the Ruby gem's ``extract_text``)."""
    content = _field(message, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
            if text is not None:
                parts.append(str(text))
        return " ".join(parts)
    return None


def is_pinned(message: Any) -> bool:
    """Never compress: system and tool messages, and assistant tool-call dispatchers.

    robot_lab pins assistant messages with blank text. An OpenAI assistant message that
    carries ``tool_calls`` is pinned even when it also has text: dropping it would orphan
    the tool results that answer it, which providers reject.
    """
    role = message_role(message)
    if role in PINNED_ROLES:
        return True
    if role == "assistant":
        if _field(message, "tool_calls"):
            return True
        text = message_text(message)
        return text is None or not text.strip()
    return False


# --- search --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryResult:
    """One search hit (the Ruby gem's ``HistoryResult``): index is the position in ``messages``."""

    text: str
    role: str
    score: float
    index: int


def search_history(messages: Sequence[Any], query: str, limit: int = 5) -> list[HistoryResult]:
    """The ``limit`` messages most similar to ``query``, best first.

    Messages shorter than 20 characters and messages scoring 0 are skipped; ties keep
    conversation order.
    """
    query_vec = ta.tf_vector(query)
    if not query_vec or limit <= 0:
        return []
    results = []
    for index, message in enumerate(messages):
        text = message_text(message)
        if text is None or len(text.strip()) < MIN_SCORE_LENGTH:
            continue
        score = ta.cosine_similarity(query_vec, ta.tf_vector(text))
        if score == 0.0:
            continue
        results.append(HistoryResult(text=text, role=message_role(message), score=score, index=index))
    results.sort(key=lambda r: -r.score)
    return results[:limit]


# --- compression ---------------------------------------------------------------------------

Summarizer = Callable[[str], Any]


class HistoryCompressor:
    """Drop or summarize old turns that have drifted from the recent conversation.

    Each older scorable message is scored against the mean TF vector of the last
    ``2 * recent_turns`` scorable messages: ``>= keep_threshold`` keeps it verbatim,
    ``< drop_threshold`` (or medium with no summarizer) drops it, and medium ones are
    replaced by ``summarizer(text)`` under the original role (a blank summary drops it).
    Messages shorter than 20 characters are kept. Pinned messages (:func:`is_pinned`) and
    the recent window are always kept, in their original order.
    """

    MIN_SCORE_LENGTH = MIN_SCORE_LENGTH

    def __init__(
        self,
        messages: Sequence[Any],
        *,
        recent_turns: int,
        keep_threshold: float,
        drop_threshold: float,
        summarizer: Summarizer | None,
    ) -> None:
        if keep_threshold <= drop_threshold:
            raise ValueError(
                f"keep_threshold ({keep_threshold}) must be greater than drop_threshold ({drop_threshold})"
            )
        if recent_turns < 0:
            raise ValueError(f"recent_turns must be >= 0, got {recent_turns}")
        self.messages = list(messages)
        self.recent_turns = recent_turns
        self.keep_threshold = keep_threshold
        self.drop_threshold = drop_threshold
        self.summarizer = summarizer
        self.stats = {"kept": 0, "dropped": 0, "summarized": 0}

    def __call__(self) -> list[Any]:
        return self.call()

    def call(self) -> list[Any]:
        """The compressed message list (the input list, copied, when nothing applies)."""
        messages = self.messages
        if not messages:
            return list(messages)
        scorable = [i for i, m in enumerate(messages) if not is_pinned(m)]
        recent_count = self.recent_turns * 2
        if not scorable or len(scorable) <= recent_count:
            return list(messages)
        compressible = scorable[: len(scorable) - recent_count]
        # the Ruby gem's scorable[-0..] is the whole list: with recent_turns 0 everything is
        # both the reference and compressible.
        recent = scorable[len(scorable) - recent_count :] if recent_count else scorable
        recent_texts = [
            t for t in (message_text(messages[i]) for i in recent) if t is not None and len(t.strip()) >= MIN_SCORE_LENGTH
        ]
        if not recent_texts:
            return list(messages)
        reference = ta.mean_vector(ta.tf_vector(t) for t in recent_texts)
        actions = {i: self._action(reference, messages[i]) for i in compressible}
        result: list[Any] = []
        for index, message in enumerate(messages):
            action = actions.get(index, "keep")
            if action == "keep":
                result.append(message)
            elif action != "drop":
                result.append({"role": message_role(message), "content": action})
        _log.info("history.compressed", before=len(messages), after=len(result), **self.stats)
        return result

    def _action(self, reference: dict[str, float], message: Any) -> str:
        """"keep", "drop" or the summary text."""
        text = message_text(message)
        if text is None or len(text.strip()) < MIN_SCORE_LENGTH:
            self.stats["kept"] += 1
            return "keep"
        score = ta.cosine_similarity(ta.tf_vector(text), reference)
        if score >= self.keep_threshold:
            self.stats["kept"] += 1
            return "keep"
        if score < self.drop_threshold or self.summarizer is None:
            self.stats["dropped"] += 1
            return "drop"
        summary = str(self.summarizer(text) or "").strip()
        if not summary:
            self.stats["dropped"] += 1
            return "drop"
        self.stats["summarized"] += 1
        return summary


def compress_history(
    messages: Sequence[Any],
    *,
    recent_turns: int = DEFAULT_RECENT_TURNS,
    keep_threshold: float = DEFAULT_KEEP_THRESHOLD,
    drop_threshold: float = DEFAULT_DROP_THRESHOLD,
    summarizer: Summarizer | None = None,
) -> list[Any]:
    """The Ruby gem's ``Robot#compress_history`` defaults (3 turns, keep 0.6, drop 0.2)."""
    return HistoryCompressor(
        messages,
        recent_turns=recent_turns,
        keep_threshold=keep_threshold,
        drop_threshold=drop_threshold,
        summarizer=summarizer,
    ).call()


def estimate_tokens(messages: Sequence[Any]) -> int:
    """The Ruby gem's estimate for ``auto_compact``: total content characters / 4."""
    return sum(len(message_text(m) or "") for m in messages) // 4


def should_compact(
    messages: Sequence[Any],
    *,
    context_window: int | None = None,
    threshold: float | None = None,
) -> bool:
    """``auto_compact: context_window``: estimated tokens >= threshold (0.80) x the model's
    context window (200,000 when unknown)."""
    window = context_window or DEFAULT_CONTEXT_WINDOW
    limit = (DEFAULT_COMPACT_THRESHOLD if threshold is None else threshold) * window
    return estimate_tokens(messages) >= limit


# --- convergence ---------------------------------------------------------------------------


class Convergence:
    """Have two texts converged (e.g. two verifiers agree, so skip the reconciler)?"""

    DEFAULT_THRESHOLD = 0.85
    MIN_TEXT_LENGTH = 30

    @staticmethod
    def similarity(text_a: str | None, text_b: str | None) -> float:
        """TF cosine of the stripped texts; 0.0 when either is shorter than 30 characters
        (so two identical short strings score 0, as in robot_lab)."""
        a = (text_a or "").strip()
        b = (text_b or "").strip()
        if len(a) < Convergence.MIN_TEXT_LENGTH or len(b) < Convergence.MIN_TEXT_LENGTH:
            return 0.0
        return ta.tf_cosine_similarity(a, b)

    @staticmethod
    def detected(text_a: str | None, text_b: str | None, threshold: float = DEFAULT_THRESHOLD) -> bool:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0.0, 1.0], got {threshold}")
        return Convergence.similarity(text_a, text_b) >= threshold


__all__ = [
    "Convergence",
    "HistoryCompressor",
    "HistoryResult",
    "compress_history",
    "estimate_tokens",
    "is_pinned",
    "message_text",
    "search_history",
    "should_compact",
]
