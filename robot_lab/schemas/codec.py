"""JSON encode/decode for the wire types, with one error type for bad input.

msgspec reports where validation failed as a JSON path (``$.headers.traceparent``); we keep
that path on :class:`SchemaError` so a dead-letter entry or a CLI message can name the field.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import msgspec

from robot_lab.errors import SchemaError
from robot_lab.schemas.messages import (
    DATE_TIME_FIELDS,
    MemoryChange,
    RobotMessage,
    RobotResult,
    RobotSpec,
    RunConfigData,
    RunEvent,
)
from robot_lab.schemas.validation import T
from robot_lab.schemas.validation import schema_error as _schema_error

_encoder = msgspec.json.Encoder()
_ENVELOPE_FIELDS = frozenset(
    (f.encode_name for f in msgspec.structs.fields(RobotMessage) if f.name != "extensions")
)

SCHEMA_TYPES: dict[str, type] = {
    "robot-message": RobotMessage,
    "robot-result": RobotResult,
    "robot-spec": RobotSpec,
    "run-config": RunConfigData,
    "run-event": RunEvent,
    "memory-change": MemoryChange,
}


def encode(obj: Any) -> bytes:
    """JSON bytes of a wire struct (or any msgspec-encodable value)."""
    if isinstance(obj, RobotMessage):
        return encode_message(obj)
    try:
        return _encoder.encode(obj)
    except (TypeError, msgspec.EncodeError) as exc:
        raise SchemaError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def decode(data: bytes | str, type_: type[T]) -> T:
    """Decode JSON into ``type_``; any problem raises :class:`SchemaError` with its path."""
    if type_ is RobotMessage:
        return decode_message(data)  # type: ignore[return-value]
    try:
        return msgspec.json.decode(data, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise _schema_error(exc, type_.__name__) from exc


def encode_message(message: RobotMessage) -> bytes:
    """Envelope JSON with any ``extensions`` written back at top level."""
    if not message.extensions:
        return _encoder.encode(message)
    body = msgspec.structs.replace(message, extensions={})
    data = msgspec.to_builtins(body)
    for key, value in message.extensions.items():
        data.setdefault(key, value)
    return _encoder.encode(data)


def decode_message(data: bytes | str) -> RobotMessage:
    """Decode an envelope, keeping unknown top-level fields in ``extensions``."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise _schema_error(exc, "RobotMessage") from exc
    if not isinstance(raw, dict):
        raise SchemaError(
            f"invalid RobotMessage at $: expected a JSON object, got {type(raw).__name__}",
            path="$",
            kind="RobotMessage",
        )
    extras = {k: v for k, v in raw.items() if k not in _ENVELOPE_FIELDS}
    for key in extras:
        raw.pop(key)
    if extras:
        raw["extensions"] = extras
    try:
        return msgspec.convert(raw, RobotMessage)
    except msgspec.ValidationError as exc:
        raise _schema_error(exc, "RobotMessage") from exc


# RFC 3339 date-time with a required offset. Also a `pattern`, not only `format`, because
# most validators (jsonschema, ajv) do not check `format` unless told to.
DATE_TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"

ENVELOPE_EXAMPLE = {
    "v": 1,
    "id": "node-0001",
    "to": "billing",
    "from": "frontdesk",
    "reply_to": "frontdesk",
    "conversation_id": "ticket-42",
    "created_at": "2026-05-01T12:00:00.000Z",
    "deadline": "2026-05-01T12:05:00.000Z",
    "content": "My invoice is wrong",
}


def _hoist_docs(prop: dict[str, Any]) -> None:
    """msgspec puts an optional field's description inside its ``anyOf`` branch; a reader
    looks for it on the property."""
    for branch in prop.get("anyOf", []):
        for key in ("description", "examples"):
            if key in branch:
                prop.setdefault(key, branch.pop(key))


def _document_envelope(definition: dict[str, Any]) -> None:
    definition["properties"].pop("extensions", None)
    definition["additionalProperties"] = True
    definition["description"] = (
        "robot-lab envelope v1: one message to a robot. Publish it as the field `envelope` of an "
        "entry on the robot's inbox stream: XADD robot_lab:bus:<to> * envelope '<this JSON>'. "
        "Only `to` and `content` are required. The reply (an envelope with kind \"reply\" and "
        "in_reply_to = your id) is appended to the stream robot_lab:bus:<reply_to>; read it with "
        "XREAD. Unknown fields are kept. robot_lab is the default key prefix (ROBOT_LAB_KEY_PREFIX)."
    )
    definition["examples"] = [ENVELOPE_EXAMPLE]
    for name, prop in definition["properties"].items():
        _hoist_docs(prop)
        if name in DATE_TIME_FIELDS:
            for branch in prop.get("anyOf", [prop]):
                if branch.get("type") == "string":
                    branch.update(format="date-time", pattern=DATE_TIME_PATTERN)


def _build_schema(type_: type) -> dict[str, Any]:
    schema = msgspec.json.schema(type_)
    if type_ is RobotMessage:
        _document_envelope(schema["$defs"]["RobotMessage"])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


@lru_cache(maxsize=None)
def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a wire type by its CLI name (``robot-message``, ...)."""
    try:
        type_ = SCHEMA_TYPES[name]
    except KeyError:
        known = ", ".join(sorted(SCHEMA_TYPES))
        raise SchemaError(f"unknown schema {name!r}; known: {known}") from None
    return _build_schema(type_)


def shipped_schema_text(name: str = "robot-message") -> str:
    """The schema file shipped inside the package (kept equal to :func:`json_schema` by a test)."""
    return resources.files("robot_lab.schemas").joinpath(f"{name}.schema.json").read_text()


def schema_text(name: str) -> str:
    return json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"
