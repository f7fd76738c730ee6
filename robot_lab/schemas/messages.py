"""Wire types: the RobotMessage envelope, robot results and their messages, run events,
memory changes and robot specs.

All structs use ``gc=False`` (they hold no reference cycles) and encode to plain JSON, so any
language can read and write them; the JSON Schema of each is exported by :mod:`.codec`.
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, Literal

import msgspec

from robot_lab.schemas.ids import new_id
from robot_lab.schemas.validation import convert

ENVELOPE_VERSION = 1


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


Content = str | dict[str, Any]


def _doc(description: str, *examples: Any) -> msgspec.Meta:
    """Field documentation that ends up in the JSON Schema (``robot-lab schema``), which is
    all a Node or Go developer reads: say what the field means and show a value."""
    return msgspec.Meta(description=description, examples=list(examples) if examples else None)


# The fields of RobotMessage that hold an RFC 3339 date-time (the schema adds format + pattern).
DATE_TIME_FIELDS = ("created_at", "deadline")


class RobotMessage(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Envelope v1: one entry on a robot's inbox stream (field ``envelope`` of the entry).

    Unknown top-level fields are kept in ``extensions`` by :func:`decode_message` and
    written back by :func:`encode_message`, so an envelope from a newer peer survives a hop
    through an older worker.
    """

    to: Annotated[str, _doc(
        "Name of the robot this message is for; the entry goes on its inbox stream "
        "<prefix>:bus:<to> (default prefix robot_lab).", "billing")]
    content: Annotated[Content, _doc(
        "The message itself: text, or a JSON object for structured input.",
        "My invoice is wrong", {"order_id": "A-1001", "question": "Where is my parcel?"})]
    id: Annotated[str, _doc(
        "Unique id of this message, chosen by the sender (robot-lab makes a UUIDv7). Replies name it "
        "in in_reply_to, and a redelivered id is answered once. Without one the worker uses "
        "<robot>/<stream entry id>.", "01935c5e-8b1a-7c3e-9f00-2a4b6c8d0e1f", "node-0001")] = \
        msgspec.field(default_factory=new_id)
    v: Annotated[int, _doc("Envelope version: 1.", 1)] = ENVELOPE_VERSION
    kind: Annotated[str, _doc(
        "\"message\" for a request or notice (what you send); \"reply\" for an answer to in_reply_to; "
        "\"error\" when a robot gave up on in_reply_to (header \"error\" holds the reason, content "
        "the text); \"input_required\" when a robot asks a person before it can answer in_reply_to "
        "(content: request_id, question, kind, choices, default, tool, arguments); \"answer\" for "
        "the answer to one (in_reply_to = its request_id; content: the text, or {text, approved}).",
        "message", "reply", "error", "input_required", "answer")] = "message"
    from_: Annotated[str, _doc(
        "Name of the sender: a robot or any client name. A reply goes here when reply_to is not set.",
        "frontdesk")] = msgspec.field(default="anonymous", name="from")
    in_reply_to: Annotated[str | None, _doc(
        "On a reply or error: the id of the message it answers.",
        "node-0001")] = None
    reply_to: Annotated[str | None, _doc(
        "Name of the inbox the reply goes to: it is appended to the stream <prefix>:bus:<reply_to>, "
        "which is created (with a TTL) if missing, so a client can pick any name and XREAD it. "
        "Defaults to from.", "frontdesk")] = None
    conversation_id: Annotated[str | None, _doc(
        "Groups the messages of one conversation: they are handled one at a time, in stream order, "
        "and the robot keeps their history under this id. Copied onto the reply.", "ticket-42")] = None
    correlation_id: Annotated[str | None, _doc(
        "Any id of the sender's own, copied unchanged onto the reply (to match replies to requests).",
        "order-A-1001")] = None
    created_at: Annotated[_dt.datetime, _doc(
        "When the sender made the message: an RFC 3339 date-time with a timezone (Z or +hh:mm), "
        "as JavaScript's new Date().toISOString() writes it.",
        "2026-05-01T12:00:00.000Z")] = msgspec.field(default_factory=utcnow)
    deadline: Annotated[_dt.datetime | None, _doc(
        "Optional RFC 3339 date-time with a timezone. Not handled after it: the message is "
        "dead-lettered as expired, and an error envelope goes to reply_to.",
        "2026-05-01T12:05:00Z")] = None
    headers: Annotated[dict[str, str], _doc(
        "String metadata: W3C trace context (traceparent, tracestate) is carried onto replies; "
        "an error envelope has \"error\" = the reason; a signed envelope has \"key_id\" = the id of "
        "the sender's key that signed it. Your own keys are kept.",
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})] = \
        msgspec.field(default_factory=dict)
    signature: Annotated[str | None, _doc(
        "Lowercase hex HMAC-SHA256, with the sender's key named by headers.key_id, of the RFC 8785 "
        "(JCS) canonical JSON of this envelope without its signature member (docs/security.md). "
        "Checked by robots whose signing mode is warn or require.",
        "f1c2d0e8b3a94c7d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5")] = None
    extensions: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def key(self) -> str:
        """The Ruby gem's message key ``"from:id"``."""
        return f"{self.from_}:{self.id}"

    @property
    def is_reply(self) -> bool:
        return self.kind == "reply" or self.in_reply_to is not None

    def expired(self, now: _dt.datetime | None = None) -> bool:
        return self.deadline is not None and (now or utcnow()) > self.deadline


class ToolCall(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One tool invocation asked for by the model (the Ruby gem's ``ToolMessage``)."""

    id: str
    name: str
    input: dict[str, Any] = msgspec.field(default_factory=dict)


class TextMessage(msgspec.Struct, tag_field="type", tag="text", kw_only=True, omit_defaults=True, gc=False):
    role: Literal["system", "user", "assistant", "tool_result"] = "assistant"
    content: str = ""
    # "length": the reply was cut at max_tokens; "content_filter": the provider withheld it
    stop_reason: Literal["tool", "stop", "length", "content_filter"] | None = None


class ToolCallMessage(
    msgspec.Struct, tag_field="type", tag="tool_call", kw_only=True, omit_defaults=True, gc=False
):
    tools: list[ToolCall]
    role: Literal["assistant"] = "assistant"
    content: str = ""
    stop_reason: Literal["tool", "stop"] | None = "tool"


class ToolResultMessage(
    msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True, omit_defaults=True, gc=False
):
    """``content`` is ``{"data": ...}`` on success, ``{"error": "..."}`` on failure."""

    tool: ToolCall
    content: dict[str, Any]
    role: Literal["tool_result"] = "tool_result"
    stop_reason: Literal["tool", "stop"] | None = None

    @property
    def success(self) -> bool:
        return "error" not in self.content

    @property
    def data(self) -> Any:
        return self.content.get("data")

    @property
    def error(self) -> Any:
        return self.content.get("error")


Message = TextMessage | ToolCallMessage | ToolResultMessage


class ResultFile(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A file a run wrote or changed in its workspace (``path`` relative to it)."""

    path: str
    size: int
    sha256: str
    media_type: str = "application/octet-stream"


class RobotResult(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """What one robot run produced. ``error`` is set when the run failed inside a network
    (robot_lab turns the exception into a result whose text is ``"Error: Class: msg"``)."""

    robot_name: str
    output: list[Message] = msgspec.field(default_factory=list)
    tool_calls: list[ToolResultMessage] = msgspec.field(default_factory=list)
    id: str = msgspec.field(default_factory=new_id)
    created_at: _dt.datetime = msgspec.field(default_factory=utcnow)
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    duration: float | None = None
    delegated_by: str | None = None
    error: str | None = None
    activate: list[str] = msgspec.field(default_factory=list)
    # what the run wrote or changed in its skills workspace, and that folder (on the host
    # that ran it: replies carry the bytes, see robot_lab.bus.reply_files)
    files: list[ResultFile] = msgspec.field(default_factory=list)
    workspace: str | None = None

    @property
    def reply(self) -> str | None:
        """The last text message's content (the Ruby gem's ``last_text_content``)."""
        for message in reversed(self.output):
            if isinstance(message, TextMessage) and message.content:
                return message.content
        return None

    last_text_content = reply

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def failed(self) -> bool:
        return self.error is not None

    def export(self) -> dict[str, Any]:
        """The serializable form (zero token counts and unset fields left out)."""
        return msgspec.to_builtins(self)

    to_dict = export

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RobotResult:
        return convert(data, cls)

    @classmethod
    def from_error(cls, robot_name: str, error: BaseException) -> RobotResult:
        text = f"Error: {type(error).__name__}: {error}"
        return cls(robot_name=robot_name, output=[TextMessage(content=text)], error=text, stop_reason="error")


RUN_EVENT_NAMES: tuple[str, ...] = (
    # robot_lab Streaming::Events
    "run.started", "run.completed", "run.failed", "run.interrupted",
    "step.started", "step.completed", "step.failed",
    "part.created", "part.completed", "part.failed",
    "text.delta", "tool_call.arguments.delta", "tool_call.output.delta", "reasoning.delta",
    "data.delta", "hitl.requested", "hitl.resolved", "usage.updated", "metadata.updated",
    "stream.ended",
    # additions for distributed networks
    "task.queued", "task.started", "task.completed", "task.failed", "task.skipped",
    "task.retrying", "tool_call.started", "tool_call.completed", "run.cancelled", "memory.changed",
    "task.rerun",
)


class RunEvent(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One entry of a run's event stream; ``seq`` is monotonic per run."""

    run_id: str
    event: str
    seq: int = 0
    ts: float = 0.0
    task: str | None = None
    robot: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class MemoryChange(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A write to shared memory. ``op`` is ``set``, ``deleted`` or ``cleared``."""

    key: str
    scope: str
    version: int
    op: Literal["set", "deleted", "cleared"] = "set"
    value: Any = None
    previous: Any = None
    writer: str | None = None
    network_name: str | None = None
    timestamp: float = 0.0

    # the Ruby gem's MemoryChange predicates (created?, updated?, deleted?).
    @property
    def created(self) -> bool:
        return self.op == "set" and self.previous is None and self.value is not None

    @property
    def updated(self) -> bool:
        return self.op == "set" and self.previous is not None and self.value is not None

    @property
    def deleted(self) -> bool:
        return self.op == "deleted" or (self.value is None and self.previous is not None)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


class RunConfigData(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The serializable part of a RunConfig (callbacks, bus and procs never cross processes)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | str | None = None
    api_base: str | None = None
    api_key_env: str | None = None  # the variable holding the key, read where the call is made
    mcp: str | list[str] | None = None
    tools: str | list[str] | None = None
    enable_cache: bool | None = None
    max_tool_rounds: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None
    max_concurrent_robots: int | None = None
    doom_loop_threshold: int | None = None
    auto_compact: str | None = None
    compact_threshold: float | None = None
    max_tools: int | None = None
    input_timeout: float | None = None


class RobotSpec(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A robot as data: everything a worker needs to build it (tools by import path)."""

    name: str
    description: str | None = None
    model: str | None = None
    provider: str | None = None
    system_prompt: str | None = None
    template: str | None = None
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    local_tools: list[str] = msgspec.field(default_factory=list)
    skills: list[str] = msgspec.field(default_factory=list)
    mcp_servers: list[dict[str, Any]] = msgspec.field(default_factory=list)
    config: RunConfigData = msgspec.field(default_factory=RunConfigData)
    hooks: list[str] = msgspec.field(default_factory=list)
    # AgentSkills: "match" (embedding matching per run) or "tool" (a Skill tool activates one)
    skill_mode: str = "match"
    mcp_discovery: bool = False
    template_dirs: list[str] | None = None
    # The serving policy (bus, delegation, spawn): what a served run offers.
    serve_tools: str | list[str] = "inherit"
    serve_mcp: str | list[str] = "inherit"
    # remote Agent2Agent agents offered as tools: card URLs or {url, name, description, token_env, timeout}
    a2a_agents: list[str | dict[str, Any]] = msgspec.field(default_factory=list)
