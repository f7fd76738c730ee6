"""docs/architecture.md is the map a new engineer reads first; these tests keep it true.

They read the page's structured parts, never its prose:

* the layers picture's left column (the rooms: ``cli.py, commands/``, ``|   robot/``) --
  each room names a module or folder that exists;
* the module table ("Every module, by folder") -- every module it names exists in its folder
  and sits in the room its row says (the room of ``tests/test_layering.py``), and every module
  under ``robot_lab/`` is in the table;
* the Words table (the glossary) -- the classes and modules it names exist;
* every ``.py`` path the page names, relative to robot_lab/ or to the repository;
* the shared-basename list -- the basenames that appear in more than one folder are exactly
  the ones it names;
* the Redis key table -- every key it states is one that :class:`robot_lab.keys.Keys` builds
  (or a run key plus a suffix of ``RUN_KEY_SUFFIXES``, or one of the few keys built beside
  their one user, :data:`BUILT_BESIDE_THEIR_USER`), and every key ``Keys`` builds is in it.

Key table rules: the first cell's backticked names starting ``robot_lab:`` are keys; a name
starting with ``:`` is a sibling of the name before it (that name without its last two
segments, plus this one); ``a/b/c`` in one segment is three keys; every ``<...>`` is a
placeholder.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from robot_lab.keys import Keys
from robot_lab.network.transitions import RUN_KEY_SUFFIXES
from tests.test_layering import layer_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "robot_lab"
DOC = ROOT / "docs" / "architecture.md"

# Keys the key table states that keys.py does not build: each is built by the one module that
# uses it, from a Keys key plus the literal suffix given here (checked in that module's source).
BUILT_BESIDE_THEIR_USER = {
    "robot_lab:run:<>:swept": ("network/coordinator.py", ":swept"),
    "robot_lab:runs:sweep-lock": ("network/coordinator.py", ":runs:sweep-lock"),
    "robot_lab:run:<>:stranded:<>": ("network/run_state.py", ":stranded:"),
    "robot_lab:run:<>:budget_holds:<>": ("network/run_state.py", ":budget_holds:"),
    "robot_lab:robot:<>:outbox:<>:replies": ("bus/outbox.py", ":replies"),
    "robot_lab:robot:<>:outbox:<>:signal": ("bus/outbox.py", ":signal"),
}
# Keys methods that build a prefix other keys extend, not a key of their own.
PREFIX_METHODS = {"bus_state", "outbox", "replied"}
# Keys methods named ``legacy_*`` build where an older release kept a key (read only, so data
# written before an upgrade is still found): the page names them where it says how to
# upgrade, not in the key table.
LEGACY = "legacy_"
# Left-column rooms of the layers picture that are no folder or module.
ROOMS_NOT_IN_THE_TREE = {"foundation": "the lowest room: the top-level modules and folders its text lists"}

_PLACEHOLDER = re.compile(r"<[^<>]*>")


# --- reading the page -----------------------------------------------------------------------

def _section(title: str) -> str:
    """The text of one ``##`` section of the page (up to the next ``##``)."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end != -1 else len(text)]


def _cells(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` inside a cell is no separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _table(section: str, first_header: str) -> list[list[str]]:
    """The body rows of the table in ``section`` whose first header cell is ``first_header``."""
    lines = section.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|") and _cells(line)[0] == first_header), None)
    assert start is not None, f"docs/architecture.md: no table whose first column is {first_header!r} in its section"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def picture_rooms() -> list[str]:
    """The left column of the layers picture: ``cli.py``, ``commands/``, ``robot/``, ...

    The column ends where the first line's description starts (the picture is aligned on it);
    a room is a folder (``name/``), a module (``name.py``) or a name of ROOMS_NOT_IN_THE_TREE."""
    lines = [line for line in _section("Layers").split("```")[1].splitlines() if line.strip()]
    column = re.match(r"\S.*?\s{2,}", lines[0]).end()
    return [name for line in lines for name in re.split(r"[,\s|]+", line[:column])
            if re.fullmatch(r"[\w.]+/|\w+\.py", name) or name in ROOMS_NOT_IN_THE_TREE]


def module_table() -> list[tuple[str, str, list[str]]]:
    """(room, folder, modules) of each row of "Every module, by folder"."""
    return [(room.strip("`"), folder.strip("`"), re.findall(r"`([\w.]+)`", modules))
            for room, folder, modules in _table(_section("Layers"), "room")]


def shared_basenames() -> list[str]:
    """The ``.py`` paths the paragraph "A basename appears in more than one folder ..." names."""
    section = _section("Layers")
    start = section.index("A basename appears in more than one folder")
    paragraph = section[start: section.find("\n\n", start)]
    return re.findall(r"`(\w[\w/]*/\w+\.py)`", paragraph)  # with its folder; a bare basename is the heading


def doc_keys() -> list[str]:
    """Every key the key table states, placeholders written ``<>``."""
    found = []
    for row in _table(_section("Redis key layout"), "key"):
        previous = ""
        for name in re.findall(r"`([^`]+)`", row[0]):
            if name.startswith(":") and previous:
                name = previous.rsplit(":", 2)[0] + name
            if not name.startswith("robot_lab:"):
                continue
            previous = name
            segments = [segment.split("/") for segment in _PLACEHOLDER.sub("<>", name).split(":")]
            expanded = [""]
            for choices in segments:
                expanded = [f"{head}:{choice}" if head else choice for head in expanded for choice in choices]
            found += expanded
    return found


# --- what the code has ----------------------------------------------------------------------

def modules_by_folder() -> dict[str, set[str]]:
    """``robot_lab/x/`` -> the module basenames in it (``__init__`` is the folder itself)."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(ROOT).as_posix() + "/"
        out.setdefault(folder, set())
        if path.stem != "__init__":
            out[folder].add(path.stem)
    return out


def keys_patterns() -> dict[str, str]:
    """Keys method -> the key it builds, every argument a ``<>`` placeholder."""
    keys = Keys()
    out = {}
    for name, method in inspect.getmembers(keys, inspect.ismethod):
        if name.startswith("_"):
            continue
        arity = len(inspect.signature(method).parameters)
        out[name] = method(*["<>"] * arity)
    return out


def built_by(pattern: str, key: str) -> bool:
    """Whether ``key`` (from the page) is the key ``pattern`` (from Keys) builds: a placeholder of
    the pattern stands for one segment of any text, or for several placeholder segments
    (``replied_for`` is given ``<from>:<message id>``)."""
    regex = "".join(r"[^:]+(?::<>)*" if part == "<>" else re.escape(part)
                    for part in re.split(r"(<>)", pattern))
    return re.fullmatch(regex, key) is not None


def builder(key: str, patterns: dict[str, str]) -> str | None:
    """What builds a key the page states: a Keys method, a run suffix, or a module beside its user."""
    for name, pattern in patterns.items():
        if name not in PREFIX_METHODS and built_by(pattern, key):
            return f"Keys.{name}"
    for suffix in RUN_KEY_SUFFIXES:
        if suffix and key == patterns["run"] + suffix:
            return "Keys.run + RUN_KEY_SUFFIXES"
    if key in BUILT_BESIDE_THEIR_USER:
        return BUILT_BESIDE_THEIR_USER[key][0]
    return None


# --- the tests ------------------------------------------------------------------------------

def test_every_room_of_the_layers_picture_exists() -> None:
    rooms = picture_rooms()
    assert {"cli.py", "commands/", "workers/", "robot/", "llm/", "foundation"} <= set(rooms), rooms
    every = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")} | {
        p.relative_to(PACKAGE).as_posix() + "/" for p in PACKAGE.rglob("*") if p.is_dir()}
    missing = [room for room in rooms if room not in ROOMS_NOT_IN_THE_TREE
               and not any(path == room or path.endswith("/" + room) for path in every)]
    assert not missing, f"the layers picture names rooms that are not under robot_lab/: {missing}"


def test_every_module_the_table_names_exists_in_its_room() -> None:
    tree = modules_by_folder()
    problems = []
    for room, folder, modules in module_table():
        if folder not in tree:
            problems.append(f"{folder}: no such package folder")
            continue
        for module in modules:
            if module not in tree[folder]:
                problems.append(f"{folder}{module}.py does not exist")
                continue
            dotted = (folder + module).replace("/", ".")
            if layer_of(dotted) != room:
                problems.append(f"{dotted} is in room {layer_of(dotted)!r} (tests/test_layering.py), "
                                f"the table says {room!r}")
    assert not problems, "\n".join(problems)


def test_every_module_under_robot_lab_is_in_the_table() -> None:
    named: dict[str, set[str]] = {}
    for _, folder, modules in module_table():
        named.setdefault(folder, set()).update(modules)
    missing = sorted(f"{folder}{module}.py" for folder, modules in modules_by_folder().items()
                     for module in modules - named.get(folder, set()))
    folders = sorted(set(modules_by_folder()) - set(named))
    assert not missing and not folders, \
        f"docs/architecture.md's module table lacks modules {missing} and folders {folders}"


def test_each_module_is_named_once() -> None:
    seen = [(folder, module) for _, folder, modules in module_table() for module in modules]
    assert len(seen) == len(set(seen)), sorted({m for m in seen if seen.count(m) > 1})


def test_the_shared_basenames_are_the_ones_the_page_names() -> None:
    tree = modules_by_folder()
    counts: dict[str, list[str]] = {}
    for folder, modules in tree.items():
        for module in modules:
            counts.setdefault(module, []).append(folder)
    shared = {f"{module}.py" for module, folders in counts.items() if len(folders) > 1}
    named = shared_basenames()
    assert all((PACKAGE / path).exists() for path in named), named
    named_shared = {path.rsplit("/", 1)[-1] for path in named}
    assert named_shared == shared
    for basename in shared:  # every folder holding it, named
        folders = {path.rsplit("/", 1)[0] for path in named if path.endswith("/" + basename)}
        assert len(folders) == len(counts[basename.removesuffix(".py")]), (basename, folders)


def test_every_key_the_table_states_is_built_by_the_code() -> None:
    patterns = keys_patterns()
    keys = doc_keys()
    assert "robot_lab:bus:<>" in keys and "robot_lab:run:<>:graph" in keys, keys  # the parser reads it
    unbuilt = [key for key in keys if builder(key, patterns) is None]
    assert not unbuilt, f"the key table states keys nothing builds: {unbuilt}"
    for key, (module, literal) in BUILT_BESIDE_THEIR_USER.items():
        assert key in keys, f"{key} is no longer in the key table: drop it from BUILT_BESIDE_THEIR_USER"
        assert literal in (PACKAGE / module).read_text(), f"{module} no longer builds {key}"


def test_every_key_the_code_builds_is_in_the_table() -> None:
    keys = doc_keys()
    missing = []
    for name, pattern in sorted(keys_patterns().items()):
        if name.startswith(LEGACY):
            if f"`{pattern}`" not in _PLACEHOLDER.sub("<>", DOC.read_text()):
                missing.append(f"Keys.{name} (an older release's key: name it where the page says how to upgrade)")
        elif name in PREFIX_METHODS:
            if not any(key.startswith(pattern + ":") for key in keys):
                missing.append(f"Keys.{name} (a prefix): {pattern}:...")
        elif not any(built_by(pattern, key) for key in keys):
            missing.append(f"Keys.{name}: {pattern}")
    missing += [f"RUN_KEY_SUFFIXES {suffix!r}" for suffix in RUN_KEY_SUFFIXES
                if f"robot_lab:run:<>{suffix}" not in keys]
    assert not missing, "docs/architecture.md's key table lacks:\n" + "\n".join(missing)


def test_the_cluster_examples_are_what_keys_builds() -> None:
    """The hash-tag examples of the key section (``robot_lab:bus:{billing}``) come from Keys."""
    tagged = re.findall(r"`(robot_lab:[^`]*\{(\w+)\}[^`]*)`", _section("Redis key layout").split("\n|")[0])
    assert tagged
    keys = Keys(cluster=True)
    built = {getattr(keys, name)(*["billing"] * len(inspect.signature(getattr(keys, name)).parameters))
             for name in keys_patterns()}
    assert {example for example, _ in tagged} <= built


def test_every_class_and_module_the_words_table_names_exists() -> None:
    """The glossary says which class holds each word: those classes and modules exist."""
    rows = _table(_section("Words"), "word")
    assert {row[0] for row in rows} >= {"run", "turn", "pending", "park, parked", "waiting", "hold, held"}
    named = {name for row in rows for name in re.findall(r"`([A-Z]\w+)(?:\.\w+)?`", row[2])}
    defined = {node.name for path in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    assert named and not named - defined, f"the Words table names classes that do not exist: {named - defined}"
    paths = [path for row in rows for path in re.findall(r"`([\w/]+\.py)`", row[2])]
    assert all((PACKAGE / path).exists() for path in paths), paths


def test_every_module_path_the_page_names_exists() -> None:
    """Paths the page writes relative to robot_lab/ (``network/task_job.py``) or to the
    repository (``tests/test_layering.py``), and bare basenames (``core.py``), name files that exist."""
    text = DOC.read_text()
    paths = set(re.findall(r"`(\w[\w/]*\.py)`", text)) | set(re.findall(r"\((\w[\w/]*/\w+\.py)[;,)]", text))
    missing = sorted(path for path in paths if not (PACKAGE / path).exists() and not (ROOT / path).exists()
                     and not ("/" not in path and any(PACKAGE.rglob(path))))  # a bare basename
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_nothing_but_inboxes_and_reply_streams_is_under_bus() -> None:
    """The page's promise behind the ACL grant ``XADD ~robot_lab:bus:*``: that pattern reaches
    inboxes and reply streams, never a robot's own state."""
    def inbox_or_reply(key: str) -> bool:
        return key == "robot_lab:bus:<>" or key.startswith("robot_lab:bus:_reply.")

    from_code = [f"Keys.{name}" for name, pattern in keys_patterns().items()
                 if pattern.startswith("robot_lab:bus:") and pattern != "robot_lab:bus:<>"
                 and not name.startswith(LEGACY)]  # read only, what an older release wrote
    from_page = [key for key in doc_keys() if key.startswith("robot_lab:bus:") and not inbox_or_reply(key)]
    assert not from_code and not from_page, (from_code, from_page)


def test_the_readers_see_what_they_should() -> None:
    """The parsers on a small page-like text, so a reformatted page fails loudly, not vacuously."""
    assert built_by("robot_lab:robot:<>:replied:<>", "robot_lab:robot:<>:replied:<>:<>")
    assert built_by("robot_lab:bus:<>", "robot_lab:bus:_reply.<>.<>")
    assert not built_by("robot_lab:run:<>", "robot_lab:run:<>:counts")
    assert not built_by("robot_lab:run:<>", "robot_lab:runs:active")
    assert builder("robot_lab:run:<>:counts", keys_patterns()) == "Keys.run + RUN_KEY_SUFFIXES"
    assert builder("robot_lab:run:<>:nothing", keys_patterns()) is None
    assert len(module_table()) >= 20 and len(picture_rooms()) >= 15
