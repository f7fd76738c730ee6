"""How robot-lab rq jobs are serialized, so that the *unmodified* ``rq worker robot:billing``
runs them and no job payload can carry code.

rq 3 does not record a job's serializer in the job, and its CLI decodes every job with
pickle unless ``-S`` is given (no setting or environment variable changes that). So a job
written with rq's JSON serializer fails in a plain ``rq worker``. robot-lab's jobs carry only
plain data (the function's import path and four strings; the result is a small dict), so we
write them with pickle's *data-only* subset (protocol 4 of str/int/float/bool/None/list/
tuple/dict: no GLOBAL or REDUCE opcodes), which any rq worker reads, and we read them back
with an unpickler that refuses every class and function. JSON payloads (jobs enqueued by
other languages, or with ``-S json``) are read too.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

_PLAIN = (str, int, float, bool, type(None))


def _check_plain(value: Any, path: str = "$") -> None:
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_plain(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"robot-lab job data must have string keys; {path} has {type(key).__name__}")
            _check_plain(item, f"{path}.{key}")
        return
    raise TypeError(f"robot-lab job data must be plain JSON-like values; {path} is {type(value).__name__}")


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"robot-lab job payloads carry data only; refusing to load {module}.{name}"
        )


class JobSerializer:
    """rq serializer (``dumps``/``loads``) for robot-lab jobs; see the module docstring."""

    @staticmethod
    def dumps(obj: Any) -> bytes:
        _check_plain(obj)
        return pickle.dumps(obj, protocol=4)

    @staticmethod
    def loads(data: bytes) -> Any:
        if data[:1] == b"\x80":
            return _DataOnlyUnpickler(io.BytesIO(data)).load()
        return json.loads(data.decode("utf-8"))
