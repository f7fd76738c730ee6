"""The App: robot and network definitions in one importable object (like Celery's ``-A``).

Workers, ``robot-lab run`` and the coordinator find robots through an app loaded by import
path (``ROBOT_LAB_APP=pkg.module:app``, ``settings.app``, ``--app``) or from a YAML file, and
through the specs published to Redis (``Keys.robot_spec(name)``), so a worker can build a
robot it was not started with -- its tools still have to be importable there.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_lab.errors import ConfigurationError
from robot_lab.runtime.registry import (
    import_app_object,
    publish_specs,
    read_yaml_app,
    read_yaml_robots,
    remember_app,
)
from robot_lab.schemas import RobotSpec

if TYPE_CHECKING:  # pragma: no cover
    from robot_lab.connection import RedisClient
    from robot_lab.keys import Keys
    from robot_lab.network.dsl import Network
    from robot_lab.runtime.robot import Robot


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
        from robot_lab.runtime.robot import build  # lazy: start-up time

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
        from robot_lab.runtime.robot import Robot  # lazy: start-up time

        return Robot.from_spec(self.robot_spec(name), **overrides)

    # --- networks --------------------------------------------------------------------
    def network(self, name: str, **kwargs: Any) -> Network:
        """Create a network bound to this app and register it."""
        from robot_lab.network.dsl import create_network  # lazy: start-up time

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
    def publish(self, connection: RedisClient | None = None, keys: Keys | None = None) -> list[str]:
        """Write every robot's spec to Redis so any worker can build it."""
        specs = [self.robot_spec(name) for name in self._robots]
        publish_specs(specs, connection=connection, keys=keys)
        return [s.name for s in specs]

    # --- YAML --------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, *, name: str | None = None) -> App:
        """Robots and networks from a YAML file (see docs/networks.md for the format)."""
        path = Path(path)
        data = read_yaml_app(path)
        app = cls(name or data.get("name") or path.stem, import_path=str(path))
        for spec in read_yaml_robots(path, data):
            app.add_robot(spec)
        from robot_lab.network.dsl import Network  # lazy: start-up time

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
            obj = import_app_object(path)
            if not isinstance(obj, App):
                raise ConfigurationError(f"app {path!r} is a {type(obj).__name__}, not a robot_lab.App")
            app = obj
        if app.import_path is None:
            app.import_path = path
        _apps[path] = app
        remember_app(path, app)
        return app


def configured_app() -> App | None:
    """The app named by ``ROBOT_LAB_APP`` / ``settings.app``, if any."""
    from robot_lab.settings import get_settings  # lazy: start-up time

    path = get_settings().app
    return load_app(path) if path else None
