"""The documented installs cover what they are documented to start: the honcho install line
covers every Procfile line, the Docker image every command the Kubernetes manifests run.

Static: a command needs an extra when its module names ``pip install 'robot-lab[X]'`` (what
it prints when the extra is missing) and X is not already a plain dependency. Under honcho one
process that exits at once stops every other, so a missing extra there stops the whole demo.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from robot_lab.cli import LAZY_COMMANDS
from tests.redis_server import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
HINT = re.compile(r"robot-lab\[([\w,]+)\]")
INSTALL_EXTRAS = re.compile(r"""-e\s+['"]?\.(?:\[([\w,-]+)\])?['"]?|\s['"]?\.\[([\w,-]+)\]['"]?""")


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _plain_extras() -> set[str]:
    """Extras whose every requirement a plain install brings anyway (kept only as names)."""
    core = {_name(r) for r in PYPROJECT["dependencies"]}
    return {extra for extra, reqs in PYPROJECT["optional-dependencies"].items()
            if all(_name(r) in core for r in reqs)}


def extras_needed(command: str) -> set[str]:
    """The extras `robot-lab COMMAND` needs beyond a plain install."""
    module = LAZY_COMMANDS[command][0].split(":")[0]
    source = Path(importlib.util.find_spec(module).origin).read_text()  # type: ignore[arg-type,union-attr]
    named = {extra for group in HINT.findall(source) for extra in group.split(",")}
    return named - _plain_extras()


def installed_extras(line: str) -> set[str]:
    """The extras a `pip install ... -e '.[a,b]'` (or `pip install '.[a]'`) line installs."""
    extras: set[str] = set()
    for match in INSTALL_EXTRAS.finditer(line):
        group = match.group(1) or match.group(2) or ""
        extras |= {e for e in group.split(",") if e}
    return extras


def procfile_commands() -> dict[str, str]:
    """Process type -> the robot-lab subcommand its line runs."""
    commands = {}
    for line in (REPO_ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, command = line.partition(":")
        words = [w for w in shlex.split(command) if "=" not in w or w.startswith("-")]
        assert words[0] == "robot-lab", line
        commands[name] = words[1]
    return commands


def test_the_a2a_command_needs_its_extra_and_the_metrics_exporter_none():
    """The rule above, on the two cases it must tell apart."""
    assert extras_needed("a2a") == {"a2a"}
    assert extras_needed("metrics") == set() and extras_needed("dashboard") == set()
    assert installed_extras("pip install honcho -e '.[a2a,otel]'  # comment") == {"a2a", "otel"}
    assert installed_extras("pip install honcho -e .") == set()


def test_the_documented_honcho_install_covers_every_procfile_line():
    docs = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]
    lines = [(path.name, line) for path in docs for line in path.read_text().splitlines()
             if "pip install" in line and "honcho" in line]
    assert lines, "no documented `pip install honcho ...` line"
    commands = procfile_commands()
    assert "a2a" in commands.values()  # the case this guards
    for where, line in lines:
        for process, command in commands.items():
            missing = extras_needed(command) - installed_extras(line)
            assert not missing, f"{where}: `{line.strip()}` lacks {missing} for the Procfile's {process}"


def test_the_docker_image_installs_the_extras_of_every_command_the_manifests_run():
    dockerfile = (REPO_ROOT / "deploy" / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if re.search(r"\bpip install\b(?!.*--no-deps)", line)]
    assert installs
    image = set().union(*(installed_extras(line) for line in installs))
    for path in sorted((REPO_ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {})
            pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
            for container in pod.get("containers", []):
                if container.get("image", "").startswith("ghcr.io/robot-lab/") and container.get("args"):
                    command = container["args"][0]
                    missing = extras_needed(command) - image
                    assert not missing, f"{path.name}: `robot-lab {command}` needs {missing}; the image lacks it"
