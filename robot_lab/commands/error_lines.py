"""One clear line for each failure a user can cause, instead of a traceback.

The ``robot-lab`` group (:mod:`robot_lab.cli`) turns any exception a command lets escape into
``Error: <what went wrong> (<what to do>)`` and exit status 1; ``--debug`` shows the
traceback instead. Why here and not in each command: the same mistakes (a Redis URL that
does not parse, a server that is down or refuses the password, an app module that does not
import) reach every command, and a newcomer meets them before anything else.

redis-py is not imported here: ``robot-lab --help`` must stay light, and an exception's class
names are enough to tell the kinds apart.
"""

from __future__ import annotations

import traceback

from robot_lab.errors import RobotLabError

DEBUG_HINT = "rerun with --debug for the traceback"


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _redis_where() -> str:
    try:
        from robot_lab.redis_url import redact_url  # lazy: start-up time
        from robot_lab.settings import get_settings  # lazy: start-up time

        url = get_settings().redis_url
    except Exception:  # settings themselves are broken: name nothing
        return "Redis"
    return f"Redis at {redact_url(url)}" if url else "Redis"


def _from_redis(exc: BaseException) -> str | None:
    if not type(exc).__module__.startswith("redis"):
        return None
    names = _names(exc)
    text = _first_line(exc)
    if "AuthenticationError" in names or "AuthenticationWrongNumberOfArgsError" in names or \
            text.startswith(("NOAUTH", "WRONGPASS")):
        return (f"{_redis_where()} refused the credentials: {text} "
                "(check the user and password in REDIS_URL: redis://user:password@host:6379/0)")
    if ("ConnectionError" in names or "TimeoutError" in names) and _redis_where().startswith("Redis at rediss"):
        return (f"cannot reach {_redis_where()}: {text} (a rediss:// URL needs a port that speaks TLS: is TLS on "
                "there? ROBOT_LAB_REDIS_CONNECT_TIMEOUT bounds the handshake)")
    if "ConnectionError" in names or "TimeoutError" in names:
        return (f"cannot reach {_redis_where()}: {text} "
                "(is redis-server running there? check REDIS_URL, or unset it to run embedded)")
    if "OutOfMemoryError" in names or text.startswith("OOM"):
        return (f"{_redis_where()} is out of memory: {text} (nothing was written; free memory -- expire or delete "
                "keys, `robot-lab dlq purge` -- or raise maxmemory, then retry)")
    if text.startswith("NOPERM"):
        return f"{_redis_where()} denied a command to this user: {text} (grant the ACL user ~* &* +@all)"
    return f"{_redis_where()} answered an error: {text}"


def _from_settings(exc: BaseException) -> str | None:
    """A pydantic ValidationError of the settings: name the setting, its env var and value."""
    if type(exc).__name__ != "ValidationError" or not type(exc).__module__.startswith("pydantic"):
        return None
    try:
        first = exc.errors()[0]  # type: ignore[attr-defined]
    except Exception:
        return None
    loc = [str(part) for part in first.get("loc", ())]
    name = ".".join(loc) or "?"
    env = "ROBOT_LAB_" + "__".join(loc).upper()
    more = len(exc.errors()) - 1  # type: ignore[attr-defined]
    also = f" (and {more} more)" if more > 0 else ""
    return (f"invalid setting {name} = {first.get('input')!r}: {first.get('msg')}{also} "
            f"(set by {env} or a robot_lab.yml config file)")


def one_line(exc: BaseException) -> str:
    """The single line printed for ``exc`` (``Error: `` is added by click)."""
    redis_line = _from_redis(exc) or _from_settings(exc)
    if redis_line is not None:
        return redis_line

    if isinstance(exc, RobotLabError):
        return _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename or _first_line(exc)}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or _first_line(exc)}"
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        frame = frames[-1]
        where = f" at {frame.filename}:{frame.lineno}"
    return f"unexpected {type(exc).__name__}{where}: {_first_line(exc)} ({DEBUG_HINT})"
