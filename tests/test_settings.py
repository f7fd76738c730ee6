"""Settings layering: defaults < user file < project file < env < constructor."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_lab.settings import SCRIPTED_DEFAULT_MODEL, Settings


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_layers_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    assert Settings().request_timeout == 120.0  # default
    write(home / ".config/robot_lab/robot_lab.yml", "request_timeout: 10\nmax_retries: 7\nsandbox:\n  timeout: 5\n")
    assert Settings().request_timeout == 10.0 and Settings().sandbox.timeout == 5.0
    write(project / "config/robot_lab.yml", "request_timeout: 20\n")
    s = Settings()
    assert s.request_timeout == 20.0 and s.max_retries == 7  # project wins, user file still fills
    monkeypatch.setenv("ROBOT_LAB_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("ROBOT_LAB_SANDBOX__TIMEOUT", "9")
    s = Settings()
    assert s.request_timeout == 30.0 and s.sandbox.timeout == 9.0
    assert Settings(request_timeout=40).request_timeout == 40.0


def test_default_model_scripted_without_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().default_model() == SCRIPTED_DEFAULT_MODEL
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    assert Settings().default_model().startswith("openai/")
    monkeypatch.setenv("ROBOT_LAB_MODEL", "anthropic/claude-x")
    assert Settings().default_model() == "anthropic/claude-x"


def test_redis_url_from_plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().embedded
    monkeypatch.setenv("REDIS_URL", "redis://example:6379/1")
    assert Settings().redis_url == "redis://example:6379/1" and not Settings().embedded


def test_bad_setting_value_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("ROBOT_LAB_REQUEST_TIMEOUT", "soon")
    with pytest.raises(ValidationError, match="request_timeout"):
        Settings()


def test_unknown_variables_are_named_with_the_closest_setting() -> None:
    from robot_lab.settings import unknown_variables

    env = {
        "ROBOT_LAB_BUS__MAX_DELIVERY": "3",  # misspelt nested setting
        "ROBOT_LAB_MODLE": "x",  # misspelt top-level setting
        "ROBOT_LAB_ZZZ": "1",  # nothing close
        "ROBOT_LAB_BUS__MAX_DELIVERIES": "3",  # real ones pass
        "ROBOT_LAB_SKILLS__MATCH_RULES__billing": "{}",  # any key of a dict setting
        "ROBOT_LAB_TASK_LEASE_MS": "100",  # read outside Settings
        "ROBOT_LAB_TEST_REDIS_URL": "redis://x",  # test knob
        "REDIS_URL": "redis://x",  # not ours
    }
    assert unknown_variables(env) == [
        ("ROBOT_LAB_BUS__MAX_DELIVERY", "ROBOT_LAB_BUS__MAX_DELIVERIES"),
        ("ROBOT_LAB_MODLE", "ROBOT_LAB_MODEL"),
        ("ROBOT_LAB_ZZZ", None),
    ]


def test_cli_warns_about_a_misspelt_variable_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from robot_lab import logging as rl_logging
    from robot_lab.cli import main

    monkeypatch.setenv("ROBOT_LAB_BUS__VISIBILITY_TIMOUT", "5")
    monkeypatch.setattr(rl_logging, "_configured", False)
    result = CliRunner().invoke(main, ["schema", "--help"])
    assert result.exit_code == 0
    assert "settings.unknown_variable" in result.stderr
    assert "did you mean ROBOT_LAB_BUS__VISIBILITY_TIMEOUT" in result.stderr
    assert "settings.unknown_variable" not in result.stdout


def test_the_model_request_kill_switch_wins_over_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ROBOT_LAB_ALLOW_MODEL_REQUESTS=0`` stops provider calls even when code configures
    ``allow_model_requests=True``; unset, the setting decides."""
    from robot_lab import settings as settings_mod
    from robot_lab.errors import ConfigurationError
    from robot_lab.llm.gateway import LLMGateway

    monkeypatch.setattr(settings_mod, "_settings", None)
    monkeypatch.setenv("ROBOT_LAB_ALLOW_MODEL_REQUESTS", "0")
    settings_mod.configure(allow_model_requests=True)
    with pytest.raises(ConfigurationError, match="model requests are disabled"):
        LLMGateway(max_retries=0).complete("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}])
    monkeypatch.delenv("ROBOT_LAB_ALLOW_MODEL_REQUESTS")
    settings_mod.configure(allow_model_requests=False)
    with pytest.raises(ConfigurationError, match="model requests are disabled"):
        LLMGateway(max_retries=0).complete("openai/gpt-4o-mini", [{"role": "user", "content": "hi"}])
    monkeypatch.setattr(settings_mod, "_settings", None)
