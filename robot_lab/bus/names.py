"""What a robot (channel) name may be: it becomes part of Redis keys and ACL patterns."""

from __future__ import annotations

import re
from typing import Any

from robot_lab.errors import BusError

# ':' would let "x:dlq" alias robot x's DLQ, braces would break cluster hash tags,
# whitespace breaks the CLI.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.@/+\-]{1,200}$")


def check_robot_name(name: Any, field: str = "robot") -> str:
    """Return ``name`` if it is usable as a robot / channel name, else raise BusError."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise BusError(
            f"invalid {field} name {name!r}: use 1-200 characters from letters, digits and "
            "_ . @ / + - (no ':', braces or spaces)"
        )
    return name
