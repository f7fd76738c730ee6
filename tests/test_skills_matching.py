"""Matching (fake, TF-IDF and the real MiniLM model), the embedding cache, injection, the
Skill tool and the system-prompt listing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from robot_lab.keys import Keys
from robot_lab.settings import Settings
from robot_lab.skills import (
    AgentSkill,
    Capabilities,
    EmbeddingCache,
    FakeEmbedder,
    SkillCatalog,
    SkillMatcher,
    SkillTool,
    TfidfEmbedder,
    compose_system_prompt,
    load_embedder,
    system_prompt_listing,
)
from robot_lab.skills.embedding import reset_embedders
from tests.skills_eval import model_dir
from tests.test_skills import write_skill

MODEL_DIR = model_dir()

PDF = "Extract text and tables from PDF files, fill in PDF forms, and merge or split PDF documents."
STYLE = "Review Python code for style problems against the project conventions (PEP 8, naming, line length)."
DEPLOY = "Check a Kubernetes deployment health before promoting it to production."


@pytest.fixture
def skills(tmp_path: Path) -> list[AgentSkill]:
    write_skill(tmp_path, "pdf-tools", PDF, "PDF INSTRUCTIONS", scripts={"extract.py": '"""Extract text."""\n'})
    write_skill(tmp_path, "python-style", STYLE, "STYLE INSTRUCTIONS", extra="allowed-tools: [read_file, lint_*]")
    write_skill(tmp_path, "deploy-check", DEPLOY, "DEPLOY INSTRUCTIONS")
    catalog = SkillCatalog([tmp_path])
    return catalog.select(["pdf-tools", "python-style", "deploy-check"])


class Tool:
    def __init__(self, name: str) -> None:
        self.name = name
        self.description = name
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def call(self, arguments: dict[str, Any]) -> str:
        return self.name


# --- matcher with the fake embedder ------------------------------------------------------------


def test_fake_match_selects_by_threshold_in_skill_order(skills: list[AgentSkill]) -> None:
    matcher = SkillMatcher(FakeEmbedder(), threshold=0.3)
    assert [s.name for s in matcher.match("please extract the tables from this pdf file", skills)] == ["pdf-tools"]
    assert matcher.match("banana bread recipe", skills) == []
    scored = dict((s.name, v) for s, v in matcher.scores("pdf file tables", skills))
    assert scored["pdf-tools"] > scored["deploy-check"]


def test_empty_skill_list_does_not_embed() -> None:
    embedder = FakeEmbedder()
    assert SkillMatcher(embedder, 0.1).match("anything", []) == []
    assert embedder.calls == 0


def test_embedding_failure_skips_injection(skills: list[AgentSkill]) -> None:
    embedder = FakeEmbedder()
    matcher = SkillMatcher(embedder, threshold=0.0)
    matcher.warm(skills)
    embedder.fail = True
    assert matcher.match("pdf", skills) == []
    injection = matcher.prepare("pdf", skills)
    assert not injection and injection.tools == [] and injection.system_prompt("BASE") == "BASE"


def test_descriptions_embedded_once(skills: list[AgentSkill]) -> None:
    embedder = FakeEmbedder()
    matcher = SkillMatcher(embedder, threshold=0.3)
    matcher.match("pdf tables", skills)
    after_first = embedder.calls
    assert after_first == len(skills) + 1
    matcher.match("pdf forms", skills)
    matcher.match("python style", skills[:2])  # subset: vectors come from the cache
    assert embedder.calls == after_first + 2


def test_rule_per_model_from_settings() -> None:
    settings = Settings()
    minilm = SkillMatcher(FakeEmbedder(name="sentence-transformers/all-MiniLM-L6-v2"), settings=settings)
    # chosen on evidence (docs/skills.md), scored by the blend of description and best sentence
    assert (minilm.rule.floor, minilm.rule.margin, minilm.rule.scoring) == (0.22, 0.05, "blend")
    assert SkillMatcher(FakeEmbedder(name="BAAI/bge-small-en-v1.5"), settings=settings).threshold == 0.70
    assert SkillMatcher(TfidfEmbedder(), settings=settings).rule.floor == 0.29
    assert SkillMatcher(FakeEmbedder(name="unknown"), settings=settings).threshold == 0.70
    explicit = SkillMatcher(FakeEmbedder(), 0.25, settings=settings)
    assert explicit.threshold == 0.25 and explicit.rule.margin >= 1  # every skill at or above it
    custom = Settings(skills={"match_rules": {"fake": {"floor": 0.5}}})
    assert SkillMatcher(FakeEmbedder(), settings=custom).threshold == 0.5
    assert SkillMatcher(FakeEmbedder(name="unknown"), settings=Settings(skills={"default_floor": 0.6})).threshold == 0.6
    ruled = Settings(skills={"match_rules": {"fake": {"floor": 0.3, "margin": 0.1}}})
    assert SkillMatcher(FakeEmbedder(), settings=ruled).rule.margin == 0.1


def test_select_best_plus_margin_and_sticky(skills: list[AgentSkill]) -> None:
    from robot_lab.settings import MatchRule
    from robot_lab.skills.matching import select

    pdf, style, deploy = skills
    rule = MatchRule(floor=0.25, margin=0.05, switch_margin=0.05)
    assert select([(pdf, 0.50), (style, 0.47), (deploy, 0.30)], rule) == [pdf, style]  # within the margin
    assert select([(pdf, 0.20), (style, 0.18), (deploy, 0.1)], rule) == []  # nothing reaches the floor
    assert select([(pdf, 0.27), (style, 0.10), (deploy, 0.1)], rule) == [pdf]
    # sticky: turn 2 scores low everywhere, the conversation keeps its skill
    assert select([(pdf, 0.12), (style, 0.15), (deploy, 0.1)], rule, current=["pdf-tools"]) == [pdf]
    # another skill above the floor but not clearly better: kept
    assert select([(pdf, 0.30), (style, 0.33), (deploy, 0.1)], rule, current=["pdf-tools"]) == [pdf]
    # another clearly wins: switch
    assert select([(pdf, 0.20), (style, 0.45), (deploy, 0.1)], rule, current=["pdf-tools"]) == [style]


def test_message_objects_and_dicts(skills: list[AgentSkill]) -> None:
    class Msg:
        content = "extract pdf tables"

    matcher = SkillMatcher(FakeEmbedder(), threshold=0.3)
    assert [s.name for s in matcher.match(Msg(), skills)] == ["pdf-tools"]
    assert matcher.match({"text": "nothing relevant"}, skills) == []
    assert matcher.match(None, skills) == []


# --- injection -----------------------------------------------------------------------------------


def test_prepare_builds_prompt_and_tools(skills: list[AgentSkill], tmp_path: Path) -> None:
    matcher = SkillMatcher(FakeEmbedder(), threshold=0.3)
    injection = matcher.prepare("extract the pdf tables", skills, ceiling=Capabilities())
    assert [s.name for s in injection.skills] == ["pdf-tools"]
    assert injection.system_prompt("You are helpful.") == "PDF INSTRUCTIONS\n\nYou are helpful."
    assert injection.system_prompt(None) == "PDF INSTRUCTIONS"
    assert [t.name for t in injection.tools] == ["pdf-tools__extract"]
    assert injection.tools[0].description == "Extract text."
    assert injection.scores["pdf-tools"] >= 0.3
    assert compose_system_prompt("B", skills) == "PDF INSTRUCTIONS\n\nSTYLE INSTRUCTIONS\n\nDEPLOY INSTRUCTIONS\n\nB"


def test_injection_allowed_tools_filter(skills: list[AgentSkill]) -> None:
    matcher = SkillMatcher(FakeEmbedder(), threshold=0.3)
    injection = matcher.prepare("review python code style naming conventions", skills)
    assert [s.name for s in injection.skills] == ["python-style"]
    robot_tools = [Tool("read_file"), Tool("lint_py"), Tool("delete_everything")]
    assert [t.name for t in injection.filter_tools(robot_tools)] == ["read_file", "lint_py"]
    unrestricted = matcher.prepare("pdf tables extract", skills)
    assert [t.name for t in unrestricted.filter_tools(robot_tools)] == ["pdf-tools__extract", "read_file", "lint_py",
                                                                        "delete_everything"]


# --- TF-IDF and the fallback -------------------------------------------------------------------


def test_tfidf_matches_lexically(skills: list[AgentSkill]) -> None:
    matcher = SkillMatcher(TfidfEmbedder(), settings=Settings())
    assert [s.name for s in matcher.match("merge these PDF documents please", skills)] == ["pdf-tools"]
    assert matcher.match("weather in Paris tomorrow", skills) == []


def test_unloadable_model_falls_back_to_tfidf_with_warning(tmp_path: Path) -> None:
    reset_embedders()
    settings = Settings(skills={"embedding_model": "BAAI/bge-small-en-v1.5",
                                "embedding_model_path": str(tmp_path / "no-such-model")})
    with capture_logs() as logs:
        embedder = load_embedder(settings)
    assert isinstance(embedder, TfidfEmbedder)
    warning = next(e for e in logs if e["event"] == "skills.embedder_fallback")
    assert warning["log_level"] == "warning" and "no-such-model" in warning["error"]
    reset_embedders()


def test_tfidf_by_setting() -> None:
    reset_embedders()
    assert isinstance(load_embedder(Settings(skills={"embedder": "tfidf"})), TfidfEmbedder)
    reset_embedders()


# --- the real model, end to end -------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> Any:
    if not (MODEL_DIR / "model.onnx").exists():
        pytest.skip(f"local embedding model not found at {MODEL_DIR}")
    reset_embedders()
    # Only the folder is configured: the model id is inferred from its name.
    settings = Settings(skills={"embedding_model_path": str(MODEL_DIR)})
    embedder = load_embedder(settings)
    assert embedder.name == "sentence-transformers/all-MiniLM-L6-v2"
    yield embedder, settings
    reset_embedders()


def test_minilm_end_to_end_match(minilm: Any, skills: list[AgentSkill]) -> None:
    embedder, settings = minilm
    matcher = SkillMatcher(embedder, settings=settings)
    assert matcher.threshold == pytest.approx(0.22)
    injection = matcher.prepare("Can you pull the tables out of this PDF report?", skills)
    assert [s.name for s in injection.skills] == ["pdf-tools"]
    assert injection.system_prompt("BASE").startswith("PDF INSTRUCTIONS")
    assert [s.name for s in matcher.match("Please review this Python module for style issues", skills)] == [
        "python-style"]
    assert matcher.match("What is a good recipe for banana bread?", skills) == []
    assert matcher.match("hello there", skills) == []


def test_minilm_vectors_are_normalised_query_and_passage(minilm: Any) -> None:
    embedder, _ = minilm
    query = embedder.embed_query("pdf tables")
    passages = embedder.embed_passages([PDF, DEPLOY])
    assert query.shape == (384,) and passages.shape == (2, 384)
    assert np.allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-4)
    assert float(passages[0] @ query) > float(passages[1] @ query)


# --- the cross-process cache in Redis -----------------------------------------------------------------


def test_description_vectors_shared_through_redis(redis_client: Any, key_prefix: str,
                                                   skills: list[AgentSkill]) -> None:
    keys = Keys(prefix=key_prefix)
    first = FakeEmbedder()
    SkillMatcher(first, 0.3, cache=EmbeddingCache(redis_client, keys=keys, ttl=60)).match("pdf", skills)
    assert first.calls == len(skills) + 1
    stored = list(redis_client.scan_iter(match=f"{key_prefix}:skills:emb:fake:*"))
    assert len(stored) == len(skills)
    assert 0 < redis_client.ttl(stored[0]) <= 60
    # "another process": a fresh embedder and a fresh cache on the same Redis
    second = FakeEmbedder()
    cache = EmbeddingCache(redis_client, keys=keys)
    matched = SkillMatcher(second, 0.3, cache=cache).match("extract pdf tables", skills)
    assert [s.name for s in matched] == ["pdf-tools"]
    assert second.calls == 1  # only the query was embedded
    assert cache.hits["redis"] == len(skills)


def test_cache_survives_a_broken_redis(skills: list[AgentSkill]) -> None:
    class Broken:
        def mget(self, keys: list[str]) -> Any:
            raise ConnectionError("redis down")

        def pipeline(self, transaction: bool = False) -> Any:
            raise ConnectionError("redis down")

    matcher = SkillMatcher(FakeEmbedder(), 0.3, cache=EmbeddingCache(Broken(), keys=Keys("x")))
    with capture_logs() as logs:
        assert [s.name for s in matcher.match("pdf tables extract", skills)] == ["pdf-tools"]
    assert [e["event"] for e in logs].count("skills.embedding_cache_redis_error") == 1


def test_default_cache_uses_redis_when_configured(redis_client: Any, key_prefix: str,
                                                  skills: list[AgentSkill]) -> None:
    from robot_lab.settings import get_settings

    settings = get_settings()
    matcher = SkillMatcher(FakeEmbedder(), 0.3, settings=settings)
    if settings.redis_url:
        assert matcher.cache.redis is not None and matcher.cache.keys.prefix == key_prefix
        matcher.match("pdf", skills)
        assert list(redis_client.scan_iter(match=f"{key_prefix}:skills:emb:*"))
    else:
        assert matcher.cache.redis is None


# --- the Skill tool -----------------------------------------------------------------------------------


def test_system_prompt_listing_names_and_descriptions_only(skills: list[AgentSkill]) -> None:
    text = system_prompt_listing(skills)
    assert "`Skill` tool" in text
    assert f"- pdf-tools: {PDF}" in text
    assert "PDF INSTRUCTIONS" not in text
    assert system_prompt_listing([]) == ""


def test_skill_tool_activates_and_adds_tools(tmp_path: Path, skills: list[AgentSkill]) -> None:
    catalog = SkillCatalog([tmp_path])
    seen: list[Any] = []
    tool = SkillTool(catalog, ["pdf-tools", "python-style", "a-template-skill"], ceiling=Capabilities(),
                     on_activate=seen.append)
    assert tool.name == "Skill"
    assert tool.parameters["properties"]["skill"]["enum"] == ["pdf-tools", "python-style"]
    assert tool.parameters["required"] == ["skill"]
    assert "pdf-tools" in tool.listing() and "deploy-check" not in tool.listing()
    assert tool.active_tools() == []

    result = tool.call({"skill": "pdf-tools", "args": "--pages 1-3"})
    assert "PDF INSTRUCTIONS" in result and "Arguments: --pages 1-3" in result and "pdf-tools__extract" in result
    assert [t.name for t in tool.active_tools()] == ["pdf-tools__extract"]
    assert len(seen) == 1 and seen[0].skill.name == "pdf-tools"
    assert "already active" in tool.call({"skill": "pdf-tools"})
    assert len(tool.activations) == 1

    unknown = tool.call({"skill": "deploy-check"})
    assert unknown.startswith("Error (Skill): unknown skill 'deploy-check'") and "pdf-tools" in unknown
    assert tool.call({}).startswith("Error (Skill): unknown skill ''")


def test_skill_tool_allowed_tools_restrict(tmp_path: Path, skills: list[AgentSkill]) -> None:
    tool = SkillTool(skills, ceiling=Capabilities())
    robot_tools = [Tool("read_file"), Tool("lint_py"), Tool("shell")]
    assert [t.name for t in tool.filter_tools(robot_tools)] == ["Skill", "read_file", "lint_py", "shell"]
    text = tool.call({"skill": "python_style"})  # folded name
    assert "may use only: read_file, lint_*" in text
    assert tool.allowed_tools() == {"read_file", "lint_*"}
    assert [t.name for t in tool.filter_tools(robot_tools)] == ["Skill", "read_file", "lint_py"]
    tool.call({"skill": "pdf-tools"})  # unrestricted skill adds its tool, restriction stays
    assert [t.name for t in tool.filter_tools(robot_tools)] == ["Skill", "pdf-tools__extract", "read_file", "lint_py"]
    tool.reset()
    assert tool.active == [] and tool.allowed_tools() is None


def test_skill_tool_reports_a_vanished_skill(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "fleeting")
    tool = SkillTool(SkillCatalog([tmp_path]), None)
    (directory / "SKILL.md").unlink()
    result = tool.call({"skill": "fleeting"})
    assert result.startswith("Error (Skill): skill 'fleeting' could not be loaded")
    assert tool.activations == []


def test_default_matcher_is_shared_and_resettable() -> None:
    from robot_lab.skills import default_matcher, reset_default_matcher

    reset_default_matcher()
    first = default_matcher()
    assert default_matcher() is first
    reset_default_matcher()
    assert default_matcher() is not first
    reset_default_matcher()


def test_configured_match_rules_add_to_the_shipped_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_SKILLS__MATCH_RULES",
                       '{"sentence-transformers/all-MiniLM-L6-v2": {"floor": 0.22, "margin": 0.04}}')
    settings = Settings()
    minilm = SkillMatcher(FakeEmbedder(name="sentence-transformers/all-MiniLM-L6-v2"), settings=settings).rule
    assert (minilm.floor, minilm.margin) == (0.22, 0.04)
    assert SkillMatcher(TfidfEmbedder(), settings=settings).rule.floor == 0.29  # still the shipped rule
