"""The package's rooms and arrows, enforced: dependencies point one way and no module
imports another that imports it back.

Layers, lowest first (a module may import its own layer and those below it):

    foundation  errors, redis_url, settings, connection, keys, logging, tracing, text, outage,
                observability, threads, inputs, lazy, coalesce, folded_writes,
                randomness
    schemas     wire types (and the package facade ``robot_lab``, which imports schemas)
    llm         the model gateway (litellm calls, one retry policy, streaming) and the offline
                scripted model: what a robot calls, not the robot
    bus         Redis Streams inboxes, replies, dead letters
    memory      shared Memory
    runtime     the in-process Robot: tools, MCP, rails, durable steps; ``skills`` and
                ``sandbox`` beside it
    network     the DAG engine: Network DSL, run state, coordinator, the task job, its lease
    app         App (robots + networks by name), the demo app
    a2a         ``robot-lab a2a``: robots and networks as Agent2Agent agents (bus, network)
    workers     the process: ``robot-lab worker``, in-flight runs, health, status, metrics
    dashboard   ``robot-lab dashboard`` (Starlette app over the workers' readers)
    cli         ``robot-lab`` and its subcommands

``skills`` and ``sandbox`` sit beside ``runtime``: runtime may use both, skills use only
foundation, schemas and the sandbox, the sandbox only foundation and schemas. Every import counts -- module level, inside functions, and under TYPE_CHECKING --
because each is a dependency a reader has to follow. Strings naming a module (rq's job
function, lazy exports) are not imports and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "robot_lab"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("robot_lab.errors", "robot_lab.redis_url", "robot_lab.settings", "robot_lab.connection",
                    "robot_lab.keys", "robot_lab.logging", "robot_lab.tracing", "robot_lab.text",
                    "robot_lab.outage", "robot_lab.observability", "robot_lab.rq_connection",
                    "robot_lab.threads", "robot_lab.inputs", "robot_lab.lazy", "robot_lab.coalesce",
                    "robot_lab.folded_writes", "robot_lab.randomness")),
    ("schemas", ("robot_lab.schemas",)),
    ("llm", ("robot_lab.llm",)),
    ("bus", ("robot_lab.bus",)),
    ("memory", ("robot_lab.memory",)),
    ("runtime", ("robot_lab.runtime", "robot_lab.skills", "robot_lab.sandbox")),
    ("network", ("robot_lab.network",)),
    ("app", ("robot_lab.app", "robot_lab.demo")),
    ("a2a", ("robot_lab.a2a",)),
    ("workers", ("robot_lab.workers",)),
    ("dashboard", ("robot_lab.dashboard",)),
    ("cli", ("robot_lab.commands", "robot_lab.cli", "robot_lab.__main__")),
]
FACADE = "robot_lab"  # the package root: imports errors + schemas statically, the rest lazily by name
FACADE_LAYER = "schemas"
# skills and the sandbox may use only these layers (not bus, memory or runtime); skills may
# also use the sandbox, the sandbox not skills
SKILLS_MAY_USE = {"foundation", "schemas"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_imports(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports (resolved to the deepest existing module)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                if base.split(".")[0] != root.name:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    names.append(full if full in files else base)
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == root.name]
            for name in names:
                while name not in files and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name != mod:
                    deps.add(name)
        graph[mod] = deps
    return graph


def layer_of(module: str) -> str | None:
    if module == FACADE:
        return FACADE_LAYER
    for layer, prefixes in LAYERS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {name: index for index, (name, _) in enumerate(LAYERS)}
    problems = []
    for mod, deps in sorted(graph.items()):
        mine = layer_of(mod)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if mine is None or theirs is None:
                problems.append(f"{mod} -> {dep}: module outside every layer (add it to LAYERS)")
            elif mod.startswith("robot_lab.sandbox") and not dep.startswith("robot_lab.sandbox") \
                    and theirs not in SKILLS_MAY_USE:
                problems.append(f"{mod} ({mine}) -> {dep} ({theirs}): the sandbox may use only foundation and schemas")
            elif mod.startswith("robot_lab.skills") and not dep.startswith(("robot_lab.skills", "robot_lab.sandbox")) \
                    and theirs not in SKILLS_MAY_USE:
                problems.append(f"{mod} ({mine}) -> {dep} ({theirs}): skills may use only foundation, schemas and "
                                "the sandbox")
            elif rank[theirs] > rank[mine]:
                problems.append(f"{mod} ({mine}) -> {dep} ({theirs}): upward import")
            elif mine == "runtime" and theirs == "runtime" and dep.startswith("robot_lab.runtime") \
                    and mod.startswith("robot_lab.skills"):
                problems.append(f"{mod} -> {dep}: skills may not import runtime")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# --- the package itself ------------------------------------------------------------------

def test_dependencies_point_one_way() -> None:
    problems = upward_imports(collect_imports(PACKAGE_DIR))
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def test_no_import_cycles_between_modules() -> None:
    found = cycles(collect_imports(PACKAGE_DIR))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


# --- the checker can fail ----------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "robot_lab"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_upward_import_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "bus/__init__.py": "",
        "bus/core.py": "def f():\n    from robot_lab.network.task_job import run_task\n",  # bus -> network
        "network/__init__.py": "",
        "network/task_job.py": "from robot_lab.bus.core import f\n",
    })
    problems = upward_imports(collect_imports(root))
    assert problems == ["robot_lab.bus.core (bus) -> robot_lab.network.task_job (network): upward import"]


@pytest.mark.parametrize(("wing", "other", "said"), [
    ("skills", "runtime", "skills may use only foundation, schemas and the sandbox"),
    ("sandbox", "skills", "the sandbox may use only foundation and schemas"),
])
def test_an_import_out_of_a_wing_beside_runtime_is_reported(tmp_path: Path, wing: str, other: str, said: str) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        f"{wing}/__init__.py": "",
        f"{wing}/tool.py": f"from ..{other}.tools import Tool\n",
        f"{other}/__init__.py": "",
        f"{other}/tools.py": "",
    })
    problems = upward_imports(collect_imports(root))
    assert problems == [f"robot_lab.{wing}.tool (runtime) -> robot_lab.{other}.tools (runtime): {said}"]


def test_a_type_checking_cycle_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "bus/__init__.py": "",
        "bus/a.py": "from robot_lab.bus.b import B\n",
        "bus/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from robot_lab.bus.a import A\n",
    })
    assert cycles(collect_imports(root)) == [["robot_lab.bus.a", "robot_lab.bus.b"]]


@pytest.mark.parametrize("module,layer", [
    ("robot_lab.keys", "foundation"), ("robot_lab.schemas.codec", "schemas"), ("robot_lab", "schemas"),
    ("robot_lab.memory.store", "memory"), ("robot_lab.network.dsl", "network"), ("robot_lab.runtime.robot.core", "runtime"),
    ("robot_lab.sandbox.sandbox", "runtime"), ("robot_lab.skills.skill", "runtime"), ("robot_lab.network.task_job", "network"), ("robot_lab.workers.process", "workers"), ("robot_lab.cli", "cli"),
])
def test_layer_of(module: str, layer: str) -> None:
    assert layer_of(module) == layer
