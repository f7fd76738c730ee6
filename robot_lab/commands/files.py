"""``robot-lab files get REF``: the bytes of a file a reply referred to (too big to travel inline)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from robot_lab.commands.bus import _bus
from robot_lab.errors import BusError


@click.group("files")
def files_group() -> None:
    """Files robots wrote, carried back in replies (docs/skills.md, "Files come back")."""


@files_group.command("get")
@click.argument("ref")
@click.option("--out", "-o", "out", type=click.Path(dir_okay=True), default=None,
              help="Write it here (a file, or a folder to write REF into); default: stdout.")
def get(ref: str, out: str | None) -> None:
    """Fetch the file stored under REF (a reply attachment's ``ref``, its sha256) from Redis.

    \b
    Examples:
      robot-lab files get 3f0a...e9 --out report.xlsx
      robot-lab files get 3f0a...e9 > report.xlsx
    """
    ref = ref.strip()
    if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
        raise click.BadParameter("REF is the 64 hex digits of a reply attachment's 'ref'", param_hint="REF")
    try:
        data = _bus().fetch_file(ref)
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc
    if out is None:
        sys.stdout.buffer.write(data)
        return
    target = Path(out)
    if target.is_dir():
        target = target / ref
    target.write_bytes(data)
    click.echo(f"{target} ({len(data)} bytes)", err=True)
