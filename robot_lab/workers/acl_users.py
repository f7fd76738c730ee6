"""Redis ACL users: one per robot worker, one per publisher, one for the coordinator.

The outer wall of docs/security.md (section 3): each process logs in to Redis as a user that
can touch only its own keys (names from :class:`robot_lab.keys.Keys`) and the few shared
structures the design needs, each listed in :data:`SHARED_FOR_WORKERS` with the reason.
Rules are Redis 7 ACL syntax (key selectors in parentheses, ``%W~`` = write-only keys);
``robot-lab acl`` prints them or applies them (``ACL SETUSER``). Passwords never appear in
the rules: they come from ``ROBOT_LAB_ACL_PASSWORD_<USER>`` or a passwords folder.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robot_lab.bus.names import check_robot_name
from robot_lab.errors import ConfigurationError
from robot_lab.keys import Keys, glob_escape

if TYPE_CHECKING:
    from robot_lab.connection import RedisClient

PASSWORD_ENV_PREFIX = "ROBOT_LAB_ACL_PASSWORD_"
COORDINATOR = "rl-coordinator"

# Commands nobody but an administrator needs. @dangerous covers FLUSHALL, KEYS, CONFIG,
# DEBUG, MONITOR, ACL, CLIENT KILL ...; SCAN and RANDOMKEY would list other robots' key
# names; FUNCTION would load code others may call. INFO (rq reads the server version) and
# CLIENT SETNAME / ID are given back. Lua (EVAL, EVALSHA) is allowed: each command a script
# runs is checked against the same rules, so a script can do no more than its caller.
_COMMANDS = ("-@all", "+@read", "+@write", "+@stream", "+@list", "+@hash", "+@set", "+@sortedset",
             "+@string", "+@keyspace", "+@transaction", "+@connection", "+@pubsub", "-@dangerous", "-scan",
             "-randomkey", "-function", "+info", "+client|setname", "+client|getname", "+client|id", "+eval", "+eval_ro",
             "+evalsha", "+evalsha_ro", "+script|load", "+script|exists", "+time")
# What a worker may do to any inbox besides its own: append (replies, delegation), and the
# commands of the APPEND_REPLY script (bus/stream_scripts.py) that creates a missing reply stream
# with a TTL. No read, no delete, no trim.
_APPEND_ANY_INBOX = "(~{bus}* +evalsha +exists +xadd +expire +ttl)"
_XADD_ANY_INBOX = "(%W~{bus}* +xadd +exists)"

# Shared by every worker, with the reason (printed by `robot-lab acl` and docs/security.md).
SHARED_FOR_WORKERS: tuple[tuple[str, str], ...] = (
    ("{p}:robots", "the registry set: a worker adds its robot's name at start"),
    ("{p}:robots:spawned", "robots spawned at run time (read by `worker --spawned`)"),
    ("{p}:worker:*", "worker heartbeats: the key names a process (host and pid), unknown in advance"),
    ("{p}:workers", "index of worker heartbeats"),
    ("{p}:run:*", "network runs: any worker's sweeper re-queues a task whose worker died, and a task "
                  "writes its run's events, results and lease"),
    ("{p}:runs", "run index (sweeper)"),
    ("{p}:runs:*", "active runs and the sweep lock (sweeper)"),
    ("{p}:builds:*", "tasks of pinned runs a worker of another build handed back; any sweeper re-enqueues them"),
    ("{p}:mem:*", "shared memory: a task reads and writes its run's or network's scope (any name)"),
    ("{p}:budget:*", "budgets shared by the robots of a run or network"),
    ("{p}:skills:emb:*", "content-addressed embedding cache of skill descriptions"),
    ("{p}:input:*", "input requests of parked runs: a task records its question, any worker's sweep times it out"),
    ("{p}:inputs:*", "the pending and deadline indexes of input requests"),
    ("{p}:durable:*", "step journals of durable runs (served messages: durable:bus:<robot>:...)"),
    ("{rq}:*", "rq's own keys (RQ_KEY_PREFIX, not robot-lab's; jobs, workers, registries); the sweeper re-queues any "
             "robot's lost task"),
)
SHARED_CHANNELS = ("{p}:mem:*", "{rq}:*")


def _rq_glob() -> str:
    """rq's key prefix as an ACL glob (``rq``, or ``{rq}`` on Redis Cluster)."""
    from robot_lab.rq_connection import rq_prefix  # lazy: start-up time

    return _glob(rq_prefix())


@dataclass(frozen=True, slots=True)
class AclUser:
    """One Redis user: its name, what it is for, and its ACL rules (no password)."""

    user: str
    role: str  # worker | publisher | coordinator
    subject: str  # the robot or publisher name ('' for the coordinator)
    rules: tuple[str, ...]

    @property
    def password_env(self) -> str:
        return PASSWORD_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", self.user).upper()

    def setuser(self, password: str) -> list[str]:
        """Arguments of ``ACL SETUSER`` (``reset`` first: applying twice gives the same user)."""
        return [self.user, "reset", "on", f">{password}", *self.rules]

    def printable(self) -> str:
        """A shell line that creates the user with ``redis-cli``, the password read from
        ``$ROBOT_LAB_ACL_PASSWORD_<USER>`` (never the password itself)."""
        rules = " ".join(shlex.quote(rule) for rule in self.rules)
        return (f'redis-cli -u "$REDIS_URL" ACL SETUSER {shlex.quote(self.user)} reset on '
                f'">${self.password_env}" {rules}')

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "role": self.role, "subject": self.subject, "rules": list(self.rules),
                "password_env": self.password_env}


_glob = glob_escape  # a literal part of an ACL key pattern


def _own_inbox(keys: Keys, name: str) -> list[str]:
    """The inbox itself (exact) and every other bus key of ``name`` (DLQ, conversation
    queue, reply records, outbox, parked messages and the conversations waiting on them),
    which live under ``<prefix>:robot:<name>:``: nothing but inboxes and reply streams is
    under ``<prefix>:bus:``, so ``XADD`` on ``bus:*`` reaches no robot's state."""
    return [f"~{_glob(keys.inbox(name))}", f"~{_glob(keys.bus_state(name))}:*"]


def _reply_streams(keys: Keys, name: str) -> str:
    """``Bus.request`` of sender ``name`` waits on ``<prefix>:bus:_reply.<name>.<id>``."""
    return f"~{_glob(keys.inbox(f'_reply.{name}.'))}*"


def worker_user(keys: Keys, robot: str) -> AclUser:
    """A worker serving ``robot``: all of its own keys, the shared structures, and append-only
    access to other inboxes (replies and delegated requests)."""
    p = _glob(keys.prefix)
    own = [*_own_inbox(keys, robot), _reply_streams(keys, robot)]  # <p>:robot:<robot>:* = spec, history too
    rq = _rq_glob()
    shared = [f"~{pattern.format(p=p, rq=rq)}" for pattern, _ in SHARED_FOR_WORKERS]
    channels = [f"&{pattern.format(p=p, rq=rq)}" for pattern in SHARED_CHANNELS]
    bus = f"{p}:bus:"
    rules = ("resetkeys", "resetchannels", *_COMMANDS, *own, *shared, *channels,
             _APPEND_ANY_INBOX.format(bus=bus), _XADD_ANY_INBOX.format(bus=bus))
    return AclUser(f"rl-worker-{robot}", "worker", robot, rules)


def publisher_user(keys: Keys, name: str) -> AclUser:
    """A service that publishes as ``name``: append to any inbox; read only its own inbox,
    outbox and reply streams; read the registry. No memory, runs, specs or rq."""
    p = _glob(keys.prefix)
    rules = ("resetkeys", "resetchannels", *_COMMANDS, *_own_inbox(keys, name), _reply_streams(keys, name),
             f"%R~{p}:robots", _XADD_ANY_INBOX.format(bus=f"{p}:bus:"))
    return AclUser(f"rl-pub-{name}", "publisher", name, rules)


def coordinator_user(keys: Keys) -> AclUser:
    """The coordinator, `robot-lab status`, dashboard and metrics: every key under the prefix
    and rq's (they read everything and submit runs to any robot); still no admin commands."""
    p = _glob(keys.prefix)
    rules = ("resetkeys", "resetchannels", *[c for c in _COMMANDS if c not in ("-scan",)],
             f"~{p}:*", f"~{_rq_glob()}:*", f"&{p}:*", f"&{_rq_glob()}:*")
    return AclUser(COORDINATOR, "coordinator", "", rules)


def acl_users(keys: Keys, robots: Iterable[str], publishers: Iterable[str] = (), *,
              coordinator: bool = True) -> list[AclUser]:
    users = [worker_user(keys, check_robot_name(r)) for r in dict.fromkeys(robots)]
    users += [publisher_user(keys, check_robot_name(n, "publisher")) for n in dict.fromkeys(publishers)]
    if coordinator:
        users.append(coordinator_user(keys))
    return users


def password_for(user: AclUser, env: dict[str, str], folder: Path | None) -> str:
    """The user's password: ``$ROBOT_LAB_ACL_PASSWORD_<USER>``, else ``<folder>/<user>``, else a
    new random one written there (mode 0600). Never printed."""
    if env.get(user.password_env):
        return env[user.password_env]
    if folder is None:
        raise ConfigurationError(f"no password for Redis user {user.user!r}: set ${user.password_env} or pass "
                                 "--passwords-dir (a new password is generated there)")
    path = folder / user.user
    if path.exists():
        return path.read_text().strip()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    password = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(password + "\n")
    return password


def apply_users(connection: RedisClient, users: list[AclUser], passwords: dict[str, str]) -> None:
    """``ACL SETUSER`` each user (as an admin connection)."""
    for user in users:
        connection.execute_command("ACL", "SETUSER", *user.setuser(passwords[user.user]))
