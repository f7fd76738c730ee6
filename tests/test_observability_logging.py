"""structlog output: JSON lines with context, secrets masked."""

from __future__ import annotations

import json

import pytest

from robot_lab.logging import configure_logging, declare_secret, get_logger, log_context


def test_json_lines_with_context_and_no_secrets(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-abcdefghijklmnop")
    configure_logging(level="INFO", fmt="json", force=True)
    declare_secret("hunter2-secret-value")
    log = get_logger("test")
    with log_context(robot="billing", run_id="r1", task="charge"):
        log.info(
            "calling",
            api_key="sk-live-abcdefghijklmnop",
            note="key is sk-live-abcdefghijklmnop and hunter2-secret-value",
            input_tokens=12,
        )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    record = json.loads(line)
    assert record["robot"] == "billing" and record["run_id"] == "r1" and record["task"] == "charge"
    assert record["api_key"] == "***"
    assert "abcdefghijklmnop" not in line and "hunter2" not in line
    assert record["input_tokens"] == 12
