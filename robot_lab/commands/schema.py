"""``robot-lab schema NAME``: print the JSON Schema of a wire type (the cross-language contract)."""

from __future__ import annotations

import click

from robot_lab.schemas.codec import SCHEMA_TYPES, schema_text


@click.command()
@click.argument("name", type=click.Choice(sorted(SCHEMA_TYPES)), default="robot-message")
def schema(name: str) -> None:
    """Print the JSON Schema (draft 2020-12) of a wire type, e.g. robot-message."""
    click.echo(schema_text(name), nl=False)
