"""Do the scripts of public skill collections start under robot-lab's default ceiling?

    .venv/bin/python bench/skills_wild.py ROOT [ROOT ...] [--timeout 20] [--json]

Each ROOT is a folder of bundles (anthropics/skills' ``skills``, openai/skills'
``skills/.curated`` and ``skills/.system``, obra/superpowers' ``skills``). Every script tool
of every bundle is run once with ``--help`` through its ScriptTool, under bwrap with the
default settings (no network, no fs grants, a fresh workspace), and sorted by what came out:

* ``starts``: it ran (exit 0, or a usage text: argparse's exit 2, ``Usage:`` lines);
* ``missing module``: ``ModuleNotFoundError`` / ``ImportError`` (``skills doctor`` names the
  package and the pip line);
* ``missing program``: ``command not found`` / ``No such file or directory`` for a program;
* ``no network``: the sandbox's "no network" note;
* ``starts, rejects --help``: its own code ran and failed on the argument (``no such plan
  file: --help``): it started;
* ``timed out``, ``refused`` (no sandbox).

Which of them start depends on what is installed for the scripts' Python: run ``skills
doctor`` and install what it says, or point ``ROBOT_LAB_SKILLS__PYTHON`` at a venv that has
it (docs/skills.md lists the office skills' needs and the figures measured). Not a timing
benchmark: it prints counts, and the failures with their first line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ROBOT_LAB_LOG_LEVEL", "ERROR")

from robot_lab.settings import Settings  # noqa: E402
from robot_lab.skills import SkillCatalog  # noqa: E402
from robot_lab.sandbox.sandbox import bwrap_status  # noqa: E402


def classify(text: str, timed_out: bool) -> str:
    low = text.lower()
    if timed_out:
        return "timed out"
    if "[no network in the sandbox" in low:
        return "no network"
    if "modulenotfounderror" in low or "importerror" in low or "cannot find module" in low:
        return "missing module: " + (re.findall(r"no module named '([^']+)'|cannot find module '([^']+)'", low)
                                     or [("?", "")])[0][0].split(".")[0]
    if "command not found" in low or ("no such file or directory" in low and "error (exit 127)" in low):
        return "missing program"
    if "sandbox unavailable" in low:
        return "refused"
    if not text.startswith("Error (") or "usage" in low:
        return "starts"
    return "starts, rejects --help"  # its own code ran and failed on the argument


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    usable, reason = bwrap_status()
    if not usable:
        sys.exit(f"needs bwrap: {reason}")
    settings = Settings(skills={"script_timeout": args.timeout})
    rows = []
    with tempfile.TemporaryDirectory(prefix="robot_lab-wild-") as work:
        for root in args.roots:
            catalog = SkillCatalog([root], settings=settings, entry_points=False)
            for skill in catalog.all():
                for tool in skill.script_tools(sandbox=settings.sandbox):
                    workspace = Path(tempfile.mkdtemp(prefix=f"{skill.name}-", dir=work))
                    text = tool.in_workspace(workspace).call({"args": "--help"})
                    outcome = tool.last_outcome
                    kind = classify(text, bool(outcome and outcome.timed_out))
                    rows.append({"root": str(root), "skill": skill.name, "script": tool.path.name, "result": kind,
                                 "first_line": next((line for line in text.splitlines()[1:] if line.strip()),
                                                    text.splitlines()[0] if text else "")[:160]})
    counts = Counter(r["result"].split(":")[0] for r in rows)
    if args.json:
        print(json.dumps({"counts": counts, "scripts": rows}, indent=2))
        return
    bundles = len({(r["root"], r["skill"]) for r in rows})
    print(f"{len(rows)} script tools in {bundles} bundles with scripts: "
          + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    for r in rows:
        if not r["result"].startswith("starts"):
            print(f"  {r['result']:<15} {r['skill']}/{r['script']}: {r['first_line']}")


if __name__ == "__main__":
    main()
