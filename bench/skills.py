"""Skill matching benchmark: accuracy on labelled prompts, then speed (200 skills).

    .venv/bin/python bench/skills.py [--skills 200] [--rounds 200] [--accuracy-only]

Accuracy (tests/skills_eval: 17 bundles in the style of public collections, 72 labelled
prompts, 20 of them unrelated): for each embedder, top-1 accuracy, recall and false
positives of the old fixed threshold, of the shipped rule (settings.skills.match_rules), and
of the rule chosen on the set (in-sample, and two-fold cross-validated: chosen on one half,
measured on the other).

Speed, side by side:
  * baseline: a plain numpy dot product of the same (precomputed) vectors, and the query
    embedding alone (what any embedding matcher must pay);
  * robot-lab: ``SkillMatcher.match`` (query embedding + cached description matrix + dot
    + threshold), and the catalog scan of 200 bundles;
  * the cross-process cache: embedding 200 descriptions vs fetching them from Redis
    (REDIS_URL or redis://127.0.0.1:6379/0, under a unique prefix that is deleted after).

Uses the local all-MiniLM-L6-v2 model next to the repository when present, else TF-IDF.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "ERROR")

from robot_lab.settings import MatchRule, Settings  # noqa: E402
from robot_lab.skills import EmbeddingCache, SkillCatalog, SkillMatcher, TfidfEmbedder, load_embedder  # noqa: E402
from robot_lab.skills.evaluation import choose_rule, evaluate, load_prompts, score_all  # noqa: E402
from tests.skills_eval import BUNDLES, PROMPTS, model_dir  # noqa: E402

MODEL_DIR = model_dir()
TOPICS = ["PDF files", "Python code style", "Kubernetes deployments", "SQL migrations", "release notes",
          "invoices", "customer refunds", "log files", "Terraform plans", "CSV reports", "unit tests",
          "Docker images", "API rate limits", "translation", "meeting notes", "security advisories",
          "spreadsheets", "git history", "dependency upgrades", "image resizing"]
VERBS = ["Extract data from", "Review", "Summarise", "Validate", "Generate", "Audit", "Convert", "Clean up",
         "Compare", "Explain"]
MESSAGES = ["Can you pull the tables out of this PDF report?", "Please review this Python module for style",
            "Is the staging deployment healthy enough to promote?", "Write the release notes for 2.4",
            "Why was this customer refunded twice?", "What is a good recipe for banana bread?",
            "Summarise yesterday's error logs", "Convert this CSV into a spreadsheet"]


def make_skills(root: Path, count: int) -> None:
    for i in range(count):
        topic, verb = TOPICS[i % len(TOPICS)], VERBS[(i // len(TOPICS)) % len(VERBS)]
        name = f"skill-{i:03d}"
        (root / name / "scripts").mkdir(parents=True)
        (root / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {verb} {topic} (variant {i}) and report what matters.\n---\n"
            f"# {verb} {topic}\n\nStep by step instructions for {topic}.\n" + "More detail.\n" * 50,
            encoding="utf-8")
        (root / name / "scripts" / "run.py").write_text('"""Run it."""\nprint("ok")\n', encoding="utf-8")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f} ms"


def timed(fn, rounds: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(rounds):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def summary(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return f"median {ms(statistics.median(samples))}  p95 {ms(p95)}  max {ms(samples[-1])}"


def accuracy(settings: Settings) -> None:
    """Print the matching figures on the labelled set for the model and for TF-IDF."""
    prompts = load_prompts(PROMPTS)
    skills = SkillCatalog([BUNDLES], entry_points=False).all()
    print(f"accuracy: {len(skills)} skills, {len(prompts)} prompts "
          f"({sum(p.skill is None for p in prompts)} should match nothing)")
    embedders = [load_embedder(settings)]
    if not isinstance(embedders[0], TfidfEmbedder):
        embedders.append(TfidfEmbedder())
    for embedder in embedders:
        matcher = SkillMatcher(embedder, settings=settings)
        scored = score_all(matcher, prompts, skills)
        old = settings.skills.thresholds.get(embedder.name, settings.skills.default_threshold)
        print(f"\n{embedder.name}")
        print("  old rule:                       " + evaluate(prompts, scored, MatchRule(floor=old, margin=1e9)).line())
        print("  shipped rule:                   " + evaluate(prompts, scored, matcher.rule).line())
        chosen = choose_rule(prompts, scored)
        print("  chosen on this set (in-sample): " + chosen.line())
        halves = (list(range(0, len(prompts), 2)), list(range(1, len(prompts), 2)))
        for fit, test in (halves, halves[::-1]):
            rule = choose_rule([prompts[i] for i in fit], [scored[i] for i in fit]).rule
            held = evaluate([prompts[i] for i in test], [scored[i] for i in test], rule)
            print(f"  cross-validated (fit on {len(fit)}, measured on {len(test)}): " + held.line())
        right = sorted(dict((s.name, v) for s, v in sc)[p.skill] for p, sc in zip(prompts, scored) if p.skill)
        unrelated = sorted(max(v for _, v in sc) for p, sc in zip(prompts, scored) if not p.skill)
        print(f"  right-skill scores {right[0]:.2f}..{right[-1]:.2f} (median {statistics.median(right):.2f}); "
              f"best score of an unrelated prompt {unrelated[-1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skills", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--accuracy-only", action="store_true")
    args = parser.parse_args()

    if (MODEL_DIR / "model.onnx").exists():
        settings = Settings(skills={"embedding_model_path": str(MODEL_DIR)})
    else:
        print(f"(model not found at {MODEL_DIR}: using the TF-IDF fallback)")
        settings = Settings(skills={"embedder": "tfidf"})
    accuracy(settings)
    if args.accuracy_only:
        return
    embedder = load_embedder(settings)
    print(f"\nspeed: embedder {embedder.name}; {args.skills} skills; {args.rounds} rounds; numpy {np.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_skills(root, args.skills)

        scans = timed(lambda _: SkillCatalog([root], entry_points=False).all(), 5)
        catalog = SkillCatalog([root], entry_points=False)
        skills = catalog.all()
        assert len(skills) == args.skills, catalog.problems

        matcher = SkillMatcher(embedder, settings=settings, cache=EmbeddingCache())
        start = time.perf_counter()
        matcher.match(MESSAGES[0], skills)
        warm_up = time.perf_counter() - start
        for message in MESSAGES:  # warm the ONNX session on every message shape
            matcher.match(message, skills)

        matrix = matcher.passage_matrix(skills)
        queries = [embedder.embed_query(m) for m in MESSAGES]
        threshold = matcher.threshold

        dot = timed(lambda i: np.flatnonzero(matrix @ queries[i % len(queries)] >= threshold), args.rounds)
        embed = timed(lambda i: embedder.embed_query(MESSAGES[i % len(MESSAGES)]), args.rounds)
        match = timed(lambda i: matcher.match(MESSAGES[i % len(MESSAGES)], skills), args.rounds)
        cold = timed(lambda i: SkillMatcher(embedder, settings=settings, cache=matcher.cache).match(
            MESSAGES[i % len(MESSAGES)], SkillCatalog([root], entry_points=False).all()), 5)

        print()
        print(f"catalog scan, {args.skills} bundles (front matter only):  {summary(scans)}")
        print(f"first match (embeds {args.skills} descriptions):          {ms(warm_up)}")
        print()
        print("after warm-up, one message against all skills:")
        print(f"  baseline  numpy dot of the same vectors + threshold:   {summary(dot)}")
        print(f"  baseline  query embedding alone:                        {summary(embed)}")
        print(f"  robot-lab SkillMatcher.match:                           {summary(match)}")
        print(f"  robot-lab scan + match (fresh catalog, warm vectors):   {summary(cold)}")
        med_match, med_dot = statistics.median(match), statistics.median(dot)
        med_embed = statistics.median(embed)
        print(f"  ratio match / numpy dot: {med_match / med_dot:8.1f}x   "
              f"match / query embedding: {med_match / med_embed:5.2f}x")
        verdict = "PASS" if med_match < 0.020 else "FAIL"
        print(f"  target: match < 20 ms after warm-up -> {verdict} ({ms(med_match).strip()})")

        tools_part(skills, args.rounds)
        redis_part(skills, embedder, settings)


def tools_part(skills, rounds: int) -> None:  # type: ignore[no-untyped-def]
    """script_tools() for the 10 skills a run might match: built every time (what every run
    paid before the cache) vs cached (what a run pays now)."""
    from robot_lab.sandbox.capabilities import Capabilities

    batch = skills[:10]
    ceiling = Capabilities.ceiling()
    uncached = timed(lambda _: [s._build_tools(s.scripts, ceiling, None) for s in batch], max(rounds // 10, 5))
    for skill in batch:
        skill.script_tools(ceiling)
    cached = timed(lambda _: [s.script_tools(ceiling) for s in batch], rounds)
    print("\nscript tools of 10 matched skills, per run:")
    print(f"  baseline  built every run:                              {summary(uncached)}")
    print(f"  robot-lab cached until a script changes:                {summary(cached)}")
    print(f"  ratio {statistics.median(uncached) / statistics.median(cached):6.1f}x")


def redis_part(skills, embedder, settings) -> None:  # type: ignore[no-untyped-def]
    if isinstance(embedder, TfidfEmbedder):
        print("\n(TF-IDF vectors are not shared through Redis; cache comparison skipped)")
        return
    import redis

    from robot_lab.keys import Keys

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        print(f"\n(no Redis at {url}: {exc}; cache comparison skipped)")
        return
    keys = Keys(prefix=f"rlbench-{uuid.uuid4().hex[:10]}")
    descriptions = [s.description for s in skills]
    try:
        start = time.perf_counter()
        vectors = embedder.embed_passages(descriptions)
        compute = time.perf_counter() - start
        EmbeddingCache(client, keys=keys, ttl=300).put_many(embedder.name, descriptions, list(vectors))
        fetches = []
        for _ in range(5):
            cache = EmbeddingCache(client, keys=keys)  # a "new process": empty local cache
            start = time.perf_counter()
            got = cache.get_many(embedder.name, descriptions)
            fetches.append(time.perf_counter() - start)
            assert all(v is not None for v in got)
        fetched = statistics.median(fetches)
        print(f"\ndescription vectors for {len(skills)} skills in a new process ({url}):")
        print(f"  baseline  embed them:            {ms(compute)}")
        print(f"  robot-lab fetch from Redis:      {ms(fetched)}   ratio {compute / fetched:6.1f}x faster")
    finally:
        stale = list(client.scan_iter(match=f"{keys.prefix}:*", count=1000))
        if stale:
            client.delete(*stale)
        client.close()


if __name__ == "__main__":
    main()
