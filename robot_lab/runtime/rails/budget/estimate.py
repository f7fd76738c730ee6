"""How big a model call's reservation is: an estimate made before the call.

Tokens: the input counted with litellm's ``token_counter`` (tiktoken: the model's encoding
where litellm knows it, its default one otherwise; never a tokenizer fetched from the
network; the scripted model's as it reports them, without litellm) plus the most the
call may write: ``max_tokens``, or ``budget.default_output_tokens`` (setting
``ROBOT_LAB_BUDGET__DEFAULT_OUTPUT_TOKENS``) when the call sets none. Cost: litellm's price
of those tokens when it knows the model's price; otherwise None, and the call reserves all
that is free of a cost budget (cost-budgeted calls of an unpriced model serialize).

Reserving what the call can really use -- rather than everything that remains, or a cap
that leaves the input out -- is what lets parallel calls share one budget and still bounds
the overspend (docs/safety.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from robot_lab.logging import get_logger
from robot_lab.runtime.rails.budget.ledger import COST, TOKENS
from robot_lab.settings import get_settings

log = get_logger("robot_lab.budget")


@dataclass(frozen=True)
class CallEstimate:
    """Input tokens counted, output tokens allowed, and the price of both (None: unknown)."""

    input_tokens: int
    output_tokens: int
    cost: float | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def amount(self, dimension: str) -> float | None:
        """What to reserve of ``dimension``; None means "all that is free"."""
        if dimension == TOKENS:
            return float(self.tokens)
        if dimension == COST:
            return self.cost
        return None


def _fallback_count(messages: Sequence[Any], tools: Sequence[Any] | None) -> int:
    """Characters / 4 when litellm cannot count (the Ruby gem's own estimate)."""
    text = json.dumps(list(messages), default=str) + json.dumps(list(tools or []), default=str)
    return math.ceil(len(text) / 4)


def _litellm() -> Any:
    from robot_lab.llm.gateway import litellm_module  # lazy: start-up time

    litellm = litellm_module()
    # For llama, cohere, deepseek and some anthropic models litellm would fetch a tokenizer
    # from Hugging Face on first use: a network request (robot-lab runs offline) that stalled
    # 25 s with no network. tiktoken's bundled encoding is close enough for a reservation.
    litellm.disable_hf_tokenizer_download = True
    return litellm


def _scripted(model: str) -> bool:
    return model == "scripted" or model.startswith("scripted/")


def count_input_tokens(model: str, messages: Sequence[Any], tools: Sequence[Any] | None = None) -> int:
    """Input tokens of a call as litellm counts them (chars / 4 if it cannot). The scripted
    model's are the ones it will report, counted as it counts them, without litellm: a worker
    serving only scripted robots never imports litellm (which would cost seconds under a task's
    lease the first time a budget applies)."""
    if _scripted(model):
        from robot_lab.llm.scripted import prompt_tokens  # lazy: start-up time

        try:
            return prompt_tokens(list(messages), list(tools or []))
        except Exception:  # an odd message shape: over-count instead
            return _fallback_count(messages, tools)
    try:
        return int(_litellm().token_counter(model=model, messages=list(messages), tools=tools or None))
    except Exception as exc:  # an odd message shape must not stop the call; over-count instead
        log.debug("budget.token_count_fallback", model=model, error=f"{type(exc).__name__}: {exc}")
        return _fallback_count(messages, tools)


def estimate_call(
    model: str,
    messages: Sequence[Any],
    tools: Sequence[Any] | None = None,
    max_tokens: int | None = None,
    *,
    default_output_tokens: int | None = None,
) -> CallEstimate:
    """The reservation a call to ``model`` with these ``messages`` and ``tools`` needs."""
    if default_output_tokens is None:
        default_output_tokens = get_settings().budget.default_output_tokens
    input_tokens = count_input_tokens(model, messages, tools)
    output_tokens = int(max_tokens) if max_tokens else int(default_output_tokens)
    cost: float | None = None
    if _scripted(model):  # unpriced
        return CallEstimate(input_tokens=input_tokens, output_tokens=output_tokens, cost=None)
    try:
        prompt_cost, completion_cost = _litellm().cost_per_token(
            model=model, prompt_tokens=input_tokens, completion_tokens=output_tokens)
        cost = float(prompt_cost) + float(completion_cost)
    except Exception:  # no price known for this model (scripted, local, custom)
        cost = None
    return CallEstimate(input_tokens=input_tokens, output_tokens=output_tokens, cost=cost)
