"""msgspec wire types and their JSON codec; the contract between processes and languages."""

from robot_lab.schemas.codec import (
    SCHEMA_TYPES,
    decode,
    decode_message,
    encode,
    encode_message,
    json_schema,
    schema_text,
)
from robot_lab.schemas.ids import new_id, uuid7
from robot_lab.schemas.validation import convert
from robot_lab.schemas.messages import (
    ENVELOPE_VERSION,
    RUN_EVENT_NAMES,
    MemoryChange,
    Message,
    ResultFile,
    RobotMessage,
    RobotResult,
    RobotSpec,
    RunConfigData,
    RunEvent,
    TextMessage,
    ToolCall,
    ToolCallMessage,
    ToolResultMessage,
    utcnow,
)

__all__ = [
    "ENVELOPE_VERSION",
    "RUN_EVENT_NAMES",
    "SCHEMA_TYPES",
    "MemoryChange",
    "Message",
    "ResultFile",
    "RobotMessage",
    "RobotResult",
    "RobotSpec",
    "RunConfigData",
    "RunEvent",
    "TextMessage",
    "ToolCall",
    "ToolCallMessage",
    "ToolResultMessage",
    "convert",
    "decode",
    "decode_message",
    "encode",
    "encode_message",
    "json_schema",
    "new_id",
    "schema_text",
    "utcnow",
    "uuid7",
]
