"""docs/cli.md is generated from the click commands and must be current; the operations and
getting-started pages name commands that exist."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.redis_server import REPO_ROOT


def test_cli_reference_is_current():
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr + "\n(regenerate: .venv/bin/python scripts/gen_cli_docs.py)"


def test_cli_reference_covers_every_command():
    from robot_lab.cli import LAZY_COMMANDS

    text = (REPO_ROOT / "docs" / "cli.md").read_text()
    for name in LAZY_COMMANDS:
        assert f"## `robot-lab {name}`" in text, name


def test_docs_mention_only_real_commands():
    from robot_lab.cli import LAZY_COMMANDS

    for page in ("getting-started.md", "operations.md"):
        text = (REPO_ROOT / "docs" / page).read_text()
        used = set(re.findall(r"(?m)(?:^|`|# )\s*robot-lab ([a-z]+)", text))
        assert used, page
        assert used <= set(LAZY_COMMANDS) | {"worker"}, (page, used - set(LAZY_COMMANDS))
