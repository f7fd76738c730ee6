"""Where a robot's definition comes from when only its name is known.

A coordinator or a worker meets robot *names* (in a task, a message, a spawn request) and
needs their :class:`~robot_lab.schemas.RobotSpec`. The sources, in order of precedence, are
the network's own robots, its app, the configured app (``ROBOT_LAB_APP`` / ``settings.app``)
and the specs published to Redis (``Keys.robot_spec(name)``).

This module sits in the runtime layer, below :mod:`robot_lab.app`: it needs only *robot
specs*, never networks, so it reads a configured app without building one. A Python app
path is imported (user code; the object is used through ``has_robot`` / ``robot_spec``), and
a YAML app is read for its ``robots:`` section only. :func:`robot_lab.app.load_app` records
the apps it loads here, so both layers share one object per path.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, default_keys
from robot_lab.schemas import RobotSpec
from robot_lab.schemas.validation import convert

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient


class RobotSource(Protocol):
    """Anything that knows robots by name (an App, a network, a YAML file's robots)."""

    def has_robot(self, name: str) -> bool: ...

    def robot_spec(self, name: str) -> RobotSpec: ...


_sources: dict[str, Any] = {}
_sources_lock = threading.Lock()


def remember_app(path: str, app: Any) -> None:
    """Record the app loaded for ``path`` (called by :func:`robot_lab.app.load_app`)."""
    with _sources_lock:
        _sources[path] = app


class YamlRobots:
    """The ``robots:`` section of a YAML app file, as a :class:`RobotSource`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.specs = {spec.name: spec for spec in read_yaml_robots(path)}

    def has_robot(self, name: str) -> bool:
        return name in self.specs

    def robot_spec(self, name: str) -> RobotSpec:
        return self.specs[name]


def read_yaml_app(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML app file, checked for shape (``name``, ``robots``, ``networks``)."""
    import yaml  # lazy: start-up time

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigurationError(f"cannot read app file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"app file {path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigurationError(f"app file {path}: expected a mapping with 'robots' and 'networks'")
    unknown = set(data) - {"name", "robots", "networks"}
    if unknown:
        raise ConfigurationError(f"app file {path}: unknown top-level keys {sorted(unknown)}")
    for section in ("robots", "networks"):
        if data.get(section) is not None and not isinstance(data[section], list):
            raise ConfigurationError(
                f"app file {path}: {section} must be a list (one '- name: ...' entry per item), "
                f"got a {type(data[section]).__name__}"
            )
    return data


def read_yaml_robots(path: str | Path, data: dict[str, Any] | None = None) -> list[RobotSpec]:
    """The robot specs of a YAML app file."""
    data = read_yaml_app(path) if data is None else data
    specs: list[RobotSpec] = []
    for index, raw in enumerate(data.get("robots") or []):
        try:
            specs.append(convert(raw, RobotSpec))
        except Exception as exc:
            raise ConfigurationError(f"app file {path}: robots[{index}]: {exc}") from exc
    return specs


def import_user_module(module_name: str, what: str) -> Any:
    """Import user code (an app, a network's module); any failure becomes one
    ConfigurationError naming the file and line where it broke, not a 40-line traceback."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {what}: {exc} (is it on PYTHONPATH?)") from exc
    except Exception as exc:  # user code raised while being imported
        import traceback  # lazy: start-up time

        where = ""
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f" ({exc.filename}:{exc.lineno})"
        elif frames:
            where = f" ({frames[-1].filename}:{frames[-1].lineno})"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigurationError(
            f"cannot import {what}: {type(exc).__name__}: {text}{where}"
        ) from exc


def import_app_object(path: str) -> Any:
    """``pkg.module:attr`` or ``pkg.module`` (attribute ``app``); a callable is called."""
    module_name, _, attr = path.partition(":")
    module = import_user_module(module_name, f"app {path!r}")
    obj = getattr(module, attr or "app", None)
    if obj is None:
        raise ConfigurationError(f"app {path!r}: module {module_name} has no attribute {attr or 'app'!r}")
    if callable(obj) and not hasattr(obj, "robot_spec"):
        obj = obj()
    return obj


def configured_robots() -> RobotSource | None:
    """The robots of the app named by ``ROBOT_LAB_APP`` / ``settings.app``, if any."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    path = get_settings().app
    return robot_source(path) if path else None


def robot_source(path: str) -> RobotSource:
    """The robots of the app at ``path`` (once per process): a Python app is imported, with
    its side effects (scripted-model scripts, tools registered at import); a YAML app is
    read for its robots."""
    with _sources_lock:
        cached = _sources.get(path)
    if cached is not None:
        return cached
    source: Any = YamlRobots(path) if path.endswith((".yml", ".yaml")) else import_app_object(path)
    if not hasattr(source, "robot_spec"):
        raise ConfigurationError(f"app {path!r} is a {type(source).__name__}, not a robot_lab.App")
    if not isinstance(source, YamlRobots):  # a YAML file is read again each time (cheap, and may change)
        remember_app(path, source)
    return source


def publish_specs(specs: list[RobotSpec], *, connection: RedisClient | None = None, keys: Keys | None = None) -> None:
    """Write robot specs to the Redis registry, so any worker can build them by name."""
    from robot_lab.connection import get_redis  # lazy: start-up time

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    pipe = connection.pipeline(transaction=False)
    for spec in specs:
        pipe.set(keys.robot_spec(spec.name), msgspec.json.encode(spec))
    pipe.execute()


def published_spec(name: str, *, connection: RedisClient | None = None, keys: Keys | None = None) -> RobotSpec | None:
    """A robot spec from the Redis registry, or None."""
    from robot_lab.connection import get_redis  # lazy: start-up time

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    raw = connection.get(keys.robot_spec(name))
    return msgspec.json.decode(raw, type=RobotSpec) if raw is not None else None


def check_importable(spec: RobotSpec) -> None:
    """Import every tool path of ``spec`` now, so a typo fails before any job is enqueued."""
    from robot_lab.runtime.tools import import_object  # lazy: start-up time

    for path in spec.local_tools:
        try:
            import_object(path)
        except ConfigurationError as exc:
            raise ConfigurationError(f"robot {spec.name!r}: tool {exc}") from exc
