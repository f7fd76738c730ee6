"""What every skill-provided tool shows a model: its JSON schema and the OpenAI function form.

Skills may not import the runtime's Tool (skills sit beside runtime), so their tools share
this mixin and stay duck-compatible with it (``name``, ``description``, ``parameters``).
"""

from __future__ import annotations

from typing import Any


class ToolShape:
    name: str
    description: str
    parameters: dict[str, Any]

    def to_json_schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.to_json_schema()}
