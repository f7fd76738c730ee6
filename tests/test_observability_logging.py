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


def test_threads_logging_their_first_lines_at_once_import_structlog_once() -> None:
    """structlog is imported lazily; threads that log their first lines at the same moment
    (an embedded run's workers) share one import instead of meeting a half-imported module
    (ImportError from structlog.contextvars). Run in a fresh interpreter, so structlog is not
    imported before the threads start."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from robot_lab.logging import get_logger, log_context\n"
        "assert 'structlog' not in sys.modules\n"
        "errors = []\n"
        "gate = threading.Barrier(16)\n"
        "def work(i):\n"
        "    gate.wait()\n"
        "    try:\n"
        "        with log_context(task=str(i)):\n"
        "            get_logger('t').info('first', i=i)\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc))\n"
        "threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(errors)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
