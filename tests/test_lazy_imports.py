"""An import inside a function says why it is not at the top of its module: start-up time
(``# lazy: start-up time``), an optional extra (``# optional extra [a2a]``), an import
cycle, or a warm-up that loads a module on purpose. Without a reason it belongs at the top,
where a reader sees the module's dependencies (docs/architecture.md, "Imports")."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "robot_lab"

# linter directives say nothing about why; what is left of the comment must
DIRECTIVE = re.compile(r"(noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:[^;]*)[;\s]*")


def _reason(comment: str) -> str:
    return DIRECTIVE.sub("", comment.lstrip("#")).strip(" ;")


def unexplained_imports(root: Path) -> list[str]:
    """``path:line`` of each import in a function body whose lines carry no reason comment."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        comments = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                    if tok.type == tokenize.COMMENT}
        functions = [n for n in ast.walk(ast.parse(source, str(path)))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        seen: set[int] = set()
        for function in functions:
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in seen:
                    continue
                seen.add(node.lineno)
                lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                if not any(_reason(comments.get(line, "")) for line in lines):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_import_in_a_function_body_says_why_it_is_not_at_the_top() -> None:
    found = unexplained_imports(PACKAGE_DIR)
    assert not found, ("imports in function bodies with no reason (move them to the top of the module, or say "
                       "why: '# lazy: start-up time', '# optional extra [a2a]', '# lazy: import cycle with X'):\n"
                       + "\n".join(found))


# --- the checker can fail ----------------------------------------------------------------

def _package(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "robot_lab"
    root.mkdir()
    (root / "mod.py").write_text(text)
    return root


def test_an_import_in_a_function_with_no_reason_is_reported(tmp_path: Path) -> None:
    root = _package(tmp_path, (
        "import json\n"
        "\n"
        "def f():\n"
        "    import os\n"
        "    import redis  # lazy: start-up time\n"
        "    from a2a.client import (  # optional extra [a2a]\n"
        "        ClientFactory,\n"
        "    )\n"
        "    import sys  # noqa: F401\n"
        "    import yaml  # noqa: F401  (lazy: start-up time)\n"
        "\n"
        "    class Inner:\n"
        "        def g(self):\n"
        "            from robot_lab import errors\n"
        "    return os, sys\n"
    ))
    assert unexplained_imports(root) == [
        "robot_lab/mod.py:4: import os",
        "robot_lab/mod.py:9: import sys",
        "robot_lab/mod.py:14: from robot_lab import errors",
    ]
