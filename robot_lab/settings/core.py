"""The top-level scalar settings, declared without pydantic, and the light view built from them.

:class:`CoreSettings` declares the settings that are one plain value each (a string, number,
flag or choice: ``redis_url``, ``key_prefix``, ``log_level``, ``request_timeout``, ...). It is
the one definition of those fields: :class:`robot_lab.settings.models.Settings` inherits it
(pydantic collects the annotations of a plain base class), and :func:`light_values` reads the
same annotations and defaults to serve those fields without importing pydantic.

Why: pydantic, pydantic-settings and building the settings models cost about 0.1-0.2 s of CPU
in every process, as much as all of ``rq info``; ``robot-lab status``, ``runs`` and ``send``
read only a few of these fields (bench/startup.py).

:func:`light_values` answers only when its answer is certainly the one pydantic-settings would
give: no config file exists, every ``ROBOT_LAB_*`` variable (and ``REDIS_URL``) names one of
these fields, and every such value is in a form whose conversion is plain (``"10"``,
``"0.5"``, ``"true"``, a listed choice). Anything else -- a config file, a section variable
(``ROBOT_LAB_BUS__MAXLEN``), an unusual spelling (``"1e3"``, ``" 10"``), a value out of range
-- returns None and the caller builds the full pydantic Settings, which reads and validates
every layer as before (and raises its ValidationError).
"""

from __future__ import annotations

import copy
import os
import re
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

from robot_lab.redis_url import is_cluster_url

if TYPE_CHECKING:  # named in SigningCore's annotations; pydantic resolves them where Settings is defined
    from pydantic import SecretStr  # noqa: F401

SCRIPTED_DEFAULT_MODEL = "scripted/echo"
DEFAULT_MAX_TOOL_ROUNDS = 25
ENV_PREFIX = "ROBOT_LAB_"

# Provider key -> model used when ROBOT_LAB_MODEL is unset but that key is present.
PROVIDER_DEFAULT_MODELS: tuple[tuple[str, str], ...] = (
    ("ANTHROPIC_API_KEY", "anthropic/claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai/gpt-4o-mini"),
    ("GEMINI_API_KEY", "gemini/gemini-2.0-flash"),
    ("MISTRAL_API_KEY", "mistral/mistral-small-latest"),
    ("DEEPSEEK_API_KEY", "deepseek/deepseek-chat"),
    ("OPENROUTER_API_KEY", "openrouter/openai/gpt-4o-mini"),
    ("XAI_API_KEY", "xai/grok-2-latest"),
)

# Environment variables any skill may ask for by name without an operator grant: locale and
# time zone only (docs/security.md, "Skills").
SAFE_SKILL_ENV = ["LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ"]

# ROBOT_LAB_* variables read outside Settings (by one module each), so not misspellings.
OTHER_VARIABLES = frozenset({
    "ROBOT_LAB_DEMO_DELAY_MS", "ROBOT_LAB_TASK_LEASE_MS", "ROBOT_LAB_TASK_MAX_ATTEMPTS",
    "ROBOT_LAB_DASHBOARD_TOKEN", "ROBOT_LAB_SCRIPTS_DIR", "ROBOT_LAB_SCRIPTED_RECORD",
    "ROBOT_LAB_WORKER_PREFIX",
    # read by examples/node/publish.mjs (a signing Node publisher), not by Python
    "ROBOT_LAB_FROM", "ROBOT_LAB_KEY", "ROBOT_LAB_KEY_ID",
})
# Test and benchmark knobs, and the Redis ACL passwords `robot-lab acl --apply` reads: never settings.
OTHER_PREFIXES = ("ROBOT_LAB_TEST_", "ROBOT_LAB_PROPERTY_", "ROBOT_LAB_FUZZ_", "ROBOT_LAB_SCREENSHOTS", "ROBOT_LAB_BENCH_",
                  "ROBOT_LAB_ACL_PASSWORD_")


def user_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "robot_lab" / "robot_lab.yml"


def project_config_file() -> Path:
    return Path.cwd() / "config" / "robot_lab.yml"


def is_other_variable(name: str) -> bool:
    """A ``ROBOT_LAB_*`` name that robot-lab reads outside Settings (or a test knob)."""
    upper = name.upper()
    return upper in OTHER_VARIABLES or upper.startswith(OTHER_PREFIXES)


class Bound:
    """A lower bound on a number field (``Annotated[float, Bound(gt=0)]``): pydantic enforces it
    as it does ``Field(gt=0)`` (same errors, same JSON schema) through annotated_types, which
    is imported only when pydantic builds the schema; :func:`light_values` checks it itself."""

    __slots__ = ("gt", "ge")

    def __init__(self, *, gt: float | None = None, ge: float | None = None) -> None:
        self.gt, self.ge = gt, ge

    def allows(self, value: float) -> bool:
        return (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        import annotated_types  # pydantic is building a schema: its dependency is loaded

        markers = [annotated_types.Gt(self.gt)] if self.gt is not None else []
        markers += [annotated_types.Ge(self.ge)] if self.ge is not None else []
        return handler(Annotated[(source, *markers)])

    def __repr__(self) -> str:
        return f"Bound(gt={self.gt!r})" if self.gt is not None else f"Bound(ge={self.ge!r})"


class CoreSettings:
    """The top-level settings that are one plain value each (see the module docstring).

    Constraints are :class:`Bound` markers, which pydantic enforces and :func:`light_values`
    checks. A field with other validation (a validator) belongs on ``Settings``.
    """

    # Names a field also answers to besides ROBOT_LAB_<NAME> (Settings gives pydantic the
    # same tuple as the field's validation aliases, first wins).
    ENV_ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {
        "redis_url": ("ROBOT_LAB_REDIS_URL", "REDIS_URL", "redis_url"),
    }

    model: str | None = None
    provider: str | None = None
    # One model call: each request times out after request_timeout s; at most max_retries
    # more requests follow (litellm itself never retries); all of it within call_deadline s.
    request_timeout: float = 120.0
    call_deadline: Annotated[float, Bound(gt=0)] = 300.0
    max_retries: int = 3
    retry_interval: float = 1.0
    retry_backoff_factor: float = 2.0
    retry_interval_randomness: float = 0.5
    allow_model_requests: bool = True

    redis_url: str | None = None  # also REDIS_URL (ENV_ALIASES)
    key_prefix: str = "robot_lab"
    # Redis Cluster: wrap each robot / run / scope in a hash tag so multi-key scripts stay in
    # one slot. Implied by a redis+cluster:// URL; set it when a proxy hides the cluster.
    cluster: bool = False
    app: str | None = None
    # The build id this process serves and submits runs on (network/builds.py); None: a
    # hash of the robot-lab version and the app's robots, tools and their schemas.
    build: str | None = None
    # Worker health: seconds between heartbeats (Redis key TTL = 3 beats) and the folder of
    # the heartbeat files `robot-lab health` reads (liveness probes); None = a folder per user and
    # key prefix, <tmp>/robot-lab-health-<uid>/<prefix> (workers/health.py).
    worker_heartbeat: float = 5.0
    health_dir: str | None = None
    # Riding out Redis outages (restart, failover): long-running loops retry with a capped
    # exponential backoff with jitter, first delay ~redis_retry_initial, at most redis_retry_max.
    redis_retry_initial: float = 0.2
    redis_retry_max: float = 5.0
    # seconds to open a connection to Redis: TCP connect and, for rediss://, the TLS handshake
    # (a rediss:// URL on a plain Redis port would otherwise wait forever for a ServerHello)
    redis_connect_timeout: Annotated[float, Bound(gt=0)] = 10.0
    # Critical writes (a task's recorded result, memory compare-and-set) wait until this many
    # replicas acknowledged them (Redis WAIT, at most redis_wait_timeout_ms), so a failover
    # right after cannot lose them. 0 = off (Redis replication is asynchronous). Not applied
    # on Redis Cluster clients (connection.durable explains why).
    redis_wait_replicas: int = 0
    redis_wait_timeout_ms: int = 500

    # The bottom of the run cascade: a tool loop always ends (the Ruby gem's max_tool_iterations).
    max_tool_rounds: Annotated[int, Bound(ge=1)] = DEFAULT_MAX_TOOL_ROUNDS
    # stored conversation history (bus conversations continued on any worker): at most this
    # many messages are kept, the oldest turns dropped whole; 0 = no cap
    conversation_max_messages: int = 200
    # ... and at most this many bytes of JSON (the oldest turns dropped whole; a single turn
    # larger than this is kept alone); 0 = no cap
    conversation_max_bytes: Annotated[int, Bound(ge=0)] = 1_048_576
    # seconds a stored conversation lives after its last save (each save renews it)
    conversation_ttl: Annotated[int, Bound(ge=1)] = 7 * 86_400
    # MCP connections a process shares between the robots it builds per task / slot
    # (runtime/mcp/pool.py): at most this many robot server sets kept, each closed when idle.
    mcp_pool_size: Annotated[int, Bound(ge=1)] = 32
    mcp_idle_timeout: Annotated[float, Bound(gt=0)] = 300.0

    log_level: str = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"
    # The global parents of a run's `tools` / `mcp` "inherit" (the Ruby gem's config.tools /
    # .mcp). Light only at their defaults: a value from the environment (a name or a JSON
    # list) is pydantic-settings' to parse, so it builds the full Settings.
    tools: str | list[str] = "none"
    mcp: str | list[str] = "none"

    def default_model(self) -> str:
        """``model`` if set, else the first provider whose key is present, else scripted."""
        if self.model:
            return self.model
        for env_key, model in PROVIDER_DEFAULT_MODELS:
            if os.environ.get(env_key):
                return model
        return SCRIPTED_DEFAULT_MODEL

    @property
    def cluster_keys(self) -> bool:
        """Whether keys need cluster hash tags (``cluster`` or a ``redis+cluster://`` URL)."""
        return self.cluster or is_cluster_url(self.redis_url)

    @property
    def embedded(self) -> bool:
        """No REDIS_URL: run on in-process fakeredis."""
        return not self.redis_url


VerifyMode = Literal["off", "warn", "require"]


class BusCore:
    """The fields of ``BusSettings`` (the ``bus`` section), declared without pydantic so that
    a process that configured no ``bus`` setting reads its defaults without building models."""

    maxlen: int = 10_000
    max_deliveries: int = 5
    visibility_timeout: float = 30.0
    batch_size: int = 16
    block_ms: int = 1_000
    reply_ttl: int = 86_400
    # first retry of a failed (nacked) delivery after retry_delay s, doubling, capped at 30 s
    retry_delay: float = 0.2
    dlq_maxlen: int = 10_000
    # an envelope larger than this (bytes of its JSON) is refused by publish and
    # dead-lettered as too_large by a consumer (raw XADD publishers)
    max_envelope_bytes: int = 1_048_576
    # how long a handled message's recorded reply is kept (the idempotency window of
    # redeliveries and of a sender re-publishing the same id)
    record_ttl: int = 3_600
    # inboxes (names or fnmatch globs) a message may name as its reply_to besides its own
    # sender's inbox and _reply.* streams; any other reply_to is dead-lettered reply_refused
    reply_to_allowed: list[str] = []
    # an envelope whose `to` names another robot than the inbox it was read from:
    # dead_letter (reason misaddressed, before any handler) or warn (log bus.misaddressed and
    # handle it, the Ruby gem's behaviour). Under signing require it is always dead-lettered.
    misaddressed: Literal["dead_letter", "warn"] = "dead_letter"
    # Files a run wrote come back in its reply's ``attachments``: inline (base64) while the
    # reply's files add up to at most attachment_inline_bytes, else stored in Redis for
    # file_ttl seconds as a reference (``robot-lab files get``); larger than max_file_bytes:
    # listed only.
    attachment_inline_bytes: int = 256 * 1024
    file_ttl: int = 86_400
    max_file_bytes: int = 50 * 1024 * 1024


class SigningCore:
    """The fields of ``SigningSettings`` (the ``signing`` section; see its docstring), declared
    without pydantic like :class:`BusCore`. Mutable defaults are copied per instance (pydantic
    copies them; :func:`section_defaults` too)."""

    # off: nothing is checked; warn: a bad or missing signature is logged (bus.unauthenticated)
    # and the message runs; require: it is dead-lettered as unauthenticated, no model call.
    verify: VerifyMode = "off"
    # per-robot override of ``verify`` (robot name -> mode). In settings, not in the robot's
    # spec: specs live in Redis, where a writer could switch its own check off.
    robots: dict[str, VerifyMode] = {}
    keys: dict[str, dict[str, SecretStr]] = {}
    current: dict[str, str] = {}
    keys_dir: str | None = None
    # seconds between re-reads of keys_dir (a rotated Secret shows up without a restart)
    reload_interval: float = 30.0

    def mode_for(self, robot: str) -> VerifyMode:
        return self.robots.get(robot, self.verify)


class DurableCore:
    """The fields of ``DurableSettings`` (the ``durable`` section: step journals and human
    input, docs/durable.md), declared without pydantic like :class:`BusCore`: every network
    task reads ``on_divergence`` for its journal, and a worker that configured no ``durable``
    setting should not build the whole pydantic Settings for it on its first task."""

    # A replayed step whose request differs from the journal: "error" fails the run naming
    # the step; "live" drops the journal from that step on and continues live.
    on_divergence: Literal["error", "live"] = "error"
    # Seconds an input request waits before its default answer (or, with none, a task
    # failure); None waits as long as the run's keys live (7 days). Per tool, robot, task
    # or run: the ``input_timeout`` tool attribute / RunConfig field wins.
    input_timeout: float | None = None
    # A denied approval: "refuse" gives the model a refusal text, "fail" fails the task.
    on_deny: Literal["refuse", "fail"] = "refuse"
    # Under signing.verify=require: robot -> senders (fnmatch globs) whose signed `answer`
    # envelopes may answer that robot's requests; "*" names every robot.
    answerers: dict[str, list[str]] = {}
    # The longest answer a person may give (characters): a longer one is refused with an
    # error to the answerer, so it never reaches the prompt (robot_lab/inputs.py).
    max_answer_chars: int = 10_000


# Sections whose defaults LightSettings serves without pydantic (what a Bus reads when built,
# what a network task reads)
LIGHT_SECTIONS: dict[str, type] = {"bus": BusCore, "signing": SigningCore, "durable": DurableCore}


def section_defaults(core: type) -> Any:
    """An instance of a section's pydantic-free class holding (copies of) its defaults."""
    section = core.__new__(core)
    for name in core.__annotations__:
        value = getattr(core, name)
        section.__dict__[name] = value if isinstance(value, (str, int, float, bool, type(None))) else copy.deepcopy(value)
    return section


_fields: dict[str, Any] | None = None


def core_fields() -> dict[str, Any]:
    """Field name -> its annotation (with ``Annotated`` extras), in declaration order."""
    global _fields
    if _fields is None:
        hints = get_type_hints(CoreSettings, globalns=vars(sys.modules[__name__]), include_extras=True)
        _fields = {name: hint for name, hint in hints.items() if get_origin(hint) is not ClassVar}
    return _fields


def env_names(field: str) -> tuple[str, ...]:
    """The variable names (lower case, as pydantic-settings matches them) a field reads, first wins."""
    aliases = CoreSettings.ENV_ALIASES.get(field)
    return tuple(a.lower() for a in aliases) if aliases else (f"{ENV_PREFIX}{field}".lower(),)


class _NotPlain(Exception):
    """A value whose conversion is left to pydantic."""


_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _convert(hint: Any, value: Any) -> Any:
    """``value`` converted as pydantic's lax mode converts it, for the plain cases only."""
    checks: tuple[Any, ...] = ()
    if get_origin(hint) is Annotated:
        hint, *metadata = get_args(hint)
        checks = tuple(metadata)
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(hint) if a is not type(None)]
        if len(members) != len(get_args(hint)) - 1 or len(members) != 1:
            raise _NotPlain(hint)
        if value is None:
            return None
        hint, origin = members[0], get_origin(members[0])
    if origin is Literal:
        if isinstance(value, str) and value in get_args(hint):
            return value
        raise _NotPlain(value)
    if hint is str:
        if type(value) is str:
            return value
    elif hint is bool:
        if type(value) is bool:
            return value
        if type(value) is str and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
    elif hint is int:
        if type(value) is int:
            result: Any = value
        elif type(value) is str and _INT.fullmatch(value):
            result = int(value)
        else:
            raise _NotPlain(value)
        return _checked(result, checks)
    elif hint is float:
        if type(value) in (int, float):
            return _checked(float(value), checks)
        if type(value) is str and _FLOAT.fullmatch(value):
            return _checked(float(value), checks)
    raise _NotPlain(value)


def _checked(value: float, checks: tuple[Any, ...]) -> Any:
    for check in checks:
        if not isinstance(check, Bound) or not check.allows(value):
            raise _NotPlain(value)  # out of bounds (pydantic words the error) or a check of its own
    return value


def light_values(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Every :class:`CoreSettings` field's value from the environment and the defaults, or
    None when only the full Settings can say (see the module docstring)."""
    env = os.environ if environ is None else environ
    fields = core_fields()
    wanted = {name: field for field in fields for name in env_names(field)}
    found: dict[str, tuple[int, str]] = {}  # field -> (alias rank, value)
    seen: set[str] = set()
    for name, value in env.items():
        low = name.lower()
        field = wanted.get(low)
        if field is None:
            if low.startswith("robot_lab_") and not is_other_variable(name):
                return None  # a section, a complex field, or no setting at all: Settings decides
            continue
        if low in seen:
            return None  # two spellings of one variable: which one wins is pydantic-settings' business
        seen.add(low)
        rank = env_names(field).index(low)
        if field not in found or rank < found[field][0]:
            found[field] = (rank, value)
    if user_config_file().exists() or project_config_file().exists():
        return None
    values: dict[str, Any] = {}
    try:
        for field, hint in fields.items():
            # a default is a value of its type already (and may be one _convert cannot parse)
            values[field] = _convert(hint, found[field][1]) if field in found else getattr(CoreSettings, field)
    except _NotPlain:
        return None
    return values
