"""The plain tables of ``robot-lab status`` and ``runs`` (commands/plain.py): aligned columns
that never wrap, colour only on a terminal."""

from __future__ import annotations

import io

import pytest

from robot_lab.commands.plain import Table, style, use_color


def test_columns_align_left_and_right_and_styles_are_ansi_only_with_color() -> None:
    table = Table("robots", [("robot", "left"), ("queued", "right")])
    table.add_row("billing", "3")
    table.add_row("a-much-longer-robot-name", ("12", "bold red"))
    plain = table.render(color=False)
    assert plain.splitlines() == [
        "robots",
        "robot                     queued",
        "------------------------  ------",
        "billing                        3",
        "a-much-longer-robot-name      12",
    ]
    colored = table.render(color=True)
    assert "\x1b[1;31m12\x1b[0m" in colored and "\x1b" not in plain
    assert style("x", None, True) == "x" and style("x", "cyan", False) == "x"


def test_color_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(Tty()) and not use_color(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(Tty())
