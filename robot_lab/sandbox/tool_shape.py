"""What every skill-provided tool shows a model: its JSON schema and the OpenAI function form.

Skills and the sandbox may not import the runtime's Tool (they sit beside runtime), so their
tools (the skills' and the workspace tools) share this mixin, here in the lower of the two,
and stay duck-compatible with it (``name``, ``description``, ``parameters``).
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
