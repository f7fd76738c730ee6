"""Every repository path the docs name exists, and every link between the docs lands.

A reader who follows ``examples/refund_approval.py`` from docs/durable.md and finds no such
file stops trusting the page. The docs name files in two ways, and both are checked: inside
backticks (``bench/status.py``, ``python examples/01_hello.py``, ``tests/test_x.py::test_y``)
and as Markdown link targets (``[durable runs](durable.md#resume)``, relative to the page).
A link's ``#anchor`` must be a heading of the page it points at, and a dotted
``robot_lab.x.name`` a module or a name it defines.

The docs are README.md, bench/README.md and docs/*.md. Inside backticks a word counts as a repository path when
it starts with one of :data:`REPO_FOLDERS`; a ``*`` in it is a glob that must match something.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_FOLDERS = ("examples/", "docs/", "bench/", "scripts/", "robot_lab/", "tests/", "deploy/")

# Words that start like a repository path and are not one, each with the reason.
NOT_REPO_PATHS = {
    "deploy/robot-x": "a Kubernetes resource (`kubectl scale deploy/robot-x`), not a file",
    "scripts/office/unpack.py": "a script inside an office skill's bundle, not this repository's scripts/",
    "scripts/office/*.py": "scripts inside an office skill's bundle, not this repository's scripts/",
}

_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH_WORD = re.compile(r"(?:^|(?<=[\s(=\"']))((?:%s)[^\s`'\",;)]*)" % "|".join(map(re.escape, REPO_FOLDERS)))
_HEADING = re.compile(r"#{1,6}\s+(.*)")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (a ``# comment`` in a shell block is no heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def named_paths(text: str) -> list[str]:
    """The repository paths named inside backticks, as written (``::test`` and ``:line`` cut off)."""
    found = []
    for code in _CODE.findall(text):
        for word in _PATH_WORD.findall(code):
            found.append(re.sub(r"(::.*|:\d+.*)$", "", word).rstrip(".:"))
    return found


def anchors(text: str) -> set[str]:
    """The ``#anchor`` of each heading of a page, as GitHub spells it (repeats get ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(text).splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = [path for path in named_paths(doc.read_text())
               if path not in NOT_REPO_PATHS and not _exists(path)]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_of_a_doc_lands(doc: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: -- not a repository file
            continue
        file, _, anchor = target.partition("#")
        page = (doc.parent / file).resolve() if file else doc
        if not page.exists():
            broken.append(target)
        elif anchor and page.suffix == ".md" and anchor not in anchors(page.read_text()):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to files or headings that do not exist: {broken}"


# Dotted words that start like a robot_lab name and are not one, each with the reason.
NOT_PYTHON_NAMES = {"robot_lab.yml": "the name of a configuration file",
                    **dict.fromkeys(["robot_lab.cost", "robot_lab.input_tokens",
                                     "robot_lab.robot", "robot_lab.stream"],
                                    "a span attribute robot-lab writes (docs/observability.md), not a Python name")}


def resolves(dotted: str) -> bool:
    """Whether ``robot_lab.a.b.name`` names a module of the package, or a name its module
    defines or exports (``def``/``class``/assignment/import, or a string: ``__all__`` and lazy
    exports). Read from the source, not imported: nothing a doc names is loaded to check it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.exists():
            break
    else:
        return False
    if end == len(parts):
        return True
    name = re.escape(parts[end])
    return re.search(rf"^\s*(?:async def|def|class) {name}\b|^{name}\s*[:=]|\bimport .*\b{name}\b|[\"']{name}[\"']",
                     module.read_text(), re.M) is not None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_robot_lab_name_a_doc_gives_exists(doc: Path) -> None:
    """``robot_lab.connection.get_redis`` in a doc is a module, function or class that exists
    (only the first name after the module is checked: ``Tool.create`` needs ``Tool``)."""
    names = set(re.findall(r"`(robot_lab(?:\.\w+)+)(?:\([^`]*\))?`", doc.read_text()))
    missing = sorted(name for name in names - set(NOT_PYTHON_NAMES) if not resolves(name))
    assert not missing, f"{doc.relative_to(ROOT)} names robot_lab names that do not exist: {missing}"


def test_every_bench_script_is_in_the_bench_index() -> None:
    """bench/README.md's table is where a reader finds which script measures what."""
    index = {row.split("`")[1] for row in (ROOT / "bench" / "README.md").read_text().splitlines()
             if row.startswith("| `bench/")}
    scripts = {path.relative_to(ROOT).as_posix() for path in (ROOT / "bench").glob("*.py")}
    assert index == scripts, {"not in the index": scripts - index, "no such script": index - scripts}


def test_the_exceptions_are_still_named() -> None:
    """An exception nobody names any more is dead weight that would hide a real miss later."""
    named = {path for doc in DOCS for path in named_paths(doc.read_text())}
    assert set(NOT_REPO_PATHS) <= named, set(NOT_REPO_PATHS) - named
    text = "".join(doc.read_text() for doc in DOCS)
    assert all(f"`{name}`" in text for name in NOT_PYTHON_NAMES)


def test_the_checks_see_a_missing_path_and_a_broken_anchor() -> None:
    """The parsers themselves: a wrong name is caught, and the forms the docs use are read."""
    assert resolves("robot_lab.workers.run_task") and resolves("robot_lab.Robot")  # lazy exports
    assert resolves("robot_lab.connection.get_redis") and resolves("robot_lab.bus")
    assert not resolves("robot_lab.bus.replies.nothing_here") and not resolves("robot_lab.nowhere.x")
    text = ("run `python examples/refund_approval.py` or `tests/test_bus.py::test_x`, "
            "see `bench/*.py` and `kubectl scale deploy/robot-x`")
    assert named_paths(text) == ["examples/refund_approval.py", "tests/test_bus.py", "bench/*.py",
                                 "deploy/robot-x"]
    assert not _exists("examples/refund_approval.py") and _exists("bench/*.py")
    assert "in-flight-per-worker" in anchors("## In flight per worker\n```\n# not a heading\n```")
    assert "not-a-heading" not in anchors("```\n# not a heading\n```")


def test_code_and_tests_give_reasons_not_tracker_numbers() -> None:
    """A comment that points at a tracker entry sends the reader somewhere they may not reach; the
    comment should say the reason itself."""
    tracker = re.compile(r"[Ii]ssue ?#?[0-9]+")
    found = [f"{path.relative_to(ROOT)}:{number}" for folder in ("robot_lab", "tests")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if tracker.search(line)]
    assert not found, f"tracker numbers instead of reasons: {found}"
