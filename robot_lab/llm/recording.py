"""What reached the scripted model, recorded so a test can read it: the model, the provider
parameters (temperature, max_tokens, ...), the offered tool names and the robot's provider.

In this process: :func:`recorded_calls`. Across processes (a worker runs the call): set
``ROBOT_LAB_SCRIPTED_RECORD`` to a file and each call appends one JSON line to it (one
``write`` of a short line with O_APPEND, so lines never interleave). Apart from
:mod:`.scripted` because it is a test seam, not part of deciding a reply.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

from robot_lab.llm.scripted import PROVIDER, _text_of, _tool_name, last_user_message

RECORD_ENV = "ROBOT_LAB_SCRIPTED_RECORD"
# The newest calls only: a long-lived process on the scripted model (the demo, a benchmark's
# worker) recorded every call it ever made.
KEEP_CALLS = 10_000
_calls: deque[dict[str, Any]] = deque(maxlen=KEEP_CALLS)
_calls_lock = threading.Lock()
PARAM_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "presence_penalty", "frequency_penalty", "stop")


def record_call(model: str, messages: list[dict[str, Any]], optional_params: dict[str, Any],
                metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Record one call (see above); returns the record."""
    meta = metadata or {}
    record = {
        "model": model if model.startswith(f"{PROVIDER}/") else f"{PROVIDER}/{model}",
        "params": {k: optional_params[k] for k in PARAM_KEYS if optional_params.get(k) is not None},
        "tools": [_tool_name(t) for t in optional_params.get("tools") or []],
        "provider": meta.get("robot_lab_provider"),
        "robot": meta.get("robot_lab_robot"),
        "request": last_user_message(messages),
        "system": next((_text_of(m.get("content")) for m in messages[:1] if m.get("role") == "system"), None),
    }
    with _calls_lock:
        _calls.append(record)
    path = os.environ.get(RECORD_ENV)
    if path:
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    return record


def recorded_calls(path: str | None = None) -> list[dict[str, Any]]:
    """The calls recorded in this process (the newest ``KEEP_CALLS``), or those in a record
    file (``path``)."""
    if path is not None:
        p = Path(path)
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
    with _calls_lock:
        return list(_calls)


def clear_recorded_calls() -> None:
    with _calls_lock:
        _calls.clear()
