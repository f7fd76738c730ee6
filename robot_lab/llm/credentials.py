"""The provider keys robot-lab can check without litellm, so that a model with no key fails at
once instead of after litellm's import (3-4 s, tens of seconds on a busy machine).

Only providers whose key is one well-known environment variable are listed; any other model
goes on to litellm's own ``validate_environment`` check (gateway.py), which knows them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from robot_lab.errors import ConfigurationError

# provider prefix of the model string -> the environment variables, any one of which will do
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "cohere": ("COHERE_API_KEY", "CO_API_KEY"),
    "together_ai": ("TOGETHERAI_API_KEY", "TOGETHER_API_KEY"),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY"),
    "perplexity": ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
}


def check_known_provider_key(model: str, provider: str | None, params: Mapping[str, Any] | None) -> None:
    """Raise the "no credentials" error for a listed provider whose key is not set (nor an
    ``api_key`` / ``api_base`` given for the call); say nothing about any other model."""
    if params and (params.get("api_key") or params.get("api_base")):
        return
    prefix = model.split("/", 1)[0] if "/" in model else (provider or "")
    keys = PROVIDER_KEYS.get(prefix)
    if keys and not any(os.environ.get(key) for key in keys):
        raise ConfigurationError(
            f"{model}: no credentials: set {' or '.join(keys)} (or pick another model with -m / ROBOT_LAB_MODEL; "
            "scripted/echo needs none)"
        )
