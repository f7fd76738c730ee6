"""RunConfig: the Ruby gem's shared operational defaults, merged along the cascade
global (settings) -> network -> task -> robot -> run.

Semantics kept from robot_lab: an unknown field raises ``ConfigurationError("Unknown
RunConfig field: x")``; setting a field to None deletes it; ``merge`` returns a new config in
which the other side's set values win; callbacks and the bus never serialize.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from robot_lab.errors import ConfigurationError
from robot_lab.schemas.validation import convert
from robot_lab.schemas.messages import RunConfigData

LLM_FIELDS = ("model", "temperature", "top_p", "top_k", "max_tokens", "presence_penalty", "frequency_penalty", "stop",
              "api_base", "api_key", "api_key_env")
TOOL_FIELDS = ("mcp", "tools")
CALLBACK_FIELDS = ("on_tool_call", "on_tool_result", "on_content")
INFRA_FIELDS = (
    "bus",
    "enable_cache",
    "max_tool_rounds",
    "token_budget",
    "cost_budget",
    "max_concurrent_robots",
    "doom_loop_threshold",
    "auto_compact",
    "compact_threshold",
    "max_tools",
    "input_timeout",
)
# api_key: a secret never crosses a process boundary; a worker reads its keys from its own
# settings (``endpoints``) or environment.
NON_SERIALIZABLE_FIELDS = frozenset((*CALLBACK_FIELDS, "bus", "api_key"))
FIELDS = frozenset((*LLM_FIELDS, *TOOL_FIELDS, *CALLBACK_FIELDS, *INFRA_FIELDS))


def check_enable_cache(value: Any) -> None:
    """The Ruby gem's ``enable_cache`` switched on its semantic response cache; robot-lab has
    none, so asking for one is an error rather than a silent no-op."""
    if value:
        raise ConfigurationError(
            "enable_cache=True is not supported: robot-lab has no response cache (leave it unset or False)"
        )


class RunConfig:
    """A sparse mapping of known fields; unset fields read as None."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        object.__setattr__(self, "_values", {})
        for key, value in {**dict(values or {}), **fields}.items():
            if value is not None:
                self.set(key, value)
            elif key not in FIELDS:  # None is unset: nothing to store, but the name must exist
                raise ConfigurationError(f"Unknown RunConfig field: {key}")

    # --- field access -------------------------------------------------------------------
    def set(self, key: str, value: Any) -> RunConfig:
        """Set one field (None deletes it); returns self so calls chain."""
        if key not in FIELDS:
            raise ConfigurationError(f"Unknown RunConfig field: {key}")
        if value is None:
            self._values.pop(key, None)
        else:
            if key in CALLBACK_FIELDS and not callable(value):
                raise ConfigurationError(f"RunConfig field {key} must be callable, got {type(value).__name__}")
            if key == "enable_cache":
                check_enable_cache(value)
            self._values[key] = value
        return self

    def __getattr__(self, key: str) -> Any:
        if key in FIELDS:
            return self._values.get(key)
        raise AttributeError(f"Unknown RunConfig field: {key}")

    def __setattr__(self, key: str, value: Any) -> None:
        self.set(key, value)

    def get(self, key: str, default: Any = None) -> Any:
        if key not in FIELDS:
            raise ConfigurationError(f"Unknown RunConfig field: {key}")
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and other._values == self._values

    def __repr__(self) -> str:
        shown = {k: "***" if k == "api_key" else v for k, v in self._values.items()}
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in sorted(shown.items()))})"

    @property
    def empty(self) -> bool:
        return not self._values

    # --- combining ----------------------------------------------------------------------
    def merge(self, other: RunConfig | Mapping[str, Any] | None) -> RunConfig:
        """A new config: ours, overridden by the other's set values."""
        values = other._values if isinstance(other, RunConfig) else RunConfig(other)._values if other is not None else {}
        return RunConfig._checked({**self._values, **values})

    @classmethod
    def _checked(cls, values: dict[str, Any]) -> RunConfig:
        """A config over ``values`` taken as they are: fields of configs that checked them
        (known names, no None, callable callbacks), so merging -- several times per run --
        does not check every field again."""
        config = cls.__new__(cls)
        object.__setattr__(config, "_values", values)
        return config

    @classmethod
    def cascade(cls, *layers: RunConfig | Mapping[str, Any] | None) -> RunConfig:
        """Merge left to right: global, network, task, robot, run (later wins)."""
        result = cls()
        for layer in layers:
            result = result.merge(layer)
        return result

    def configure(self, block: Callable[[RunConfig], Any]) -> RunConfig:
        """The Ruby gem's block form: ``RunConfig(model="x").configure(lambda c: c.set(...))``."""
        block(self)
        return self

    # --- serialization ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def to_json_dict(self) -> dict[str, Any]:
        """Only what can cross a process boundary (callbacks and bus dropped)."""
        return {k: v for k, v in self._values.items() if k not in NON_SERIALIZABLE_FIELDS and not callable(v)}

    def to_data(self) -> RunConfigData:
        return convert(self.to_json_dict(), RunConfigData)

    @classmethod
    def from_data(cls, data: RunConfigData | Mapping[str, Any] | None) -> RunConfig:
        if data is None:
            return cls()
        if isinstance(data, RunConfigData):
            data = msgspec.to_builtins(data)
        return cls(data)

    @classmethod
    def from_front_matter(cls, metadata: Mapping[str, Any]) -> RunConfig:
        return cls({k: metadata[k] for k in (*LLM_FIELDS, *TOOL_FIELDS) if k in metadata})

    def llm_params(self) -> dict[str, Any]:
        """Provider parameters for litellm (model excluded)."""
        return {k: self._values[k] for k in LLM_FIELDS if k != "model" and k in self._values}
