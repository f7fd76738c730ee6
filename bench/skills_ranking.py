"""Which way of scoring a skill ranks best on prompts it was not tuned on.

    .venv/bin/python bench/skills_ranking.py [--public DIR]

tests/skills_eval's 72 prompts are split in two, per skill and for the unrelated ones
(every other prompt): the rule (floor, margin) of each scorer is chosen on the **tune**
half with ``evaluation.choose_rule`` and measured on the **held-out** half, with at most
``skills.max_selected`` (3) skills injected. ``--public DIR`` also scores the prompts whose
skill exists in a public collection (anthropics/skills' ``skills`` folder) with the rule
chosen on ours, the way a user's bundles would meet a shipped rule.

Scorers (all with the local all-MiniLM-L6-v2):

* ``description``: cosine of the message with the whole description (the shipped scorer);
* ``best-sentence``: the best cosine over the description's sentences and trigger phrases
  (descriptions list many triggers: "Use when ...; also when ...");
* ``blend``: the mean of the two.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "ERROR")

from robot_lab.settings import Settings  # noqa: E402
from robot_lab.skills import SkillCatalog, load_embedder  # noqa: E402
from robot_lab.skills.evaluation import Labelled, choose_rule, evaluate, load_prompts  # noqa: E402
from robot_lab.skills.matching import cap_selected, description_sentences, select  # noqa: E402
from tests.skills_eval import BUNDLES, PROMPTS, model_dir  # noqa: E402

EXTRA = bool(os.environ.get("RANKING_EXTRA"))
sentences = description_sentences  # what SkillMatcher scores with (scoring: blend)


def split(prompts: list[Labelled]) -> tuple[list[int], list[int]]:
    """Every other prompt of each skill (and of the unrelated ones): tune, held-out."""
    seen: dict[str | None, int] = defaultdict(int)
    tune, held = [], []
    for i, p in enumerate(prompts):
        (tune if seen[p.skill] % 2 == 0 else held).append(i)
        seen[p.skill] += 1
    return tune, held


class Scorers:
    def __init__(self, embedder, skills) -> None:  # type: ignore[no-untyped-def]
        self.embedder = embedder
        self.skills = skills
        self.full = np.stack(embedder.embed_passages([s.description for s in skills]))
        self.parts = [np.stack(embedder.embed_passages(sentences(s.description))) for s in skills]

    def score(self, text: str) -> dict[str, list[float]]:
        q = self.embedder.embed_query(text)
        full = self.full @ q
        best = np.array([float(np.max(m @ q)) for m in self.parts])
        out = {"description": list(full), "best-sentence": list(best), "blend": list((full + best) / 2)}
        if EXTRA:
            for w in (0.25, 0.75):
                out[f"blend-{w}"] = list(w * full + (1 - w) * best)
        return out


def report(prompts, scored, rule, limit=3):  # type: ignore[no-untyped-def]
    """evaluate() with the max_selected cap applied."""
    capped = []
    for scores in scored:
        chosen = {s.name for s in cap_selected(select(scores, rule), {s.name: v for s, v in scores}, limit)}
        capped.append([(s, v if s.name in chosen or v < rule.floor else rule.floor - 1) for s, v in scores])
    return evaluate(prompts, capped, rule)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--public", type=Path, default=None, help="a public collection's skills folder")
    args = parser.parse_args()
    folder = model_dir()
    if not (folder / "model.onnx").exists():
        sys.exit(f"needs the local all-MiniLM-L6-v2 at {folder}")
    embedder = load_embedder(Settings(skills={"embedding_model_path": str(folder)}))
    prompts = load_prompts(PROMPTS)
    skills = SkillCatalog([BUNDLES], entry_points=False).all()
    scorers = Scorers(embedder, skills)
    raw = [scorers.score(p.text) for p in prompts]
    tune, held = split(prompts)
    public = None
    if args.public:
        pskills = SkillCatalog([args.public], entry_points=False).all()
        names = {s.name for s in pskills}
        pprompts = [p for p in prompts if p.skill is None or p.skill in names]
        pscorers = Scorers(embedder, pskills)
        public = (pprompts, pskills, [pscorers.score(p.text) for p in pprompts])
    print(f"{len(prompts)} prompts: tune {len(tune)}, held-out {len(held)}; at most 3 skills injected")
    print(f"{'scorer':<14} {'rule (chosen on tune)':<22} {'tune top1/recall/fp':<22} {'held-out top1/recall/fp':<25}"
          + (" public top1/recall/fp" if public else ""))
    for name in ("description", "best-sentence", "blend", *(("blend-0.25", "blend-0.75") if EXTRA else ())):
        scored = [[(s, v) for s, v in zip(skills, r[name])] for r in raw]
        pick = [prompts[i] for i in tune], [scored[i] for i in tune]
        chosen = choose_rule(*pick).rule
        cells = []
        for idx in (tune, held):
            r = report([prompts[i] for i in idx], [scored[i] for i in idx], chosen)
            cells.append(f"{r.top1:.0%}/{r.recall:.0%}/{r.fp_unrelated:.0%} +{r.wrong_extras}")
        line = f"{name:<14} floor {chosen.floor:.2f} margin {chosen.margin:.2f}  {cells[0]:<22} {cells[1]:<25}"
        if public:
            pprompts, pskills, praw = public
            pscored = [[(s, v) for s, v in zip(pskills, r[name])] for r in praw]
            r = report(pprompts, pscored, chosen)
            line += f" {r.top1:.0%}/{r.recall:.0%}/{r.fp_unrelated:.0%} +{r.wrong_extras} ({r.labelled} prompts)"
        print(line)


if __name__ == "__main__":
    main()
