"""The rq job serializer: readable by a stock pickle rq worker, data only, JSON accepted."""

from __future__ import annotations

import pickle
import pickletools

import pytest

from robot_lab.network.serializer import JobSerializer

PAYLOAD = ("robot_lab.workers.run_task", None, ("robot_lab", "run-1", "classify", "rl-run-1-classify-1"), {})


def test_stock_pickle_reads_it_and_it_holds_no_globals() -> None:
    data = JobSerializer.dumps(PAYLOAD)
    assert pickle.loads(data) == PAYLOAD  # what a plain `rq worker` does
    opcodes = {op.name for op, _, _ in pickletools.genops(data)}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "BUILD"}
    assert JobSerializer.loads(data) == PAYLOAD


def test_payloads_with_code_are_refused() -> None:
    evil = pickle.dumps(("os.system", None, ("echo pwned",), {"x": print}))
    with pytest.raises(pickle.UnpicklingError, match="carry data only; refusing to load builtins.print"):
        JobSerializer.loads(evil)


def test_non_plain_values_cannot_be_written() -> None:
    with pytest.raises(TypeError, match=r"\$\[2\]\.when is datetime"):
        import datetime

        JobSerializer.dumps(("f", None, {"when": datetime.datetime.now()}))


def test_json_payloads_are_read() -> None:
    assert JobSerializer.loads(b'["robot_lab.workers.run_task", null, ["p", "r", "t", "j"], {}]') == [
        "robot_lab.workers.run_task", None, ["p", "r", "t", "j"], {},
    ]
