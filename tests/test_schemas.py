"""Wire schemas: round trips, unknown fields kept, clear errors with JSON paths, JSON Schema."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from robot_lab.errors import SchemaError
from robot_lab.schemas import (
    MemoryChange,
    RobotMessage,
    RobotResult,
    RobotSpec,
    RunEvent,
    TextMessage,
    ToolCall,
    ToolCallMessage,
    ToolResultMessage,
    decode,
    decode_message,
    encode,
    json_schema,
    new_id,
)
from robot_lab.schemas.codec import shipped_schema_text, schema_text

HAND_WRITTEN = {
    "v": 1,
    "id": "order-42",
    "kind": "message",
    "from": "shop",
    "to": "billing",
    "content": {"order": 42, "amount": "19.99"},
    "conversation_id": "c-1",
    "created_at": "2026-11-30T10:00:00Z",
    "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
}


def test_envelope_round_trip_keeps_every_field() -> None:
    message = RobotMessage(to="billing", content={"a": 1}, from_="shop", reply_to="shop", conversation_id="c")
    again = decode(encode(message), RobotMessage)
    assert again == message
    assert json.loads(encode(message))["from"] == "shop"


def test_unknown_fields_are_kept_and_written_back() -> None:
    data = dict(HAND_WRITTEN, x_priority="high", trace={"hop": 2})
    message = decode_message(json.dumps(data))
    assert message.extensions == {"x_priority": "high", "trace": {"hop": 2}}
    assert json.loads(encode(message))["x_priority"] == "high"


def test_missing_to_names_the_field() -> None:
    with pytest.raises(SchemaError) as info:
        decode_message(json.dumps({"id": "x", "content": "hi"}))
    assert info.value.path == "$.to"
    assert "`to`" in str(info.value)


def test_wrong_type_carries_msgspec_path() -> None:
    with pytest.raises(SchemaError) as info:
        decode_message(json.dumps(dict(HAND_WRITTEN, id=7)))
    assert info.value.path == "$.id"
    with pytest.raises(SchemaError) as info:
        decode_message(json.dumps(dict(HAND_WRITTEN, headers={"traceparent": 1})))
    assert info.value.path == "$.headers[...]"  # msgspec's path for a map value


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"text"', b"", b"\xff\xfe"])
def test_malformed_input_is_a_schema_error(raw: bytes) -> None:
    with pytest.raises(SchemaError):
        decode_message(raw)


def test_ids_are_unique_and_time_sortable() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)


def test_robot_result_reply_export_and_from_dict() -> None:
    call = ToolCall(id="c1", name="add", input={"a": 1})
    result = RobotResult(
        robot_name="calc",
        output=[
            ToolCallMessage(tools=[call]),
            ToolResultMessage(tool=call, content={"data": "3"}),
            TextMessage(content="it is 3"),
        ],
        input_tokens=10,
        output_tokens=0,
    )
    exported = result.export()
    assert "output_tokens" not in exported  # zero token counts are left out
    assert [m["type"] for m in exported["output"]] == ["tool_call", "tool_result", "text"]
    again = RobotResult.from_dict(json.loads(json.dumps(exported)))
    assert again.reply == "it is 3"
    assert again == result


def test_error_result_text_matches_robot_lab() -> None:
    result = RobotResult.from_error("billing", ValueError("boom"))
    assert result.reply == "Error: ValueError: boom"
    assert result.failed


def test_other_types_round_trip() -> None:
    for value in (
        RunEvent(run_id="r", event="task.started", seq=3, task="t", data={"x": 1}),
        MemoryChange(key="k", scope="run:1", version=2, value={"v": 1}, previous=None, writer="w"),
        RobotSpec(name="billing", local_tools=["pkg.mod:fn"]),
    ):
        assert decode(encode(value), type(value)) == value


def test_json_schema_validates_hand_written_envelope_and_rejects_wrong_type() -> None:
    schema = json_schema("robot-message")
    jsonschema.validate(HAND_WRITTEN, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(HAND_WRITTEN, to=5), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in HAND_WRITTEN.items() if k != "to"}, schema)


def test_shipped_schema_file_is_current() -> None:
    assert json.loads(shipped_schema_text("robot-message")) == json.loads(schema_text("robot-message"))


def test_schema_cli_prints_a_schema_that_validates() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "robot_lab", "schema", "robot-message"], capture_output=True, text=True, check=True
    ).stdout
    schema = json.loads(out)
    jsonschema.validate(HAND_WRITTEN, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(HAND_WRITTEN, content=[1, 2]), schema)


def test_unknown_schema_name_is_a_clear_error() -> None:
    with pytest.raises(SchemaError, match="unknown schema 'nope'"):
        json_schema("nope")
