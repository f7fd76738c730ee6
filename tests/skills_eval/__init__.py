"""The labelled skill-matching set: 17 bundles written in the style of public AgentSkills
collections (long descriptions with "Use when ..." sentences) and 72 prompts, 20 of which
should match no skill. Used by tests/test_skills_eval.py and bench/skills.py."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUNDLES = HERE / "bundles"
PROMPTS = HERE / "prompts.yaml"
MODEL_NAME = "all-MiniLM-L6-v2-onnx"


def model_dir() -> Path:
    """The local all-MiniLM-L6-v2 folder: ``ROBOT_LAB_TEST_MODEL_DIR``, else ``shared/models``
    next to the repository or to the folder holding it (git worktrees live one level down)."""
    given = os.environ.get("ROBOT_LAB_TEST_MODEL_DIR")
    if given:
        return Path(given)
    repo = HERE.parents[1]
    for base in (repo.parent, repo.parent.parent):
        candidate = base / "shared" / "models" / MODEL_NAME
        if (candidate / "model.onnx").exists():
            return candidate
    return repo.parent / "shared" / "models" / MODEL_NAME
