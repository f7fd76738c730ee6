"""Measure skill matching on labelled prompts, and choose a match rule from the evidence.

A labelled set is a YAML file ``prompts: [{text: ..., skill: name | null}, ...]``
(``tests/skills_eval/prompts.yaml`` is robot-lab's). For a rule it reports:

* **top-1 accuracy**: labelled prompts whose best-scoring skill is the right one (the
  ranking alone, whatever the rule);
* **recall**: labelled prompts whose right skill the rule injects;
* **false positives**: unlabelled prompts (no skill should match) that get a skill, and
  wrong extra skills injected beside the right one.

:func:`choose_rule` grid-searches floor and margin: the most recall with at most
``max_fp_rate`` false positives on unrelated prompts, then the fewest wrong extras.
``bench/skills.py`` and ``robot-lab skills eval`` print these figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from robot_lab.errors import ConfigurationError
from robot_lab.settings import MatchRule
from robot_lab.skills.matching import SkillMatcher, select
from robot_lab.skills.skill import AgentSkill


@dataclass(frozen=True, slots=True)
class Labelled:
    text: str
    skill: str | None


@dataclass(frozen=True, slots=True)
class Report:
    """The figures of one rule on one labelled set."""

    rule: MatchRule
    labelled: int
    unrelated: int
    top1: float  # share of labelled prompts ranked right
    recall: float  # share of labelled prompts whose skill is injected
    fp_unrelated: float  # share of unrelated prompts that get any skill
    wrong_extras: int  # wrong skills injected beside (or instead of) the right one
    misses: tuple[str, ...] = ()

    def line(self) -> str:
        rule = (f"every skill >= {self.rule.floor:.2f}" if self.rule.margin >= 1
                else f"floor {self.rule.floor:.2f} margin {self.rule.margin:.2f}")
        return (f"{rule}: top-1 {self.top1:.0%}, "
                f"recall {self.recall:.0%}, false positives on unrelated prompts {self.fp_unrelated:.0%} "
                f"({round(self.fp_unrelated * self.unrelated)}/{self.unrelated}), wrong extra skills "
                f"{self.wrong_extras}")


def load_prompts(path: str | Path) -> list[Labelled]:
    """Read a labelled prompt file; ConfigurationError naming the problem."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read labelled prompts: {exc}") from exc
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigurationError(f"{path}: expected 'prompts:' with a list of {{text, skill}}")
    out = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not str(item.get("text") or "").strip():
            raise ConfigurationError(f"{path}: prompt {index + 1} needs a 'text'")
        skill = item.get("skill")
        out.append(Labelled(str(item["text"]), None if skill in (None, "", "none") else str(skill)))
    return out


def score_all(matcher: SkillMatcher, prompts: Sequence[Labelled],
              skills: Sequence[AgentSkill]) -> list[list[tuple[AgentSkill, float]]]:
    """Every prompt's scores against every skill (embedding once per prompt)."""
    unknown = sorted({p.skill for p in prompts if p.skill} - {s.name for s in skills})
    if unknown:
        raise ConfigurationError(f"labelled skills not in the catalog: {', '.join(unknown)}")
    return [matcher.scores(p.text, skills) for p in prompts]


def evaluate(prompts: Sequence[Labelled], scored: Sequence[Sequence[tuple[AgentSkill, float]]],
             rule: MatchRule) -> Report:
    labelled = unrelated = top1 = hits = fp = extras = 0
    misses: list[str] = []
    for prompt, scores in zip(prompts, scored):
        chosen = {s.name for s in select(scores, rule)}
        if prompt.skill is None:
            unrelated += 1
            fp += bool(chosen)
            continue
        labelled += 1
        best = max(scores, key=lambda item: item[1])[0].name if scores else None
        top1 += best == prompt.skill
        hits += prompt.skill in chosen
        extras += len(chosen - {prompt.skill})
        if prompt.skill not in chosen:
            misses.append(prompt.text)
    return Report(rule=rule, labelled=labelled, unrelated=unrelated, top1=top1 / max(labelled, 1),
                  recall=hits / max(labelled, 1), fp_unrelated=fp / max(unrelated, 1), wrong_extras=extras,
                  misses=tuple(misses))


def choose_rule(prompts: Sequence[Labelled], scored: Sequence[Sequence[tuple[AgentSkill, float]]], *,
                max_fp_rate: float = 0.10, floors: Sequence[float] | None = None,
                margins: Sequence[float] | None = None) -> Report:
    """The rule with the best recall whose false-positive rate on unrelated prompts is at
    most ``max_fp_rate``, then the fewest wrong extras, then the smallest margin. Of the
    floors that do equally well, the middle one: furthest from both kinds of mistake."""
    floors = floors or [round(0.05 + 0.01 * i, 2) for i in range(76)]
    margins = margins or [0.0, 0.02, 0.03, 0.05, 0.08, 0.10]
    feasible: list[tuple[tuple[float, int, float], Report]] = []
    for floor in floors:
        for margin in margins:
            report = evaluate(prompts, scored, MatchRule(floor=floor, margin=margin, switch_margin=0.05))
            if report.fp_unrelated <= max_fp_rate:
                feasible.append(((report.recall, -report.wrong_extras, -margin), report))
    if not feasible:
        raise ConfigurationError(f"no rule keeps false positives at or under {max_fp_rate:.0%}")
    top = max(key for key, _ in feasible)
    plateau = sorted((r for key, r in feasible if key == top), key=lambda r: r.rule.floor)
    return plateau[len(plateau) // 2]


__all__ = ["Labelled", "Report", "choose_rule", "evaluate", "load_prompts", "score_all"]
