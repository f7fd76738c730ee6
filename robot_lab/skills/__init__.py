"""AgentSkills: ``SKILL.md`` bundles, their catalog, embedding matching, the model-invoked
``Skill`` tool, and script tools confined by bubblewrap.

Depends only on ``robot_lab.errors/settings/logging/keys/connection/text`` (never the runtime,
which uses this package); the tools here are duck-typed (``name``, ``description``,
``parameters``, ``call(arguments) -> str``). fastembed is imported only when an embedding
model is first loaded. See docs/skills.md.
"""

from __future__ import annotations

from robot_lab.sandbox.capabilities import DEFAULT_TIMEOUT, TRUST_LEVELS, Capabilities
from robot_lab.skills.catalog import (
    ENTRY_POINT_GROUP,
    Problem,
    Root,
    SkillCatalog,
    default_catalog,
    default_roots,
    reset_default_catalog,
)
from robot_lab.skills.embedding import (
    Embedder,
    EmbeddingCache,
    FakeEmbedder,
    FastEmbedEmbedder,
    TfidfEmbedder,
    load_embedder,
)
from robot_lab.skills.file_tool import SkillFileTool
from robot_lab.sandbox.limits import Limits, limit_status
from robot_lab.skills.matching import (
    SkillInjection,
    SkillMatcher,
    allowed_tool_names,
    compose_system_prompt,
    default_matcher,
    filter_tools,
    reset_default_matcher,
    select,
)
from robot_lab.sandbox.sandbox import Outcome, bwrap_status
from robot_lab.skills.script_tool import ScriptTool, derive_name, extract_description
from robot_lab.skills.skill import AgentSkill, Issue, validate
from robot_lab.skills.session import SkillSession, reset_sessions, session_for, unique_tools
from robot_lab.skills.skill_tool import Activation, SkillTool, system_prompt_listing
from robot_lab.sandbox.trust import Decision, TrustReview, review
from robot_lab.sandbox.workspace import Workspace, envelope_attachments

__all__ = [
    "DEFAULT_TIMEOUT",
    "ENTRY_POINT_GROUP",
    "TRUST_LEVELS",
    "Activation",
    "AgentSkill",
    "Capabilities",
    "Decision",
    "Embedder",
    "EmbeddingCache",
    "FakeEmbedder",
    "FastEmbedEmbedder",
    "Issue",
    "Limits",
    "Outcome",
    "Problem",
    "Root",
    "ScriptTool",
    "SkillCatalog",
    "SkillFileTool",
    "SkillInjection",
    "SkillMatcher",
    "SkillSession",
    "SkillTool",
    "TfidfEmbedder",
    "TrustReview",
    "Workspace",
    "allowed_tool_names",
    "bwrap_status",
    "compose_system_prompt",
    "default_catalog",
    "default_matcher",
    "default_roots",
    "derive_name",
    "envelope_attachments",
    "extract_description",
    "filter_tools",
    "limit_status",
    "load_embedder",
    "reset_default_catalog",
    "reset_default_matcher",
    "reset_sessions",
    "review",
    "select",
    "session_for",
    "system_prompt_listing",
    "unique_tools",
    "validate",
]
