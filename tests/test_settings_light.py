"""The light settings path (settings/core.py): the values it serves are the ones the full
pydantic Settings gives for the same layers, it steps aside whenever it cannot be sure, and
CoreSettings / BusCore / SigningCore / DurableCore stay the one definition of their fields."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from robot_lab import settings as settings_mod
from robot_lab.settings import (
    BusCore,
    BusSettings,
    CoreSettings,
    DurableCore,
    DurableSettings,
    LightSettings,
    Settings,
    SigningCore,
    SigningSettings,
    core_fields,
    get_settings,
    light_values,
    reload_settings,
)

# values a variable may hold: plain ones, and spellings pydantic reads but the light path leaves to it
TRICKY = ["0", "1", "10", "-3", "0.5", "2.0", "1e3", " 10", "10 ", "+10", "1_000", "007", "true", "False", "YES",
          "on", "off", "t", "n", "maybe", "", "auto", "json", "console", "JSON", "redis://h:1/0", "inf", "nan", "1.",
          ".5", "0x10", "-0"]


def _full(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict | None:
    for name in list(__import__("os").environ):
        if name.upper().startswith("ROBOT_LAB_") or name.upper() == "REDIS_URL":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        full = Settings()
    except ValidationError:
        return None
    return {field: getattr(full, field) for field in core_fields()}


def test_light_values_are_the_full_settings_values_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """For random environments over every core field (and REDIS_URL beside ROBOT_LAB_REDIS_URL):
    whenever the light path answers, pydantic-settings builds the same values; whenever
    pydantic refuses a value, the light path does not answer."""
    rng = random.Random(30)
    names = [f"ROBOT_LAB_{f.upper()}" for f in core_fields()] + ["REDIS_URL", "robot_lab_key_prefix"]
    answered = refused = 0
    for _ in range(500):
        env = {name: rng.choice(TRICKY) for name in rng.sample(names, rng.randint(1, 4))}
        light = light_values(env)
        with monkeypatch.context() as m:
            full = _full(env, m)
        if full is None:
            assert light is None, env
            refused += 1
        elif light is not None:
            assert light == full, env
            answered += 1
    assert answered > 50 and refused > 50  # both sides of the property were exercised


def test_light_values_step_aside_for_sections_files_and_two_spellings(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert light_values({}) == {f: getattr(CoreSettings, f) for f in core_fields()}
    assert light_values({"ROBOT_LAB_KEY_PREFIX": "p", "ROBOT_LAB_TEST_REDIS_URL": "x", "HOME": "/"})["key_prefix"] == "p"
    assert light_values({"ROBOT_LAB_BUS__MAXLEN": "5"}) is None  # a section setting
    assert light_values({"ROBOT_LAB_MODLE": "x"}) is None  # a misspelling: the full path warns about it
    assert light_values({"ROBOT_LAB_KEY_PREFIX": "a", "robot_lab_key_prefix": "b"}) is None
    assert light_values({"ROBOT_LAB_REDIS_URL": "redis://a", "REDIS_URL": "redis://b"})["redis_url"] == "redis://a"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "robot_lab.yml").write_text("key_prefix: fromfile\n")
    assert light_values({}) is None
    assert get_settings().key_prefix == "fromfile" and isinstance(get_settings(), Settings)


def test_get_settings_is_light_until_something_else_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", "lite")
    monkeypatch.setenv("ROBOT_LAB_REQUEST_TIMEOUT", "7")
    settings = reload_settings()
    assert isinstance(settings, LightSettings)
    assert settings.key_prefix == "lite" and settings.request_timeout == 7.0 and settings.embedded
    assert settings.default_model() == "scripted/echo" and settings.cluster_keys is False
    bus, signing = settings.bus, settings.signing  # the sections a Bus reads: their defaults, no models
    assert isinstance(bus, BusCore) and not isinstance(bus, BusSettings) and settings.bus is bus
    assert vars(bus) == BusSettings().model_dump() and vars(signing) == SigningSettings().model_dump()
    assert signing.mode_for("anyone") == "off"
    durable = settings.durable  # what every network task reads (its journal's on_divergence)
    assert isinstance(durable, DurableCore) and not isinstance(durable, DurableSettings)
    assert vars(durable) == DurableSettings().model_dump() and durable.answerers is not DurableCore.answerers
    bus.maxlen = 77  # what was read (and changed) is what the full settings hold
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", "changed-since")
    assert settings.sandbox.timeout == 60.0  # a section of its own: the full Settings now
    full = settings.full()
    assert isinstance(full, Settings) and full.key_prefix == "lite" and full.bus.maxlen == 77
    assert settings.key_prefix == "lite" and settings.bus is full.bus and settings.model_dump()["request_timeout"] == 7.0
    settings.max_retries = 9
    assert full.max_retries == 9 and settings.max_retries == 9


def test_a_value_only_pydantic_can_judge_builds_the_full_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_WORKER_HEARTBEAT", "abc")
    with pytest.raises(ValidationError, match="worker_heartbeat"):
        reload_settings()
    monkeypatch.setenv("ROBOT_LAB_WORKER_HEARTBEAT", "1e1")  # valid, but not a plain spelling
    assert isinstance(reload_settings(), Settings) and get_settings().worker_heartbeat == 10.0
    monkeypatch.setenv("ROBOT_LAB_WORKER_HEARTBEAT", "2")
    monkeypatch.setenv("ROBOT_LAB_MAX_TOOL_ROUNDS", "0")  # out of bounds: pydantic words the error
    with pytest.raises(ValidationError, match="max_tool_rounds"):
        reload_settings()
    monkeypatch.setattr(settings_mod, "_settings", None)


def test_the_pydantic_models_declare_the_core_fields_as_the_cores_do() -> None:
    """One definition: Settings, BusSettings and SigningSettings take their fields (type,
    default) from CoreSettings, BusCore and SigningCore, and redeclare none but redis_url
    (which gets its REDIS_URL alias there)."""
    for core, model in ((CoreSettings, Settings), (BusCore, BusSettings), (SigningCore, SigningSettings),
                        (DurableCore, DurableSettings)):
        for name in core.__annotations__:
            if name == "ENV_ALIASES":
                continue
            field = model.model_fields[name]
            assert field.default == getattr(core, name), (model, name)
            assert name not in model.__dict__.get("__annotations__", {}) or name == "redis_url", (model, name)
    assert Settings.model_fields["redis_url"].validation_alias.choices == list(CoreSettings.ENV_ALIASES["redis_url"])
