"""Tools a robot can call: plain Python functions, ``Tool`` subclasses, or ``Tool.create``.

A plain function becomes a tool by its signature: each parameter needs a type hint that
pydantic can turn into JSON Schema (else a ConfigurationError names the parameter), and the
docstring gives the description and, from an ``Args:`` section, each parameter's text.
Arguments from the model are validated against the same pydantic model before the call.

Errors never escape to the model loop: robot_lab returns ``"Error (name): msg"`` text (with
`` (retryable)`` for a retryable ToolError) so the model can react.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, ClassVar, get_type_hints

import pydantic

from robot_lab.errors import ConfigurationError, InputRequired, InputTimeout, ToolError, ToolNotFoundError
from robot_lab.logging import get_logger
from robot_lab.observability import instrument as observe

if TYPE_CHECKING:
    from robot_lab.runtime.robot.named import NamedRobot

log = get_logger("robot_lab.tools")

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _camel_to_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Summary text and per-parameter descriptions from a Google/Sphinx style docstring."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    params: dict[str, str] = {}
    summary_lines: list[str] = []
    section = None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in {"args:", "arguments:", "parameters:", "params:"}:
            section = "args"
            continue
        if stripped.lower() in {"returns:", "return:", "raises:", "yields:", "example:", "examples:"}:
            section = "other"
            continue
        sphinx = re.match(r":param\s+(\w+):\s*(.*)", stripped)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2)
            continue
        if section == "args":
            match = re.match(r"(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
            if match:
                params[match.group(1)] = match.group(3)
            continue
        if section is None:
            summary_lines.append(line)
    return "\n".join(summary_lines).strip(), params


class Tool:
    """Base class of every tool. Subclasses set ``name``/``description``/``parameters``
    (a JSON Schema object) and implement :meth:`execute`."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    # the Ruby gem's class-level ``raise_on_error``: raise instead of returning error text.
    raise_on_error: ClassVar[bool] = False
    import_path: str | None = None
    # Human input (docs/durable.md): True, or a callable on the arguments, asks a person to
    # approve each call first; input_timeout bounds how long that (or ask_user) waits.
    requires_approval: Any = False
    input_timeout: float | None = None

    def __init__(self) -> None:
        if not self.name:
            self.name = _camel_to_snake(type(self).__name__)
        if not _NAME_RE.match(self.name):
            raise ConfigurationError(f"tool name {self.name!r} must match {_NAME_RE.pattern}")
        self.robot: NamedRobot | None = None

    # --- to override --------------------------------------------------------------------
    def execute(self, **arguments: Any) -> Any:
        raise NotImplementedError(f"tool {self.name!r} does not implement execute()")

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check the model's arguments; raise ToolError with a readable reason."""
        required = self.parameters.get("required") or []
        missing = [r for r in required if r not in arguments]
        if missing:
            raise ToolError(f"missing required argument(s): {', '.join(missing)}")
        return arguments

    # --- the call as the robot makes it -----------------------------------------------------
    @property
    def is_async(self) -> bool:
        """Whether :meth:`execute` is a coroutine function (then ``arun`` awaits it on the
        event loop, and ``run`` drives it with ``asyncio.run``)."""
        return inspect.iscoroutinefunction(self.execute)

    @observe.tool_call
    def call(self, arguments: dict[str, Any] | None = None) -> str:
        """Run the tool; failures come back as ``"Error (name): ..."`` text. An async tool
        runs on a fresh event loop (in a helper thread when this thread runs a loop)."""
        arguments = dict(arguments or {})
        try:
            result = self.execute(**self.validate(arguments))
            if inspect.isawaitable(result):
                result = run_awaitable(result)
        except (InputRequired, InputTimeout):
            raise  # a person must answer (or did not in time): not a tool error
        except Exception as exc:
            return self._error_text(exc)
        return format_result(result)

    @observe.tool_call
    async def acall(self, arguments: dict[str, Any] | None = None) -> str:
        """:meth:`call` for an async tool, awaited on the caller's event loop."""
        arguments = dict(arguments or {})
        try:
            result = self.execute(**self.validate(arguments))
            if inspect.isawaitable(result):
                result = await result
        except (InputRequired, InputTimeout):
            raise
        except Exception as exc:
            return self._error_text(exc)
        return format_result(result)

    def _error_text(self, exc: Exception) -> str:
        """A failure as the text the model sees (or re-raised with ``raise_on_error``); its
        ``tool.call`` span ends as failed either way."""
        if self.raise_on_error:
            raise exc
        observe.tool_failed(exc)
        if isinstance(exc, ToolError):
            suffix = " (retryable)" if exc.retryable else ""
            return f"Error ({self.name}): {exc}{suffix}"
        log.warning("tool.error", tool=self.name, error=f"{type(exc).__name__}: {exc}")
        return f"Error ({self.name}): {exc}"

    __call__ = call

    def to_json_schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.to_json_schema()}

    to_dict = to_json_schema

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"

    @classmethod
    def create(
        cls,
        name: str,
        fn: Callable[[dict[str, Any]], Any],
        *,
        description: str = "",
        parameters: dict[str, Any] | None = None,
    ) -> Tool:
        """An ad-hoc tool from a callable taking the arguments dict (the Ruby gem's ``Tool.create``)."""
        return _AdHocTool(name=name, fn=fn, description=description, parameters=parameters)


class _AdHocTool(Tool):
    def __init__(
        self, *, name: str, fn: Callable[[dict[str, Any]], Any], description: str, parameters: dict[str, Any] | None
    ) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters or {"type": "object", "properties": {}}
        self._fn = fn
        super().__init__()

    def execute(self, **arguments: Any) -> Any:
        return self._fn(arguments)


def run_awaitable(awaitable: Any) -> Any:
    """The result of an async tool called from sync code: ``asyncio.run`` here, or in a
    helper thread when this thread already runs an event loop (it cannot be re-entered)."""
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())

    with ThreadPoolExecutor(1, thread_name_prefix="robot-lab-async-tool") as pool:
        return pool.submit(asyncio.run, wait()).result()


class FunctionTool(Tool):
    """A tool built from a plain function's signature and docstring."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        summary, param_docs = _docstring_parts(fn.__doc__)
        self.description = description if description is not None else summary
        self._model = _arguments_model(fn, self.name, param_docs)
        schema = self._model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        self.parameters = schema
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        self.import_path = f"{module}:{qualname}" if module and "<" not in qualname else None
        super().__init__()

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            model = self._model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(f"invalid arguments: {problems}") from None
        return {field: getattr(model, field) for field in type(model).model_fields}

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def execute(self, **arguments: Any) -> Any:
        return self.fn(**arguments)


def _arguments_model(fn: Callable[..., Any], tool_name: str, docs: dict[str, str]) -> type[pydantic.BaseModel]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot read the signature: {exc}") from exc
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {pname!r} is *args/**kwargs; a tool needs named parameters"
            )
        if pname not in hints:
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {pname!r} has no type hint, so no JSON schema can be derived"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], pydantic.Field(default, description=docs.get(pname)))
    try:
        model = pydantic.create_model(f"{tool_name}_arguments", **fields)  # type: ignore[call-overload]
        model.model_json_schema()
    except Exception as exc:
        bad = _first_unschemable(hints, signature)
        where = f"parameter {bad!r}" if bad else "its parameters"
        raise ConfigurationError(
            f"tool {tool_name!r}: cannot derive a JSON schema for {where}: {str(exc).splitlines()[0]}"
        ) from exc
    return model


def _first_unschemable(hints: dict[str, Any], signature: inspect.Signature) -> str | None:
    for pname in signature.parameters:
        try:
            pydantic.TypeAdapter(hints[pname]).json_schema()
        except Exception:
            return pname
    return None


def format_result(result: Any) -> str:
    """Tool output as the text the model sees."""
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    if hasattr(result, "model_dump"):
        result = result.model_dump()
    try:
        return json.dumps(result, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         requires_approval: Any = False, input_timeout: float | None = None) -> Any:
    """Decorator: ``@tool`` or ``@tool(name=..., requires_approval=True)`` turns a function
    into a FunctionTool (``requires_approval``: True or a callable on the arguments)."""

    def make(f: Callable[..., Any]) -> FunctionTool:
        made = FunctionTool(f, name=name, description=description)
        made.requires_approval, made.input_timeout = requires_approval, input_timeout
        return made

    return make if fn is None else make(fn)


def import_object(path: str) -> Any:
    """Resolve ``"pkg.mod:attr"`` (or ``"pkg.mod.attr"``) with a clear error."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigurationError(f"import path {path!r} must look like 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {path!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"cannot import {path!r}: {module_name} has no attribute {attr!r}") from None
    return obj


def as_tool(obj: Any) -> Tool:
    """Normalise whatever a user passes in ``local_tools`` to a Tool instance."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, str):
        resolved = as_tool(import_object(obj))
        resolved.import_path = obj
        return resolved
    if isinstance(obj, type) and issubclass(obj, Tool):
        instance = obj()
        instance.import_path = f"{obj.__module__}:{obj.__qualname__}"
        return instance
    if all(hasattr(obj, a) for a in ("name", "description", "parameters", "call")):
        return _DuckTool(obj)  # skills' ScriptTool, MCP tools: same shape, other packages
    if callable(obj):
        return FunctionTool(obj)
    raise ConfigurationError(f"cannot use {obj!r} as a tool: pass a function, a Tool subclass or instance, or an import path")


class _DuckTool(Tool):
    """Adapter for tool-shaped objects from packages that cannot import the runtime."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters
        super().__init__()

    def execute(self, **arguments: Any) -> Any:
        return self.inner.call(arguments)


class ToolManifest:
    """A name-keyed, ordered collection of tools (the Ruby gem's ``ToolManifest``)."""

    def __init__(self, tools: Iterable[Any] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Any) -> Tool:
        t = as_tool(item)
        if t.name in self._tools and self._tools[t.name] is not t:
            log.warning("tool.replaced", tool=t.name)
        self._tools[t.name] = t
        return t

    def remove(self, name: str) -> Tool | None:
        return self._tools.pop(name, None)

    def fetch(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolNotFoundError(f"tool {name!r} not found; have: {', '.join(self._tools) or 'none'}") from None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def values(self) -> list[Tool]:
        return list(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def copy(self) -> ToolManifest:
        return ToolManifest(self._tools.values())
