"""What a bundle's scripts need on this worker: Python packages, programs, node modules.

Bundles from the wild are written for a laptop with LibreOffice, poppler and a dozen pip
packages installed; on a worker they fail one import at a time. :func:`diagnose` reads a
bundle without running it:

* **Python packages**: the top-level ``import`` / ``from`` names of every ``.py`` file in the
  bundle (parsed, not run), less the standard library and the bundle's own modules
  (``helpers``, ``office``, ``scripts``...); each is looked up with the skill's Python
  (``importlib.util.find_spec``; another interpreter is asked in one subprocess);
* **programs**: the names of :data:`PROGRAMS` (LibreOffice, poppler, pandoc, node ...) that
  the scripts or the Markdown's code call, checked with ``shutil.which``;
* **node modules**: ``require('x')`` / ``import ... from 'x'`` in ``.js`` files and
  ``npm install [-g] x`` in the Markdown, checked with ``node -e require.resolve``.

The result names what is missing and the ``pip install`` / ``apt-get install`` / ``npm
install -g`` lines that provide it (``robot-lab skills doctor``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_lab.sandbox.sandbox import python_executable

# import name -> the pip distribution that provides it, where the two differ
PIP_NAMES: dict[str, str] = {
    "docx": "python-docx", "pptx": "python-pptx", "PIL": "pillow", "yaml": "PyYAML", "fitz": "pymupdf",
    "cv2": "opencv-python", "bs4": "beautifulsoup4", "sklearn": "scikit-learn", "dateutil": "python-dateutil",
    "dotenv": "python-dotenv", "jwt": "PyJWT", "magic": "python-magic", "pdf2image": "pdf2image",
    "pytesseract": "pytesseract", "google": "google-api-python-client", "attr": "attrs", "mcp": "mcp",
    "playwright": "playwright", "anthropic": "anthropic", "markitdown": "markitdown[pptx,docx,xlsx,pdf]",
    "lxml": "lxml", "defusedxml": "defusedxml", "pypdfium2": "pypdfium2", "pdfplumber": "pdfplumber",
}
# program -> the Debian package that installs it
PROGRAMS: dict[str, str] = {
    "soffice": "libreoffice-core-nogui (with -calc-nogui, -impress-nogui, -writer-nogui)",
    "libreoffice": "libreoffice-core-nogui",
    "pdftoppm": "poppler-utils", "pdftotext": "poppler-utils", "pdfimages": "poppler-utils",
    "pdfinfo": "poppler-utils", "qpdf": "qpdf", "pdftk": "pdftk-java", "pandoc": "pandoc",
    "tesseract": "tesseract-ocr", "convert": "imagemagick", "magick": "imagemagick", "ffmpeg": "ffmpeg",
    "node": "nodejs", "npm": "npm", "npx": "npm", "git": "git", "gh": "gh", "chromium": "chromium",
    "java": "default-jre-headless", "gs": "ghostscript", "rsvg-convert": "librsvg2-bin", "jq": "jq",
    "curl": "curl", "wget": "wget", "zip": "zip", "unzip": "unzip", "bwrap": "bubblewrap",
}
# a program in command position: a line's first word, or after | ; & ( $( or sudo
_PROGRAM_RE = re.compile(r"(?:^|[|;&(]|\$\(|\bsudo\s)\s*(" + "|".join(
    re.escape(p) for p in sorted(PROGRAMS, key=len, reverse=True)) + r")(?=\s|$|[;|&)])", re.M)
_REQUIRE_RE = re.compile(r"""(?:require\(\s*|from\s+|import\s+)['"]([@\w][\w./@-]*)['"]""")
_NPM_RE = re.compile(r"npm[ \t]+(?:install|i)[ \t]+((?:-{1,2}[\w-]+[ \t]+)*(?:[@\w][\w./@-]*[ \t]*)+)")
_MD_IMPORT_RE = re.compile(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", re.M)  # a python block that does not parse
_PYTHON_M_RE = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_]\w*)")
_FENCE_RE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.S)
_INLINE_RE = re.compile(r"`([^`\n]+)`")
NODE_BUILTINS = frozenset({"fs", "path", "os", "child_process", "util", "url", "http", "https", "crypto",
                           "stream", "events", "zlib", "buffer", "assert", "readline", "process", "net",
                           "worker_threads", "module", "querystring", "tty", "timers", "dns", "vm"})
MAX_FILES = 2_000


@dataclass
class Need:
    """One thing a bundle's scripts use, whether this worker has it, and where it is used."""

    name: str
    kind: str  # "python" | "program" | "node"
    present: bool
    install: str
    used_in: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "present": self.present, "install": self.install,
                "used_in": self.used_in}


@dataclass
class Diagnosis:
    skill: str
    path: str
    python: str
    needs: list[Need]

    @property
    def missing(self) -> list[Need]:
        return [n for n in self.needs if not n.present]

    def install_lines(self) -> list[str]:
        """The commands that install what is missing, one per installer."""
        lines: list[str] = []
        pip = sorted({n.install for n in self.missing if n.kind == "python"})
        if pip:
            lines.append(f"{self.python} -m pip install " + " ".join(_quote(p) for p in pip))
        apt = sorted({p.split(" ")[0] for n in self.missing if n.kind == "program" for p in [n.install]})
        if apt:
            lines.append("apt-get install --no-install-recommends " + " ".join(apt))
        npm = sorted({n.install for n in self.missing if n.kind == "node"})
        if npm:
            lines.append("npm install -g " + " ".join(npm))
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"skill": self.skill, "path": self.path, "python": self.python,
                "needs": [n.as_dict() for n in self.needs], "missing": [n.name for n in self.missing],
                "install": self.install_lines()}


def _quote(text: str) -> str:
    return f"'{text}'" if any(c in text for c in "[]") else text


def _files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for base, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__"))
        for name in sorted(names):
            found.append(Path(base) / name)
            if len(found) >= MAX_FILES:
                return found
    return found


def _read(path: Path, limit: int = 1_000_000) -> str:
    try:
        raw = path.read_bytes()[:limit]
    except OSError:
        return ""
    return "" if b"\x00" in raw[:8192] else raw.decode("utf-8", "replace")


def python_imports(text: str) -> set[str]:
    """Top-level module names a Python file imports (absolute imports only)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def python_strings(text: str) -> list[str]:
    """The string constants of a Python file (where its subprocess calls name programs)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    return [n.value.strip() for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and 0 < len(n.value) < 300]


def local_modules(files: Iterable[Path], folder: Path) -> set[str]:
    """Names the bundle provides itself: every ``.py`` file's stem and every folder name."""
    names: set[str] = set()
    for path in files:
        rel = path.relative_to(folder)
        names.update(rel.parts[:-1])
        if path.suffix == ".py":
            names.add(path.stem)
    return names


def _find_specs(names: list[str], python: str) -> dict[str, bool]:
    if not names:
        return {}
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        out: dict[str, bool] = {}
        for name in names:
            try:
                out[name] = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                out[name] = False
        return out
    code = ("import importlib.util, json, sys\nout = {}\nfor n in sys.argv[1:]:\n    try: out[n] = "
            "importlib.util.find_spec(n) is not None\n    except Exception: out[n] = False\nprint(json.dumps(out))")
    try:
        done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=30)
        return json.loads(done.stdout) if done.returncode == 0 else dict.fromkeys(names, False)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return dict.fromkeys(names, False)


def _node_modules_present(names: list[str]) -> dict[str, bool]:
    node = shutil.which("node")
    if node is None or not names:
        return dict.fromkeys(names, False)
    out: dict[str, bool] = {}
    for name in names:
        try:
            done = subprocess.run([node, "-e", f"require.resolve({json.dumps(name)})"], capture_output=True,
                                  timeout=15, env={**os.environ, "NODE_PATH": _global_node_path()})
            out[name] = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            out[name] = False
    return out


def _global_node_path() -> str:
    npm = shutil.which("npm")
    if npm is None:
        return os.environ.get("NODE_PATH", "")
    try:
        done = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=15)
        return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return os.environ.get("NODE_PATH", "")


def diagnose(skill: Any, *, python: str | None = None) -> Diagnosis:
    """What ``skill`` (an AgentSkill) needs and which of it this machine lacks."""
    folder = Path(os.path.realpath(skill.path))
    python = python_executable(python or skill.python)
    files = _files(folder)
    local = local_modules(files, folder)
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
    py_uses: dict[str, list[str]] = {}
    program_uses: dict[str, list[str]] = {}
    node_uses: dict[str, list[str]] = {}
    for path in files:
        rel = str(path.relative_to(folder))
        text = _read(path)
        if not text:
            continue
        suffix = path.suffix.lower()
        if suffix == ".py":
            for name in python_imports(text) - stdlib - local:
                py_uses.setdefault(name, []).append(rel)
            scan = "\n".join(python_strings(text))  # ["pdftoppm", ...], "soffice --headless ...", which("node")
        elif suffix in (".js", ".mjs", ".cjs", ".ts"):
            for name in _REQUIRE_RE.findall(text):
                _add_node(node_uses, name, rel)
            scan = text
        elif suffix in (".md", ".markdown"):
            blocks = _code_blocks(text)
            scan = "\n".join(code for _, code in blocks)
            for group in _NPM_RE.findall(scan):
                for name in group.split():
                    if not name.startswith("-"):
                        node_uses.setdefault(_package(name), []).append(rel)
            for language, code in blocks:
                if language in ("python", "py"):  # ``from docx import Document`` in a python block
                    names = python_imports(code) or {m for m in _MD_IMPORT_RE.findall(code)}
                    for name in names - stdlib - local:
                        py_uses.setdefault(name, []).append(rel)
                elif language in ("javascript", "js", "typescript", "ts", "jsx", "tsx"):
                    for name in _REQUIRE_RE.findall(code):
                        _add_node(node_uses, name, rel)
                for name in _PYTHON_M_RE.findall(code):  # python -m markitdown
                    if name not in stdlib and name not in local:
                        py_uses.setdefault(name, []).append(rel)
        elif suffix in (".sh", ".bash") or text.startswith("#!"):
            scan = text
        else:
            continue
        for program in set(_PROGRAM_RE.findall(scan)):
            program_uses.setdefault(program, []).append(rel)
    found = _find_specs(sorted(py_uses), python)
    node_found = _node_modules_present(sorted(node_uses))
    needs = [Need(n, "python", found.get(n, False), PIP_NAMES.get(n, n), sorted(set(u))) for n, u in
             sorted(py_uses.items())]
    needs += [Need(p, "program", shutil.which(p) is not None, PROGRAMS[p], sorted(set(u))) for p, u in
              sorted(program_uses.items())]
    needs += [Need(n, "node", node_found.get(n, False), n, sorted(set(u))) for n, u in sorted(node_uses.items())]
    return Diagnosis(skill=skill.name, path=str(folder), python=python, needs=needs)


def _code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of a Markdown text's fenced blocks and inline code spans."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]
    rest = _FENCE_RE.sub("", text)
    return blocks + [("", m.group(1)) for m in _INLINE_RE.finditer(rest)]


def _add_node(uses: dict[str, list[str]], name: str, where: str) -> None:
    if name.startswith((".", "/", "node:")) or name.split("/")[0] in NODE_BUILTINS:
        return
    uses.setdefault(_package(name), []).append(where)


def _package(name: str) -> str:
    """``docx/lib/x`` -> ``docx``; ``@scope/pkg/sub`` -> ``@scope/pkg``."""
    parts = name.split("/")
    return "/".join(parts[:2]) if name.startswith("@") else parts[0]


__all__ = ["Diagnosis", "Need", "PIP_NAMES", "PROGRAMS", "diagnose", "python_imports"]
