"""The offline scripted model: deterministic replies, tool calls, routes, sleeps and token
counts, with no network, as ``model="scripted/<behaviour>"``. The gateway answers it
directly, in litellm's response shape, without importing litellm; when a litellm callback is
registered it goes through litellm's custom-provider seam instead, so the callbacks see it
(docs/scripted-model.md, "Without litellm"). Either way the robot, the tool loop, streaming
and usage accounting run exactly as with a real provider.

Behaviours (the part after ``scripted/``):

* ``echo`` (default): like pydantic-ai's TestModel. With tools offered it calls each tool
  once, with arguments generated from the tool's JSON schema, then answers with a text that
  includes the tool results. Without tools it answers ``echo: <last user message>``.
* ``text:<reply>``: always answer ``<reply>`` (no tool calls).
* ``sleep:<ms>``: sleep that long on every call, then behave like ``echo``.
* ``route:<name>[,<name>...]``: pick those routes through the first offered tool that
  looks like a router (name starts with ``route`` or a parameter has an ``enum``), then
  answer ``routed to <names>``; with no such tool, answer ``ROUTE: <names>``.
* ``loop[:<tool>]``: call that tool (default: the first offered) forever; meant for the
  loop guards (``max_tool_rounds``, the doom-loop detector).
* ``fail[:<message>]``: raise a provider error (retryable), for retry tests.
* ``<name>``: a script registered in-process with :func:`register_script`, or a YAML/JSON
  script file: ``scripted/path/to/script.yml`` (relative to the working directory or to
  ``ROBOT_LAB_SCRIPTS_DIR``), so worker processes load the same script.

Script files hold ``rules`` (first match on the last user message wins) or ``turns`` (the
N-th model call of a run gets step N; the last step repeats). A step may say ``reply``
(``{message}`` and ``{tool_results}`` are filled in), ``tool_calls`` (list of
``{name, arguments}``), ``call_tools: all``, ``route``, ``sleep_ms``, ``error``. See
docs/scripted-model.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_lab.errors import ConfigurationError

PROVIDER = "scripted"


@dataclass
class ToolCallPlan:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Decision:
    """What the scripted model answers to one call."""

    text: str = ""
    tool_calls: list[ToolCallPlan] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    delay: float = 0.0  # seconds still to sleep (decide(..., defer_sleep=True)) before answering


class ScriptedProviderError(Exception):
    """Raised by ``fail`` steps; the gateway treats it as a retryable provider error."""

    delay: float = 0.0  # seconds to sleep before raising, with decide(..., defer_sleep=True)


class _Sleeper:
    """The scripted model's latency: slept at once (the sync path), or only added up
    (``defer_sleep``) so that the async provider sleeps it with ``asyncio.sleep`` and an
    event loop keeps serving other runs meanwhile."""

    __slots__ = ("defer", "total")

    def __init__(self, defer: bool) -> None:
        self.defer = defer
        self.total = 0.0

    def __call__(self, seconds: float) -> None:
        if self.defer:
            self.total += seconds
        elif seconds > 0:
            time.sleep(seconds)


@dataclass
class Step:
    reply: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    call_tools: str | list[str] | None = None
    route: str | list[str] | None = None
    sleep_ms: float = 0
    error: str | None = None
    behaviour: str | None = None  # delegate to a built-in behaviour, e.g. "echo"


@dataclass
class Rule:
    step: Step
    contains: str | None = None
    regex: str | None = None

    def matches(self, message: str) -> bool:
        if self.contains is not None and self.contains.lower() not in message.lower():
            return False
        if self.regex is not None and not re.search(self.regex, message, re.I | re.S):
            return False
        return True


@dataclass
class Script:
    rules: list[Rule] = field(default_factory=list)
    turns: list[Step] = field(default_factory=list)
    default: Step = field(default_factory=lambda: Step(behaviour="echo"))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<script>") -> Script:
        if not isinstance(data, dict):
            raise ConfigurationError(f"scripted model script {source}: expected a mapping at top level")
        unknown = set(data) - {"rules", "turns", "default"}
        if unknown:
            raise ConfigurationError(f"scripted model script {source}: unknown keys {sorted(unknown)}")
        rules = []
        for i, raw in enumerate(data.get("rules") or []):
            when = raw.get("when") or {}
            rules.append(
                Rule(step=_step(raw, f"{source} rules[{i}]"), contains=when.get("contains"), regex=when.get("regex"))
            )
        turns = [_step(raw, f"{source} turns[{i}]") for i, raw in enumerate(data.get("turns") or [])]
        default = _step(data["default"], f"{source} default") if data.get("default") else Step(behaviour="echo")
        return cls(rules=rules, turns=turns, default=default)


_STEP_KEYS = {"reply", "tool_calls", "call_tools", "route", "sleep_ms", "error", "behaviour", "when"}


def _step(raw: dict[str, Any], where: str) -> Step:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"scripted model script {where}: expected a mapping")
    unknown = set(raw) - _STEP_KEYS
    if unknown:
        raise ConfigurationError(f"scripted model script {where}: unknown keys {sorted(unknown)}")
    return Step(**{k: v for k, v in raw.items() if k != "when"})


_registry: dict[str, Script] = {}
_registry_lock = threading.Lock()


def register_script(name: str, script: Script | dict[str, Any]) -> None:
    """Make ``scripted/<name>`` answer with this script in this process."""
    if isinstance(script, dict):
        script = Script.from_dict(script, source=name)
    with _registry_lock:
        _registry[name] = script


_families: dict[str, Any] = {}


def register_script_family(prefix: str, factory: Any) -> None:
    """Make every ``scripted/<prefix>...`` name answer with ``factory(name)`` (a script dict,
    or None for "no such script"), built on first use. Lets a script carry a parameter in
    its name -- the demo's ``demo-billing@250`` is the billing script with 250 ms delays --
    so a run can choose it and every worker that imported the family builds the same one."""
    with _registry_lock:
        _families[prefix] = factory


def unregister_script(name: str) -> None:
    with _registry_lock:
        _registry.pop(name, None)


def _script_places(name: str) -> list[Path]:
    """Where a script file of ``name`` is looked for: the working directory, then
    ``ROBOT_LAB_SCRIPTS_DIR``."""
    candidates = [Path(name)]
    base = os.environ.get("ROBOT_LAB_SCRIPTS_DIR")
    if base:
        candidates.append(Path(base) / name)
    return candidates


def _load_script_file(name: str) -> Script | None:
    for path in _script_places(name):
        for candidate in (path, path.with_suffix(".yml"), path.with_suffix(".yaml"), path.with_suffix(".json")):
            if candidate.is_file():
                import yaml  # lazy: start-up time (only a script file needs it)

                try:
                    data = yaml.safe_load(candidate.read_text())
                except yaml.YAMLError as exc:
                    raise ConfigurationError(f"scripted model script {candidate}: invalid YAML: {exc}") from exc
                return Script.from_dict(data, source=str(candidate))
    return None


# ----------------------------------------------------------------------------------------
# Helpers on OpenAI-style messages and tools


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def last_user_message(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _current_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages after the last user message: this run's tool calls and results."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return messages[index + 1 :]
    return list(messages)


def _tool_results(turn: list[dict[str, Any]]) -> list[tuple[str, str]]:
    names: dict[str, str] = {}
    for message in turn:
        for call in message.get("tool_calls") or []:
            names[call.get("id", "")] = call.get("function", {}).get("name", "")
    return [
        (names.get(m.get("tool_call_id", ""), m.get("name", "tool")), _text_of(m.get("content")))
        for m in turn
        if m.get("role") == "tool"
    ]


def _called_names(turn: list[dict[str, Any]]) -> list[str]:
    return [
        call.get("function", {}).get("name", "")
        for message in turn
        for call in (message.get("tool_calls") or [])
    ]


def _tool_name(tool: dict[str, Any]) -> str:
    return tool.get("function", {}).get("name", "")


def example_value(schema: dict[str, Any]) -> Any:
    """A deterministic value that satisfies a JSON schema (TestModel-style)."""
    if not isinstance(schema, dict):
        return "a"
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return example_value(options[0])
    if schema.get("allOf"):
        return example_value(schema["allOf"][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        count = int(schema.get("minItems", 1))
        return [example_value(schema.get("items", {})) for _ in range(max(count, 1))]
    if kind == "object" or "properties" in schema:
        return example_arguments(schema)
    return "a"


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    return {name: example_value(prop) for name, prop in properties.items()}


def estimate_tokens(text: str) -> int:
    """The Ruby gem's estimate: characters / 4, at least 1 for non-empty text."""
    return max(1, math.ceil(len(text) / 4)) if text else 0


def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """The prompt tokens the scripted model reports for a call (what a budget reserves)."""
    text = "".join(_text_of(m.get("content")) for m in messages)
    text += "".join(json.dumps(m.get("tool_calls")) for m in messages if m.get("tool_calls"))
    text += "".join(json.dumps(t) for t in tools)
    return estimate_tokens(text)


# ----------------------------------------------------------------------------------------
# Behaviours


def _echo(messages: list[dict[str, Any]], tools: list[dict[str, Any]], only: list[str] | None = None) -> Decision:
    turn = _current_turn(messages)
    called = set(_called_names(turn))
    offered = [t for t in tools if only is None or _tool_name(t) in only]
    pending = [t for t in offered if _tool_name(t) not in called]
    if pending:
        return Decision(
            tool_calls=[
                ToolCallPlan(_tool_name(t), example_arguments(t.get("function", {}).get("parameters") or {}))
                for t in pending
            ]
        )
    text = f"echo: {last_user_message(messages)}"
    results = _tool_results(turn)
    if results:
        text += "\nTool results:\n" + "\n".join(f"- {name}: {out}" for name, out in results)
    return Decision(text=text)


def _router_tool(tools: list[dict[str, Any]]) -> tuple[str, str | None, dict[str, Any]] | None:
    """The first tool that looks like a router, and the parameter that takes the choice."""
    for tool in tools:
        name = _tool_name(tool)
        params = tool.get("function", {}).get("parameters") or {}
        properties = params.get("properties") or {}
        for pname, prop in properties.items():
            items = prop.get("items", {}) if prop.get("type") == "array" else {}
            if prop.get("enum") or items.get("enum"):
                return name, pname, params
        if name.lower().startswith("route"):
            return name, next(iter(properties), None), params
    return None


def _route(messages: list[dict[str, Any]], tools: list[dict[str, Any]], routes: list[str]) -> Decision:
    turn = _current_turn(messages)
    router = _router_tool(tools)
    if router is None:
        return Decision(text=f"ROUTE: {', '.join(routes)}")
    name, param, params = router
    if name in _called_names(turn):
        return Decision(text=f"routed to {', '.join(routes)}")
    arguments = example_arguments(params)
    if param is not None:
        prop = (params.get("properties") or {}).get(param, {})
        arguments[param] = routes if prop.get("type") == "array" else routes[0]
    return Decision(tool_calls=[ToolCallPlan(name, arguments)])


def _loop(tools: list[dict[str, Any]], tool: str | None) -> Decision:
    if not tools:
        return Decision(text="loop: no tools offered")
    chosen = next((t for t in tools if _tool_name(t) == tool), None) if tool else tools[0]
    if chosen is None:
        return Decision(text=f"loop: tool {tool!r} not offered")
    return Decision(
        tool_calls=[
            ToolCallPlan(_tool_name(chosen), example_arguments(chosen.get("function", {}).get("parameters") or {}))
        ]
    )


def _builtin(
    behaviour: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sleep: _Sleeper
) -> Decision | None:
    head, _, arg = behaviour.partition(":")
    if head == "echo":
        return _echo(messages, tools)
    if head == "text":
        return Decision(text=arg)
    if head == "sleep":
        sleep(float(arg or 0) / 1000)
        return _echo(messages, tools)
    if head == "route":
        return _route(messages, tools, [r.strip() for r in arg.split(",") if r.strip()])
    if head == "loop":
        return _loop(tools, arg or None)
    if head == "fail":
        raise ScriptedProviderError(arg or "scripted failure")
    return None


def _run_step(
    step: Step, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sleep: _Sleeper, *,
    turn_based: bool = False,
) -> Decision:
    """In rules mode a step's tool calls happen once per run; in turns mode every time."""
    if step.sleep_ms:
        sleep(float(step.sleep_ms) / 1000)
    if step.error:
        raise ScriptedProviderError(step.error)
    if step.behaviour:
        decision = _builtin(step.behaviour, messages, tools, sleep)
        if decision is None:
            raise ConfigurationError(f"scripted model: unknown behaviour {step.behaviour!r}")
        return decision
    turn = _current_turn(messages)
    fresh = turn_based or not _called_names(turn)
    if step.route:
        routes = [step.route] if isinstance(step.route, str) else list(step.route)
        return _route(messages, tools, routes)
    if step.call_tools and fresh:
        only = None if step.call_tools == "all" else list(step.call_tools)
        decision = _echo(messages, tools, only=only)
        if decision.tool_calls:
            return decision
    if step.tool_calls and fresh:
        return Decision(
            tool_calls=[ToolCallPlan(c["name"], dict(c.get("arguments") or {})) for c in step.tool_calls]
        )
    results = _tool_results(turn)
    reply = step.reply if step.reply is not None else f"echo: {last_user_message(messages)}"
    tool_text = "\n".join(f"- {n}: {o}" for n, o in results)
    text = reply.replace("{message}", last_user_message(messages)).replace("{tool_results}", tool_text)
    return Decision(text=text)


def _script_for(name: str) -> Script | None:
    with _registry_lock:
        script = _registry.get(name)
        family = next((f for prefix, f in _families.items() if name.startswith(prefix)), None)
    if script is None and family is not None:
        data = family(name)
        if data is not None:
            register_script(name, data)
            return _registry[name]
    return script or _load_script_file(name)


def decide(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
    defer_sleep: bool = False,
) -> Decision:
    """The scripted model's answer for ``model`` (with or without the ``scripted/`` prefix).

    ``defer_sleep=True`` sleeps nothing: the latency of ``sleep:`` / ``sleep_ms`` is returned
    in ``Decision.delay`` (or ``ScriptedProviderError.delay``) for the caller to await."""
    sleep = _Sleeper(defer_sleep)
    try:
        decision = _decide(model, messages, tools or [], sleep)
    except ScriptedProviderError as exc:
        exc.delay = sleep.total
        raise
    decision.delay = sleep.total
    return decision


def _decide(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sleep: _Sleeper) -> Decision:
    name = model.split("/", 1)[1] if model.startswith(f"{PROVIDER}/") else model
    name = name or "echo"
    decision = _builtin(name, messages, tools, sleep)
    if decision is None:
        script = _script_for(name)
        if script is None:
            looked = ", ".join(f"{p.resolve()}[.yml|.yaml|.json]" for p in _script_places(name))
            unset = "" if os.environ.get("ROBOT_LAB_SCRIPTS_DIR") else "; ROBOT_LAB_SCRIPTS_DIR is not set"
            raise ConfigurationError(
                f"scripted model {name!r}: not a built-in behaviour (echo, text:, sleep:, route:, loop, fail), "
                f"not a registered script and no such script file (looked for {looked}{unset})"
            )
        message = last_user_message(messages)
        step = next((r.step for r in script.rules if r.matches(message)), None)
        turn_based = False
        if step is None and script.turns:
            calls_so_far = sum(1 for m in _current_turn(messages) if m.get("role") == "assistant")
            step = script.turns[min(calls_so_far, len(script.turns) - 1)]
            turn_based = calls_so_far < len(script.turns)
        decision = _run_step(step or script.default, messages, tools, sleep, turn_based=turn_based)
    for index, call in enumerate(decision.tool_calls):
        if not call.id:
            call.id = f"call_{len(messages)}_{index}"
    decision.prompt_tokens = prompt_tokens(messages, tools)
    decision.completion_tokens = estimate_tokens(
        decision.text + "".join(c.name + json.dumps(c.arguments) for c in decision.tool_calls)
    )
    return decision


def stream_pieces(text: str) -> list[str]:
    """How a scripted reply is cut into streaming chunks: word by word, spaces kept."""
    return re.findall(r"\S+\s*|\s+", text) or ([text] if text else [])
