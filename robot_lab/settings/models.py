"""The settings models (pydantic): the sections, and ``Settings``, layered like the Ruby gem's
Config (myway_config):

defaults < ``~/.config/robot_lab/robot_lab.yml`` < ``./config/robot_lab.yml``
< ``ROBOT_LAB_*`` environment (``__`` nests: ``ROBOT_LAB_SANDBOX__TIMEOUT=30``)
< constructor arguments.

The top-level plain fields are declared once in :class:`robot_lab.settings.core.CoreSettings`,
which ``Settings`` inherits; everything else is declared here. Import names from
:mod:`robot_lab.settings` (which loads this module, and pydantic, on first use).

File locations are resolved when a Settings object is built, not at import, so tests and
tools that change ``HOME`` or the working directory see their own files.
"""

from __future__ import annotations

import warnings
from typing import Literal, get_origin

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from robot_lab.settings.core import (
    SAFE_SKILL_ENV,
    BusCore,
    DurableCore,
    CoreSettings,
    SigningCore,
    project_config_file,
    user_config_file,
)

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
    # More globs (on a file's name or its path in the workspace) of files a run wrote that
    # are not returned, beside the built-in lock/temp ones (sandbox.workspace.IGNORED_OUTPUTS).
    result_ignore: list[str] = Field(default_factory=list)
    # A workspace's quota: a script that makes it hold more is stopped (0 = no limit), and
    # workspaces untouched this many seconds are removed when another one is opened (0 = kept)
    workspace_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=0)
    workspace_max_files: int = Field(default=10_000, ge=0)
    workspace_ttl: int = Field(default=7 * 86_400, ge=0)
    # The size of the sandbox's private /tmp (also HOME), a tmpfs: host memory that neither
    # the workspace quota nor max_memory_mb counts (0 = the kernel's default, half the RAM).
    tmp_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)


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


class BusSettings(BaseModel, BusCore):
    """The bus: inboxes, deliveries, replies, dead letters, files (fields: :class:`BusCore`)."""


class SigningSettings(BaseModel, SigningCore):
    """Signed envelopes (docs/security.md): the keys of each sender and how robots check them.

    ``keys`` maps a sender id (a robot or client name, the envelope's ``from``) to its keys by
    key id; ``current`` names the key id a sender signs with (default: its last key listed).
    ``keys_dir`` adds keys from files (a mounted Kubernetes Secret): ``<dir>/<sender>/<key_id>``
    or ``<dir>/<sender>.<key_id>``, each file holding one secret. A verifier accepts any key of
    the sender, which is what makes rotation possible. (Fields: :class:`SigningCore`.)"""


class BudgetSettings(BaseModel):
    """Shared token/cost budgets (docs/safety.md)."""

    # Output tokens a call's reservation counts when the call sets no max_tokens.
    default_output_tokens: int = Field(default=1024, ge=1)
    # Seconds a call that does not fit waits for reservations in flight to come back
    # before it fails with BudgetExceeded.
    wait_timeout: float = Field(default=120.0, ge=0)


class DurableSettings(BaseModel, DurableCore):
    """Step journals and human input (docs/durable.md; fields: :class:`DurableCore`)."""


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
    # the media types a message's parts may carry (the cards' input modes): a part of another
    # type is refused whole with ContentTypeNotSupportedError (-32005); a part that names no
    # type is taken by its kind (text, JSON data, a raw file)
    input_modes: list[str] = Field(default_factory=lambda: [
        "text/plain", "application/json", "text/markdown", "text/csv", "application/pdf", "image/png", "image/jpeg",
        "application/octet-stream",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"])
    # the cards are A2A 1.0 cards; on, they also declare the 0.3 JSON-RPC interface, which
    # makes the SDK add the 0.3 top-level fields (url, preferredTransport, ...) for clients that
    # read only 0.3 cards -- a card a strict 1.0 validator refuses (the 0.3 method names are
    # served either way)
    card_v03: bool = False
    # the largest request body read (bytes): a larger one gets HTTP 413 before it is read
    # whole, authenticated or parsed (the SDK holds a body many times over while parsing it)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # seconds a SIGTERM waits for requests in flight (a blocking message/send, a stream)
    # before they are cut: their tasks live in Redis, so a client reads them on from any process
    shutdown_grace: float = Field(default=5.0, ge=0)
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


warnings.filterwarnings(
    "ignore", message='Field name "redis_url" in "Settings" shadows an attribute in parent "CoreSettings"')


class Settings(BaseSettings, CoreSettings):
    """All of robot-lab's settings; see the module docstring for the layering. The top-level
    plain fields (and ``default_model``, ``cluster_keys``, ``embedded``) come from
    :class:`CoreSettings`."""

    model_config = SettingsConfigDict(
        env_prefix="ROBOT_LAB_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    # Per-model endpoints (docs/robot.md, "Pointing a robot at a server"); a robot's own
    # api_base / api_key win.
    endpoints: dict[str, Endpoint] = Field(default_factory=dict)

    # CoreSettings declares it; here it gets its aliases (REDIS_URL), which only pydantic's Field
    # can give (pydantic's warning about redeclaring an inherited field is filtered above)
    redis_url: str | None = Field(
        default=CoreSettings.redis_url, validation_alias=AliasChoices(*CoreSettings.ENV_ALIASES["redis_url"])
    )

    template_path: list[str] = Field(default_factory=lambda: ["prompts"])
    # the Ruby gem's max_iterations bounded its network's router loop; networks here are DAGs
    # (no loop to bound), so setting it is an error rather than a silent no-op.
    max_iterations: int | None = None
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


def setting_paths(model: type[BaseModel], prefix: str = "") -> tuple[set[str], set[str]]:
    """The env names (upper case, without ``ROBOT_LAB_``) the fields of ``model`` answer to
    (``BUS``, ``BUS__MAXLEN``, ...), and those of them that are dicts (any sub-key goes)."""
    paths: set[str] = set()
    dicts: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name.upper()}"
        paths.add(path)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            sub_paths, sub_dicts = setting_paths(annotation, f"{path}__")
            paths |= sub_paths
            dicts |= sub_dicts
        elif get_origin(annotation) is dict:
            dicts.add(path)
    return paths, dicts
