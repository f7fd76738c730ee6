"""The App: robot and network definitions in one importable object (like Celery's ``-A``).

Workers, ``robot-lab run`` and the coordinator find robots through an app loaded by import
path (``ROBOT_LAB_APP=pkg.module:app``, ``settings.app``, ``--app``) or from a YAML file, and
through the specs published to Redis (``Keys.robot_spec(name)``), so a worker can build a
robot it was not started with -- its tools still have to be importable there.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .errors import ConfigurationError
from .schemas import RobotSpec
from .schemas.codec import convert

if TYPE_CHECKING:  # pragma: no cover
    from .keys import Keys
    from .runtime.network import Network
    from .runtime.robot import Robot


class App:
    """Holds robots (as live robots or specs) and networks, by name."""

    def __init__(self, name: str = "app", *, robots: Any = (), networks: Any = (),
                 import_path: str | None = None) -> None:
        self.name = name
        self.import_path = import_path
        self._robots: dict[str, Any] = {}
        self.networks: dict[str, Network] = {}
        for robot in robots:
            self.add_robot(robot)
        for network in networks:
            self.add_network(network)

    # --- robots ----------------------------------------------------------------------
    def add_robot(self, robot: Robot | RobotSpec) -> Any:
        name = robot.name
        if name in self._robots:
            raise ConfigurationError(f"app {self.name!r}: robot {name!r} is defined twice")
        self._robots[name] = robot
        return robot

    def robot(self, name: str, **kwargs: Any) -> Robot:
        """Build a robot (``robot_lab.build`` arguments) and register it."""
        from .runtime.robot import build

        return self.add_robot(build(name, **kwargs))

    @property
    def robot_names(self) -> list[str]:
        return list(self._robots)

    def has_robot(self, name: str) -> bool:
        return name in self._robots

    def robot_spec(self, name: str) -> RobotSpec:
        try:
            robot = self._robots[name]
        except KeyError:
            known = ", ".join(self._robots) or "none"
            raise ConfigurationError(f"app {self.name!r} has no robot {name!r} (robots: {known})") from None
        return robot if isinstance(robot, RobotSpec) else robot.to_spec()

    def build_robot(self, name: str, **overrides: Any) -> Robot:
        """A fresh robot (empty conversation) built from the definition."""
        from .runtime.robot import Robot

        return Robot.from_spec(self.robot_spec(name), **overrides)

    # --- networks --------------------------------------------------------------------
    def network(self, name: str, **kwargs: Any) -> Network:
        """Create a network bound to this app and register it."""
        from .runtime.network import create_network

        return self.add_network(create_network(name, app=self, **kwargs))

    def add_network(self, network: Network) -> Network:
        if network.name in self.networks:
            raise ConfigurationError(f"app {self.name!r}: network {network.name!r} is defined twice")
        network.app = self
        self.networks[network.name] = network
        return network

    def get_network(self, name: str | None = None) -> Network:
        if name is None:
            if len(self.networks) == 1:
                return next(iter(self.networks.values()))
            raise ConfigurationError(
                f"app {self.name!r} has {len(self.networks)} networks ({', '.join(self.networks) or 'none'}); "
                "name one"
            )
        try:
            return self.networks[name]
        except KeyError:
            known = ", ".join(self.networks) or "none"
            raise ConfigurationError(f"app {self.name!r} has no network {name!r} (networks: {known})") from None

    # --- Redis registry ----------------------------------------------------------------
    def publish(self, connection: Any = None, keys: Keys | None = None) -> list[str]:
        """Write every robot's spec to Redis so any worker can build it."""
        specs = [self.robot_spec(name) for name in self._robots]
        publish_specs(specs, connection=connection, keys=keys)
        return [s.name for s in specs]

    # --- YAML --------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, *, name: str | None = None) -> App:
        """Robots and networks from a YAML file (see docs/networks.md for the format)."""
        import yaml

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
        app = cls(name or data.get("name") or path.stem, import_path=str(path))
        for index, raw in enumerate(data.get("robots") or []):
            try:
                spec = convert(raw, RobotSpec)
            except Exception as exc:
                raise ConfigurationError(f"app file {path}: robots[{index}]: {exc}") from exc
            app.add_robot(spec)
        from .runtime.network import Network

        for index, raw in enumerate(data.get("networks") or []):
            try:
                app.add_network(Network.from_dict(raw, app=app))
            except ConfigurationError as exc:
                raise ConfigurationError(f"app file {path}: networks[{index}]: {exc}") from exc
        return app

    def __repr__(self) -> str:
        return f"<App {self.name} robots={list(self._robots)} networks={list(self.networks)}>"


# ---------------------------------------------------------------------------------------

_apps: dict[str, App] = {}
_apps_lock = threading.Lock()


def load_app(path: str) -> App:
    """Load (once per process) ``pkg.module:attr``, ``pkg.module`` (attribute ``app``) or a
    ``.yml`` file. The attribute may be an App or a callable returning one."""
    with _apps_lock:
        cached = _apps.get(path)
        if cached is not None:
            return cached
        if path.endswith((".yml", ".yaml")):
            app = App.from_yaml(path)
        else:
            module_name, _, attr = path.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigurationError(f"cannot import app {path!r}: {exc}") from exc
            obj = getattr(module, attr or "app", None)
            if obj is None:
                raise ConfigurationError(f"app {path!r}: module {module_name} has no attribute {attr or 'app'!r}")
            if callable(obj) and not isinstance(obj, App):
                obj = obj()
            if not isinstance(obj, App):
                raise ConfigurationError(f"app {path!r} is a {type(obj).__name__}, not a robot_lab.App")
            app = obj
        if app.import_path is None:
            app.import_path = path
        _apps[path] = app
        return app


def configured_app() -> App | None:
    """The app named by ``ROBOT_LAB_APP`` / ``settings.app``, if any."""
    from .settings import get_settings

    path = get_settings().app
    return load_app(path) if path else None


def publish_specs(specs: list[RobotSpec], *, connection: Any = None, keys: Keys | None = None) -> None:
    from .connection import get_redis
    from .keys import default_keys

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    pipe = connection.pipeline(transaction=False)
    for spec in specs:
        pipe.set(keys.robot_spec(spec.name), msgspec.json.encode(spec))
    pipe.execute()


def published_spec(name: str, *, connection: Any = None, keys: Keys | None = None) -> RobotSpec | None:
    from .connection import get_redis
    from .keys import default_keys

    connection = connection if connection is not None else get_redis()
    keys = keys or default_keys()
    raw = connection.get(keys.robot_spec(name))
    return msgspec.json.decode(raw, type=RobotSpec) if raw is not None else None


def check_importable(spec: RobotSpec) -> None:
    """Import every tool path of ``spec`` now, so a typo fails before any job is enqueued."""
    from .runtime.tools import import_object

    for path in spec.local_tools:
        try:
            import_object(path)
        except ConfigurationError as exc:
            raise ConfigurationError(f"robot {spec.name!r}: tool {exc}") from exc
