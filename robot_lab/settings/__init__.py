"""Settings, layered like the Ruby gem's Config (myway_config):

defaults < ``~/.config/robot_lab/robot_lab.yml`` < ``./config/robot_lab.yml``
< ``ROBOT_LAB_*`` environment (``__`` nests: ``ROBOT_LAB_SANDBOX__TIMEOUT=30``)
< constructor arguments.

One definition: the top-level plain fields in :class:`~robot_lab.settings.core.CoreSettings`
(pydantic-free), the sections and the rest in :mod:`robot_lab.settings.models` (pydantic),
whose ``Settings`` inherits the former. This module imports neither pydantic nor the models:
the model names (``Settings``, ``BusSettings``, ...) load on first use (PEP 562).

:func:`get_settings` builds the full pydantic ``Settings`` -- every layer read and validated,
a bad value raising its ValidationError -- unless nothing but plain top-level fields is
configured (no config file; ``ROBOT_LAB_*`` variables naming only CoreSettings fields, in
plain forms). Then it returns a :class:`LightSettings`: those values, computed without
pydantic, and the full Settings built from them on the first read of anything else (a
section, ``model_dump``). So ``robot-lab status`` does not pay ~0.1-0.2 s of CPU for pydantic
and models it never reads (bench/startup.py), and reads the same values.

File locations are resolved when settings are built, not at import, so tests and tools that
change ``HOME`` or the working directory see their own files.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from robot_lab.lazy import lazy_exports
from robot_lab.settings.core import (  # the public names of robot_lab.settings (__all__)
    DEFAULT_MAX_TOOL_ROUNDS,
    ENV_PREFIX,
    OTHER_PREFIXES,
    OTHER_VARIABLES,
    PROVIDER_DEFAULT_MODELS,
    SAFE_SKILL_ENV,
    SCRIPTED_DEFAULT_MODEL,
    LIGHT_SECTIONS,
    BusCore,
    DurableCore,
    CoreSettings,
    SigningCore,
    VerifyMode,
    core_fields,
    section_defaults,
    is_other_variable,
    light_values,
    project_config_file,
    user_config_file,
)

if TYPE_CHECKING:
    from robot_lab.settings.models import (  # noqa: F401
        DEFAULT_MATCH_RULES,
        A2ASettings,
        BudgetSettings,
        BusSettings,
        DurableSettings,
        Endpoint,
        MatchRule,
        SandboxSettings,
        Settings,
        SigningSettings,
        SkillGrant,
        SkillsSettings,
        WorkerSettings,
    )

_MODELS = "robot_lab.settings.models"
_EXPORTS: dict[str, str] = {name: _MODELS for name in (
    "Settings", "SandboxSettings", "SkillGrant", "MatchRule", "DEFAULT_MATCH_RULES", "SkillsSettings", "BusSettings",
    "SigningSettings", "BudgetSettings", "DurableSettings", "WorkerSettings", "A2ASettings", "Endpoint",
)}
__all__ = [
    "A2ASettings", "BudgetSettings", "BusSettings", "BusCore", "CoreSettings", "DurableCore", "DEFAULT_MATCH_RULES",
    "DEFAULT_MAX_TOOL_ROUNDS", "DurableSettings", "Endpoint", "LightSettings", "MatchRule", "OTHER_PREFIXES",
    "OTHER_VARIABLES", "PROVIDER_DEFAULT_MODELS", "SAFE_SKILL_ENV", "SCRIPTED_DEFAULT_MODEL", "SandboxSettings",
    "Settings", "SigningCore", "SigningSettings", "SkillGrant", "SkillsSettings", "VerifyMode", "WorkerSettings", "configure",
    "get_settings", "project_config_file", "reload_settings", "unknown_variables", "user_config_file",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)


class LightSettings:
    """The process settings while only CoreSettings fields are configured: their values, the
    defaults of the ``bus``, ``signing`` and ``durable`` sections (BusCore / SigningCore / DurableCore), and
    on the first read of any other name the full ``Settings`` built with those same values
    (later reads of every name, core fields and sections included, go to it)."""

    __slots__ = ("_values", "_sections", "_full", "_lock")

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_sections", {})  # name -> its defaults (BusCore, SigningCore, DurableCore), as read
        object.__setattr__(self, "_full", None)
        object.__setattr__(self, "_lock", threading.Lock())

    def full(self) -> Settings:
        """The pydantic Settings (built once): sections, ``model_dump`` and the rest."""
        with self._lock:
            if self._full is None:
                from robot_lab.settings.models import Settings  # lazy: start-up time

                # the values already served win over the layers (read again now), so no
                # field changes under a reader who saw it before
                served = {name: dict(vars(section)) for name, section in self._sections.items()}
                object.__setattr__(self, "_full", Settings(**self._values, **served))
        return self._full  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        if self._full is None:
            if name in self._values:
                return self._values[name]
            if name in LIGHT_SECTIONS:  # not configured (or this would be a full Settings): its defaults
                with self._lock:
                    if self._full is None:
                        return self._sections.setdefault(name, section_defaults(LIGHT_SECTIONS[name]))
        if name.startswith("__"):  # copy / pickle probing for hooks: not settings
            raise AttributeError(name)
        return getattr(self.full(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.full(), name, value)

    def __repr__(self) -> str:
        return repr(self.full())

    default_model = CoreSettings.default_model
    cluster_keys = CoreSettings.cluster_keys
    embedded = CoreSettings.embedded


_settings: Settings | LightSettings | None = None


def get_settings() -> Settings:
    """The process-wide settings, built on first use (a :class:`LightSettings` when that is
    enough, see the module docstring: it answers every attribute a ``Settings`` has)."""
    global _settings
    if _settings is None:
        values = light_values()
        if values is not None:
            _settings = LightSettings(values)
        else:
            from robot_lab.settings.models import Settings  # lazy: start-up time

            _settings = Settings()
    return _settings  # type: ignore[return-value]


def configure(**overrides: Any) -> Settings:
    """Replace the process-wide settings (the Ruby gem's ``RobotLab.configure``)."""
    global _settings
    from robot_lab.settings.models import Settings  # lazy: start-up time

    _settings = Settings(**overrides)
    return _settings


def reload_settings() -> Settings:
    """Re-read files and environment (the Ruby gem's ``reload_config!``)."""
    global _settings
    _settings = None
    return get_settings()


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``ROBOT_LAB_*`` variables that no setting reads (a misspelling is otherwise silently
    ignored), each with the closest known name, or None. Values are never looked at. Only a
    variable that is not a CoreSettings field loads the models to be checked."""
    env = os.environ if environ is None else environ
    core = {f"{ENV_PREFIX}{name}".upper() for name in core_fields()}
    names = [name for name in sorted(env) if name.upper().startswith(ENV_PREFIX)
             and not is_other_variable(name) and name.upper() not in core]
    if not names:
        return []
    import difflib  # lazy: start-up time

    from robot_lab.settings.models import Settings, setting_paths  # lazy: start-up time

    known, dicts = setting_paths(Settings)
    # compared without the common prefix, which would make every name look close
    candidates = sorted(known | {v[len(ENV_PREFIX):] for v in OTHER_VARIABLES})
    unknown: list[tuple[str, str | None]] = []
    for name in names:
        path = name.upper()[len(ENV_PREFIX):]
        if path in known or any(path.startswith(f"{d}__") for d in dicts):
            continue
        close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.75)
        unknown.append((name, f"{ENV_PREFIX}{close[0]}" if close else None))
    return unknown
