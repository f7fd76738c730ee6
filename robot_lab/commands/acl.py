"""``robot-lab acl``: Redis ACL users per robot worker and per publisher (docs/security.md).

Prints the ``ACL SETUSER`` lines (passwords as ``>$ROBOT_LAB_ACL_PASSWORD_<USER>``), or with
``--apply`` runs them on REDIS_URL (as a user allowed to run ACL). Passwords come from those
variables or from ``--passwords-dir`` (one file per user; a missing one is generated there,
mode 0600); they are never printed or logged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from robot_lab.errors import BusError, ConfigurationError
from robot_lab.keys import default_keys
from robot_lab.settings import get_settings


def _robots_from(app_path: str | None) -> list[str]:
    from robot_lab.app import load_app  # lazy: start-up time

    return list(load_app(app_path).robot_names) if app_path else []


@click.command("acl")
@click.option("--robot", "robots", multiple=True, help="A robot whose worker gets a user (repeatable).")
@click.option("--publisher", "publishers", multiple=True,
              help="A sender name (a service, `robot-lab send --from`) that gets a user (repeatable).")
@click.option("--app", "app_path", default=None, help="Every robot of this app gets a worker user.")
@click.option("--registry", is_flag=True, help="Every robot in the Redis registry gets a worker user.")
@click.option("--coordinator/--no-coordinator", default=True, show_default=True,
              help="Also the rl-coordinator user (coordinator, status, dashboard, metrics).")
@click.option("--apply", "apply_", is_flag=True, help="Run ACL SETUSER on REDIS_URL instead of printing.")
@click.option("--passwords-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Passwords by user name; missing ones are generated here (--apply).")
@click.option("--json", "as_json", is_flag=True, help="Print the users as JSON (never passwords).")
def acl(robots: tuple[str, ...], publishers: tuple[str, ...], app_path: str | None, registry: bool,
        coordinator: bool, apply_: bool, passwords_dir: Path | None, as_json: bool) -> None:
    """Redis ACL users: one per robot worker, one per publisher, one for the coordinator.

    Each user can touch only its own keys under the key prefix, plus what the design shares
    (docs/security.md lists each exception): a publisher appends to inboxes and reads only
    its own; a worker cannot read, trim or delete another robot's inbox, DLQ, conversations
    or spec. Needs Redis >= 7. Prints ACL SETUSER lines unless --apply.
    """
    from robot_lab.workers.acl_users import acl_users, apply_users, password_for  # lazy: start-up time

    names = [*robots, *_robots_from(app_path)]
    if registry:
        from robot_lab.bus import Bus  # lazy: start-up time

        names += Bus().robots()
    if not names and not publishers:
        raise click.UsageError("name the robots (--robot, --app or --registry) and/or publishers (--publisher)")
    try:
        users = acl_users(default_keys(), names, publishers, coordinator=coordinator)
        if apply_:
            from robot_lab.connection import get_redis  # lazy: start-up time

            if get_settings().embedded:
                raise click.UsageError("--apply needs REDIS_URL (the Redis to create the users on)")
            passwords = {u.user: password_for(u, dict(os.environ), passwords_dir) for u in users}
            apply_users(get_redis(), users, passwords)
    except (BusError, ConfigurationError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"applied": apply_, "users": [u.to_dict() for u in users]}, indent=2))
    elif apply_:
        where = f"; passwords in {passwords_dir}" if passwords_dir else ""
        click.echo(f"applied {len(users)} Redis users: {', '.join(u.user for u in users)}{where}")
    else:
        click.echo("# robot-lab ACL users (docs/security.md): set each ROBOT_LAB_ACL_PASSWORD_* and REDIS_URL "
                   "(an admin), then run these lines")
        for user in users:
            click.echo(user.printable())
