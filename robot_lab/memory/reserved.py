"""The Ruby gem's reserved memory keys: ``data``, ``results``, ``messages``, ``session_id``.

They live in the same Redis hash as every other key (so one script keeps them atomic with
their change records), but read and validate as robot_lab defines them:

* ``data`` -- a dict, reached through :class:`DataProxy` for ``memory.data.category``
  style access; every proxy write is an optimistic ``update`` of the whole dict, so two
  processes setting different attributes don't overwrite each other.
* ``results`` -- a list of exported :class:`RobotResult` dicts; read back as fresh
  ``RobotResult`` objects (robot_lab returns a dup).
* ``messages`` -- a list of normalized messages (``TextMessage`` and friends).
* ``session_id`` -- a plain value.

Reserved keys always count as present (``key in memory`` is true, a wait on them returns at
once), are left out of ``keys()``, survive ``clear()`` and cannot be deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import msgspec

from robot_lab.errors import RobotLabError, SchemaError
from robot_lab.schemas import RobotResult
from robot_lab.schemas.messages import Message


class DataStore(Protocol):
    """What :class:`DataProxy` needs of a Memory: read a key, compare-and-set a key."""

    def get(self, *keys: str) -> Any: ...

    def update(self, key: str, fn: Callable[[Any], Any]) -> Any: ...

RESERVED_KEYS: tuple[str, ...] = ("data", "results", "messages", "session_id")


def reserved_default(key: str) -> Any:
    return {"data": {}, "results": [], "messages": [], "session_id": None}[key]


class MemoryValueError(SchemaError, TypeError):
    """A memory key or value that cannot be stored; the message names the key."""


class ReservedKeyError(RobotLabError, ValueError):
    """A reserved key (data, results, messages, session_id) was deleted."""


def _builtins(key: str, value: Any) -> Any:
    try:
        return msgspec.to_builtins(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise MemoryValueError(f"memory key {key!r}: {exc}", path=f"$.{key}", kind="memory") from exc


def normalize_message(item: Any) -> dict[str, Any]:
    """A message as a tagged dict; a bare ``{"role", "content"}`` dict becomes a text message."""
    data = _builtins("messages", item)
    if not isinstance(data, dict):
        raise MemoryValueError(
            f"memory key 'messages': each message must be a mapping, got {type(item).__name__}",
            path="$.messages", kind="memory",
        )
    data.setdefault("type", "text")
    try:
        msgspec.convert(data, Message)
    except msgspec.ValidationError as exc:
        raise MemoryValueError(f"memory key 'messages': invalid message: {exc}", path="$.messages",
                               kind="memory") from exc
    return data


def normalize_result(item: Any) -> dict[str, Any]:
    data = _builtins("results", item)
    try:
        RobotResult.from_dict(data)
    except SchemaError as exc:
        raise MemoryValueError(f"memory key 'results': invalid RobotResult: {exc}", path="$.results",
                               kind="memory") from exc
    return data


def normalize_reserved(key: str, value: Any) -> Any:
    """Validate a whole-value write of a reserved key into its stored JSON shape."""
    if key == "data":
        if value is None:
            return {}
        if isinstance(value, DataProxy):
            return value.to_dict()
        if not isinstance(value, Mapping):
            raise MemoryValueError(
                f"memory key 'data' must be a mapping, got {type(value).__name__}", path="$.data", kind="memory"
            )
        return _builtins("data", dict(value))
    if key in ("results", "messages"):
        if value is None:
            return []
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise MemoryValueError(
                f"memory key {key!r} must be a list, got {type(value).__name__}", path=f"$.{key}", kind="memory"
            )
        norm = normalize_result if key == "results" else normalize_message
        return [norm(item) for item in value]
    return value  # session_id: any JSON value


def decode_results(raw: Any) -> list[RobotResult]:
    return [RobotResult.from_dict(item) for item in (raw or [])]


def decode_messages(raw: Any) -> list[Message]:
    return msgspec.convert(raw or [], list[Message])


class DataProxy:
    """``memory.data``: attribute and item access to the ``data`` dict, writing through.

    Reads fetch the current dict from Redis (no stale local copy); a missing attribute reads
    as None, like the Ruby gem's StateProxy.
    """

    __slots__ = ("_memory",)

    def __init__(self, memory: DataStore) -> None:
        object.__setattr__(self, "_memory", memory)

    def to_dict(self) -> dict[str, Any]:
        value = self._memory.get("data")
        return dict(value) if isinstance(value, dict) else {}

    to_h = to_dict

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.to_dict().get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def __delattr__(self, name: str) -> None:
        self._memory.update("data", lambda d: {k: v for k, v in (d or {}).items() if k != name})

    def __getitem__(self, name: str) -> Any:
        return self.to_dict().get(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def __contains__(self, name: object) -> bool:
        return name in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def get(self, name: str, default: Any = None) -> Any:
        return self.to_dict().get(name, default)

    def keys(self) -> list[str]:
        return list(self.to_dict())

    def update(self, values: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Merge ``values`` into ``data`` atomically (compare-and-set on the whole dict)."""
        patch = {**(values or {}), **kwargs}
        _builtins("data", patch)  # fail before touching Redis
        return self._memory.update("data", lambda d: {**(d or {}), **patch})

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DataProxy):
            other = other.to_dict()
        return self.to_dict() == other

    def __repr__(self) -> str:
        return f"DataProxy({self.to_dict()!r})"
