"""Plain text tables and styled lines for ``robot-lab status`` and ``runs``.

rich costs ~0.03-0.05 s of CPU to import and lay out, a tenth of what ``rq info`` spends in
all (bench/startup.py), for tables these commands can print as aligned columns. Colour (ANSI)
only on a terminal, never when ``NO_COLOR`` is set or ``TERM=dumb``; a table never wraps, so a
pipe or a log gets every cell whole.
"""

from __future__ import annotations

import os
from typing import IO, Union

# style name -> SGR codes
_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "magenta": "35", "cyan": "36"}

Cell = Union[str, tuple[str, str]]  # text, or (text, style such as "bold red")


def use_color(stream: IO[str]) -> bool:
    """Whether ``stream`` gets ANSI colours: a terminal, without NO_COLOR or TERM=dumb."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def style(text: str, name: str | None, color: bool) -> str:
    """``text`` in the style ``name`` ("bold", "red", "bold red", ...) when ``color``."""
    if not color or not name:
        return text
    codes = ";".join(_SGR[part] for part in name.split())
    return f"\x1b[{codes}m{text}\x1b[0m"


class Table:
    """A titled table of columns, each left- or right-justified, rendered as plain lines."""

    def __init__(self, title: str, columns: list[tuple[str, str]]) -> None:
        self.title = title
        self.columns = columns  # (header, "left" | "right")
        self.rows: list[list[tuple[str, str | None]]] = []

    def add_row(self, *cells: Cell) -> None:
        self.rows.append([(c, None) if isinstance(c, str) else c for c in cells])

    def render(self, color: bool) -> str:
        widths = [len(header) for header, _ in self.columns]
        for row in self.rows:
            widths = [max(w, len(text)) for w, (text, _) in zip(widths, row)]

        def line(cells: list[tuple[str, str | None]]) -> str:
            out = []
            for (text, name), width, (_, justify) in zip(cells, widths, self.columns):
                pad = " " * (width - len(text))
                out.append(style(text, name, color) + pad if justify == "left" else pad + style(text, name, color))
            return "  ".join(out).rstrip()

        header = line([(h, "bold") for h, _ in self.columns])
        rule = "  ".join("-" * w for w in widths)
        return "\n".join([style(self.title, "bold", color), header, rule, *(line(r) for r in self.rows)])
