"""Lazy package exports (PEP 562): a package names what it exports and where it is defined,
and a name's module is imported the first time the name is used. So importing a package
(``robot_lab``, ``robot_lab.bus``, ``robot_lab.network``) costs no more than the part of it a
process uses: ``robot-lab status`` reads inbox statistics without loading the poller."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any],
                 names: list[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps a
    public name to the module defining it; a resolved name is cached in ``namespace`` (the
    package's globals), so the lookup runs once per name; ``names`` is its ``__all__``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
