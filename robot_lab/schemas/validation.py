"""Validation of builtins into wire types, with one error type that names the bad field.

msgspec reports where validation failed as a JSON path (``$.headers.traceparent``); we keep
that path on :class:`SchemaError` so a dead-letter entry or a CLI message can name the field.
Apart from :mod:`.codec` so the wire types themselves can validate (``RobotResult.from_dict``)
without importing the codec that imports them.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from robot_lab.errors import SchemaError

T = TypeVar("T")

_PATH_RE = re.compile(r" - at `(?P<path>\$[^`]*)`$")
_MISSING_RE = re.compile(r"missing required field `(?P<field>[^`]+)`")


def schema_error(exc: Exception, kind: str) -> SchemaError:
    text = str(exc)
    path: str | None = None
    match = _PATH_RE.search(text)
    if match:
        path = match.group("path")
        text = text[: match.start()]
    missing = _MISSING_RE.search(text)
    if missing:
        path = f"{path or '$'}.{missing.group('field')}"
    where = f" at {path}" if path else ""
    return SchemaError(f"invalid {kind}{where}: {text}", path=path, kind=kind)


def convert(obj: Any, type_: type[T]) -> T:
    """Validate already-decoded builtins (a dict from YAML, say) into ``type_``."""
    try:
        return msgspec.convert(obj, type_)
    except msgspec.ValidationError as exc:
        raise schema_error(exc, type_.__name__) from exc
