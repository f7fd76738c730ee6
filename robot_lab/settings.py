"""Settings, layered like the Ruby gem's Config (myway_config):

defaults < ``~/.config/robot_lab/robot_lab.yml`` < ``./config/robot_lab.yml``
< ``ROBOT_LAB_*`` environment (``__`` nests: ``ROBOT_LAB_SANDBOX__TIMEOUT=30``)
< constructor arguments.

File locations are resolved when a Settings object is built, not at import, so tests and
tools that change ``HOME`` or the working directory see their own files.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from robot_lab.redis_url import is_cluster_url

SCRIPTED_DEFAULT_MODEL = "scripted/echo"
DEFAULT_MAX_TOOL_ROUNDS = 25

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


def user_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "robot_lab" / "robot_lab.yml"


def project_config_file() -> Path:
    return Path.cwd() / "config" / "robot_lab.yml"


# Environment variables any skill may ask for by name without an operator grant: locale and
# time zone only (docs/security.md, "Skills").
SAFE_SKILL_ENV = ["LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ"]


class SandboxSettings(BaseModel):
    """The operator's ceiling every skill script is intersected with (all skills).

    A skill's ``SKILL.md`` only *asks*; it gets the intersection of what it asks for with
    this ceiling widened by ``skills.grants[<name>]`` (docs/skills.md, "Capabilities").
    """

    enabled: bool = True
    # Folders scripts may read (besides their own bundle and the conversation's workspace).
    # Empty by default: the worker's cwd (its .env, config) is not visible to any skill.
    fs_read: list[str] = Field(default_factory=list)
    fs_write: list[str] = Field(default_factory=list)
    network: bool = False
    # Host variables a skill may ask for with ``env: [NAME]`` (the locale and time zone).
    env: list[str] = Field(default_factory=lambda: list(SAFE_SKILL_ENV))
    # Host variables a skill may ask for with ``secrets: [NAME]``: none by default.
    secrets: list[str] = Field(default_factory=list)
    timeout: float = 60.0
    # What to do when bwrap is missing or cannot create namespaces: refuse to run the
    # script (an error text to the model) or run it unconfined with a warning.
    when_unavailable: Literal["refuse", "unconfined"] = "refuse"
    max_output_bytes: int = 64 * 1024
    # Resource limits of one script call (every mode). Processes (threads count too): a
    # cgroup pids limit where robot-lab may create one, and RLIMIT_NPROC inside bwrap's user
    # namespace (0 = no limit). Memory: RLIMIT_DATA of each process, in MiB (0 = no limit).
    max_processes: int = Field(default=256, ge=0)
    max_memory_mb: int = Field(default=2048, ge=0)
    # "auto": put each script call in a pids cgroup of its own when this process may create
    # one (under ``cgroup_parent``, else beside its own cgroup); "off": never.
    cgroup: Literal["auto", "off"] = "auto"
    cgroup_parent: str | None = None
    # Each conversation's working directory is mounted read-write and is the scripts' cwd;
    # false keeps scripts to the fs_read/fs_write grants alone.
    workspace: bool = True
    # Attachments given by path (a bus envelope's {"path": ...} included) must lie under
    # these roots, relative to the worker's cwd: name a shared uploads folder. Empty by
    # default, so no sender can copy the worker's own files (its cwd, .env) into a
    # workspace; attachments sent as bytes always work.
    attach_from: list[str] = Field(default_factory=list)
    max_attachment_bytes: int = 50 * 1024 * 1024
    # A workspace's quota: a script that makes it hold more is stopped (0 = no limit), and
    # workspaces untouched this many seconds are removed when another one is opened (0 = kept)
    workspace_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=0)
    workspace_max_files: int = Field(default=10_000, ge=0)
    workspace_ttl: int = Field(default=7 * 86_400, ge=0)


class SkillGrant(BaseModel):
    """What the operator lets one named skill have beyond ``sandbox`` (still only what the
    skill asks for): ``ROBOT_LAB_SKILLS__GRANTS='{"weather": {"network": true}}'``."""

    fs_read: list[str] = Field(default_factory=list)
    fs_write: list[str] = Field(default_factory=list)
    network: bool = False
    env: list[str] = Field(default_factory=list)
    secrets: list[str] = Field(default_factory=list)


class MatchRule(BaseModel):
    """Which skills a message gets: the best-scoring one when at or above ``floor``, plus
    any other within ``margin`` of it (and above the floor); a skill already chosen in the
    conversation stays until another beats it by ``switch_margin``."""

    floor: float
    margin: float = 0.05
    switch_margin: float = 0.05
    # how a skill is scored: "description" (cosine with the whole description) or "blend"
    # (its mean with the best cosine over the description's sentences and trigger phrases)
    scoring: Literal["description", "blend"] = "description"


# Per-model match rules (chosen on tests/skills_eval and a public collection, see
# docs/skills.md "The match rule, and the evidence for it"). A configured
# ``skills.match_rules`` adds to these rather than replacing them.
DEFAULT_MATCH_RULES: dict[str, MatchRule] = {
    "sentence-transformers/all-MiniLM-L6-v2": MatchRule(floor=0.22, margin=0.05, switch_margin=0.05, scoring="blend"),
    "BAAI/bge-small-en-v1.5": MatchRule(floor=0.70, margin=0.03, switch_margin=0.03),
    "tfidf": MatchRule(floor=0.29, margin=0.0, switch_margin=0.05),
}


class SkillsSettings(BaseModel):
    roots: list[str] = Field(default_factory=list)
    embedding_model: str = "BAAI/bge-small-en-v1.5"
    embedding_model_path: str | None = None
    # The floor of an embedding model that has no match rule (the Ruby gem's 0.70, which suits
    # bge-small); the shipped models' floors are in DEFAULT_MATCH_RULES.
    default_floor: float = 0.70
    max_instructions_chars: int = 50_000
    max_scripts: int = 10
    # "fastembed" (falls back to "tfidf" with a warning when the model cannot load) or "tfidf".
    embedder: Literal["fastembed", "tfidf"] = "fastembed"
    # fastembed may fetch a model from the network only when this is on; offline by default.
    allow_model_download: bool = False
    # Seconds a description vector stays in Redis (refreshed whenever written).
    embedding_cache_ttl: int = 30 * 86_400
    # onnxruntime intra-op threads. 1 is fastest for one short query per run (no thread
    # hand-off; ~6 ms vs ~14 ms on a busy 2-core box); None lets onnxruntime use every core.
    embedding_threads: int | None = 1

    # Per-model match rules, added to DEFAULT_MATCH_RULES; a model with no rule uses its
    # threshold as the floor.
    match_rules: dict[str, MatchRule] = Field(default_factory=lambda: dict(DEFAULT_MATCH_RULES))
    # The Python that runs skill scripts (``#!/usr/bin/env python3`` and ``.py``): None is the
    # interpreter robot-lab runs under; ``root_python`` sets one per skills root folder.
    python: str | None = None
    root_python: dict[str, str] = Field(default_factory=dict)
    # Conversation working directories live here (None: <tmp>/robot_lab-workspaces).
    workspace_root: str | None = None
    # The read_skill_file tool returns at most this many bytes of a bundle file.
    max_file_read_bytes: int = 64 * 1024
    # While a skill is in play the model also gets read_file, write_file, list_files and
    # run_command over the workspace, run in the sandbox like scripts (false: none).
    workspace_tools: bool = True
    # At most this many skills are injected into one run (the best-scoring first).
    max_selected: int = Field(default=3, ge=1)
    # Skills (front-matter names) whose ``trust: core`` is honoured: they run unconfined with
    # the worker's environment. Empty by default: ``trust: core`` alone is only a request.
    core_trusted: list[str] = Field(default_factory=list)
    # Per-skill additions to the sandbox ceiling (network, env, secrets, fs paths).
    grants: dict[str, SkillGrant] = Field(default_factory=dict)

    def threshold_for(self, model: str) -> float:
        """The floor of ``model``'s match rule."""
        return self.rule_for(model).floor

    def rule_for(self, model: str, threshold: float | None = None) -> MatchRule:
        """The match rule of ``model`` (configured, else shipped, else ``default_floor``); an
        explicit ``threshold`` becomes the floor."""
        rule = self.match_rules.get(model) or DEFAULT_MATCH_RULES.get(model) or MatchRule(
            floor=self.default_floor)
        return rule if threshold is None else rule.model_copy(update={"floor": float(threshold)})


class BusSettings(BaseModel):
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


VerifyMode = Literal["off", "warn", "require"]


class SigningSettings(BaseModel):
    """Signed envelopes (docs/security.md): the keys of each sender and how robots check them.

    ``keys`` maps a sender id (a robot or client name, the envelope's ``from``) to its keys by
    key id; ``current`` names the key id a sender signs with (default: its last key listed).
    ``keys_dir`` adds keys from files (a mounted Kubernetes Secret): ``<dir>/<sender>/<key_id>``
    or ``<dir>/<sender>.<key_id>``, each file holding one secret. A verifier accepts any key of
    the sender, which is what makes rotation possible."""

    # off: nothing is checked; warn: a bad or missing signature is logged (bus.unauthenticated)
    # and the message runs; require: it is dead-lettered as unauthenticated, no model call.
    verify: VerifyMode = "off"
    # per-robot override of ``verify`` (robot name -> mode). In settings, not in the robot's
    # spec: specs live in Redis, where a writer could switch its own check off.
    robots: dict[str, VerifyMode] = Field(default_factory=dict)
    keys: dict[str, dict[str, SecretStr]] = Field(default_factory=dict)
    current: dict[str, str] = Field(default_factory=dict)
    keys_dir: str | None = None
    # seconds between re-reads of keys_dir (a rotated Secret shows up without a restart)
    reload_interval: float = 30.0

    def mode_for(self, robot: str) -> VerifyMode:
        return self.robots.get(robot, self.verify)


class BudgetSettings(BaseModel):
    """Shared token/cost budgets (docs/safety.md)."""

    # Output tokens a call's reservation counts when the call sets no max_tokens.
    default_output_tokens: int = Field(default=1024, ge=1)
    # Seconds a call that does not fit waits for reservations in flight to come back
    # before it fails with BudgetExceeded.
    wait_timeout: float = Field(default=120.0, ge=0)


class DurableSettings(BaseModel):
    """Step journals and human input (docs/durable.md)."""

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
    answerers: dict[str, list[str]] = Field(default_factory=dict)


class WorkerSettings(BaseModel):
    """``robot-lab worker`` (docs/operations.md, "In flight per worker")."""

    # Bus messages per served robot, and network tasks, that one worker process runs at once
    # (each on a thread of its own; model calls wait on the network, not the CPU).
    in_flight: int = Field(default=16, ge=1)


class A2ASettings(BaseModel):
    """``robot-lab a2a`` (docs/a2a.md): who may call it, and how long a task waits.

    ``tokens`` maps a caller's name to its secret (the name is logged, the secret never);
    ``tokens_dir`` adds one caller per file (a mounted Kubernetes Secret: file name = caller,
    content = secret), re-read on change. A caller presents its secret as
    ``Authorization: Bearer <secret>`` or in the ``api_key_header``. With no token at all the
    server refuses to start unless ``anonymous`` is set (a trusted network only)."""

    tokens: dict[str, SecretStr] = Field(default_factory=dict)
    tokens_dir: str | None = None
    api_key_header: str = "X-API-Key"
    anonymous: bool = False
    # the agent cards (``/.well-known/agent-card.json``) are readable without a token
    public_card: bool = True
    # the bus sender the tier publishes as (its signing key, its Redis ACL user's reply streams)
    sender: str = "a2a"
    # seconds a blocking message/send waits before it returns the task still working
    send_timeout: float = Field(default=600.0, gt=0)
    # seconds a robot has to take a message up before it is dead-lettered as expired; 0 = none
    robot_deadline: float = Field(default=0.0, ge=0)
    # seconds task records (and robot reply streams) are kept
    task_ttl: int = Field(default=7 * 24 * 3600, ge=60)
    # the calling side (a robot's ``a2a_agents``): per-call timeout, retries of a failed
    # connection or 5xx, and the token it presents (by agent URL prefix)
    client_timeout: float = Field(default=120.0, gt=0)
    client_retries: int = Field(default=2, ge=0)
    client_tokens: dict[str, SecretStr] = Field(default_factory=dict)


class Endpoint(BaseModel):
    """Where one model is served: an OpenAI-compatible server's base URL and its key (none
    for a keyless local server). ``endpoints`` maps a model name, as robots write it
    (``openai/qwen2.5``), to one."""

    api_base: str | None = None
    api_key: SecretStr | None = None


class Settings(BaseSettings):
    """All of robot-lab's settings; see the module docstring for the layering."""

    model_config = SettingsConfigDict(
        env_prefix="ROBOT_LAB_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    model: str | None = None
    provider: str | None = None
    # One model call: each request times out after request_timeout s; at most max_retries
    # more requests follow (litellm itself never retries); all of it within call_deadline s.
    request_timeout: float = 120.0
    call_deadline: float = Field(default=300.0, gt=0)
    max_retries: int = 3
    retry_interval: float = 1.0
    retry_backoff_factor: float = 2.0
    retry_interval_randomness: float = 0.5
    allow_model_requests: bool = True
    # Per-model endpoints (docs/robot.md, "Pointing a robot at a server"); a robot's own
    # api_base / api_key win.
    endpoints: dict[str, Endpoint] = Field(default_factory=dict)

    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("ROBOT_LAB_REDIS_URL", "REDIS_URL", "redis_url")
    )
    key_prefix: str = "robot_lab"
    # Redis Cluster: wrap each robot / run / scope in a hash tag so multi-key scripts stay in
    # one slot. Implied by a redis+cluster:// URL; set it when a proxy hides the cluster.
    cluster: bool = False
    app: str | None = None
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
    redis_connect_timeout: float = Field(default=10.0, gt=0)
    # Critical writes (a task's recorded result, memory compare-and-set) wait until this many
    # replicas acknowledged them (Redis WAIT, at most redis_wait_timeout_ms), so a failover
    # right after cannot lose them. 0 = off (Redis replication is asynchronous). Not applied
    # on Redis Cluster clients (connection.durable explains why).
    redis_wait_replicas: int = 0
    redis_wait_timeout_ms: int = 500

    template_path: list[str] = Field(default_factory=lambda: ["prompts"])
    # the Ruby gem's max_iterations bounded its network's router loop; networks here are DAGs
    # (no loop to bound), so setting it is an error rather than a silent no-op.
    max_iterations: int | None = None
    # The bottom of the run cascade: a tool loop always ends (the Ruby gem's max_tool_iterations).
    max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    # stored conversation history (bus conversations continued on any worker): at most this
    # many messages are kept, the oldest turns dropped whole; 0 = no cap
    conversation_max_messages: int = 200
    # ... and at most this many bytes of JSON (the oldest turns dropped whole; a single turn
    # larger than this is kept alone); 0 = no cap
    conversation_max_bytes: int = Field(default=1_048_576, ge=0)
    # seconds a stored conversation lives after its last save (each save renews it)
    conversation_ttl: int = Field(default=7 * 86_400, ge=1)
    # The global parents of a run's `tools` / `mcp` "inherit" (the Ruby gem's config.tools / .mcp).
    tools: str | list[str] = "none"
    mcp: str | list[str] = "none"
    # MCP connections a process shares between the robots it builds per task / slot
    # (runtime/mcp/pool.py): at most this many robot server sets kept, each closed when idle.
    mcp_pool_size: int = Field(default=32, ge=1)
    mcp_idle_timeout: float = Field(default=300.0, gt=0)

    log_level: str = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"

    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    skills: SkillsSettings = Field(default_factory=SkillsSettings)
    bus: BusSettings = Field(default_factory=BusSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    signing: SigningSettings = Field(default_factory=SigningSettings)
    durable: DurableSettings = Field(default_factory=DurableSettings)
    a2a: A2ASettings = Field(default_factory=A2ASettings)

    @field_validator("max_iterations")
    @classmethod
    def _no_max_iterations(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError(
                "max_iterations is not supported: robot-lab networks are DAGs with no router loop to bound; "
                "use max_tool_rounds to bound a robot's tool loop"
            )
        return value

    @field_validator("max_tool_rounds")
    @classmethod
    def _positive_rounds(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"max_tool_rounds must be >= 1, got {value}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: constructor > env > project file > user file > defaults.
        return (
            init_settings,
            env_settings,
            YamlConfigSettingsSource(settings_cls, yaml_file=project_config_file()),
            YamlConfigSettingsSource(settings_cls, yaml_file=user_config_file()),
        )

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


def _setting_paths(model: type[BaseModel], prefix: str = "") -> tuple[set[str], set[str]]:
    """The env names (upper case, without ``ROBOT_LAB_``) the fields of ``model`` answer to
    (``BUS``, ``BUS__MAXLEN``, ...), and those of them that are dicts (any sub-key goes)."""
    paths: set[str] = set()
    dicts: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name.upper()}"
        paths.add(path)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sub_paths, sub_dicts = _setting_paths(annotation, f"{path}__")
            paths |= sub_paths
            dicts |= sub_dicts
        elif get_origin(annotation) is dict:
            dicts.add(path)
    return paths, dicts


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``ROBOT_LAB_*`` variables that no setting reads (a misspelling is otherwise silently
    ignored), each with the closest known name, or None. Values are never looked at."""
    env = os.environ if environ is None else environ
    known, dicts = _setting_paths(Settings)
    # compared without the common prefix, which would make every name look close
    candidates = sorted(known | {v[len("ROBOT_LAB_"):] for v in OTHER_VARIABLES})
    unknown: list[tuple[str, str | None]] = []
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith("ROBOT_LAB_") or upper in OTHER_VARIABLES or upper.startswith(OTHER_PREFIXES):
            continue
        path = upper[len("ROBOT_LAB_"):]
        if path in known or any(path.startswith(f"{d}__") for d in dicts):
            continue
        close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.75)
        unknown.append((name, f"ROBOT_LAB_{close[0]}" if close else None))
    return unknown


_settings: Settings | None = None


def get_settings() -> Settings:
    """The process-wide settings, built on first use."""
    global _settings
    if _settings is None:
        _settings = Settings()
    return _settings


def configure(**overrides: Any) -> Settings:
    """Replace the process-wide settings (the Ruby gem's ``RobotLab.configure``)."""
    global _settings
    _settings = Settings(**overrides)
    return _settings


def reload_settings() -> Settings:
    """Re-read files and environment (the Ruby gem's ``reload_config!``)."""
    global _settings
    _settings = None
    return get_settings()
