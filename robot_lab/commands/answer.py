"""``robot-lab pending`` and ``robot-lab answer``: the input requests of parked runs.

A run whose robot asked a person (``ask_user``, a tool that ``requires_approval``) waits
without holding a worker; these commands list what waits and answer it once, from any
machine with ``REDIS_URL`` (docs/durable.md).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from typing import Any

import click

from robot_lab.errors import ConfigurationError


def _require_redis() -> None:
    from robot_lab.settings import get_settings  # lazy: start-up time

    if get_settings().embedded:
        raise click.ClickException("this needs REDIS_URL: an embedded run's requests live only in its own process")


def _row(found: Any) -> dict[str, Any]:
    data = found.to_dict()
    return {"id": found.id, "run_id": found.owner.get("run_id"), "task": found.owner.get("task"),
            "robot": data.get("robot"), "kind": data.get("kind"), "question": data.get("question"),
            "choices": data.get("choices"), "default": data.get("default"), "tool": data.get("tool"),
            "arguments": data.get("arguments"), "created_at": data.get("created_at"),
            "deadline": data.get("deadline")}


@click.command("pending")
@click.option("--run", "run_id", default=None, help="Only the requests of this run")
@click.option("--json", "as_json", is_flag=True, help="Print the requests as JSON")
def pending(run_id: str | None, as_json: bool) -> None:
    """Input requests waiting for an answer (oldest first).

    An index of the wrong type (written by hand) gets a problem line on stderr naming it; the
    requests are then found from their records and listed all the same (exit 0)."""
    _require_redis()
    from robot_lab.connection import get_redis  # lazy: start-up time
    from robot_lab.inputs import InputStore  # lazy: start-up time
    from robot_lab.keys import default_keys  # lazy: start-up time
    from robot_lab.network.human_input import pending as list_pending  # lazy: start-up time

    connection, keys = get_redis(), default_keys()
    for problem in InputStore(connection, keys).index_problems():
        click.echo(f"! {problem}: read around it (delete it and robot-lab starts it anew)", err=True)
    rows = [_row(r) for r in list_pending(connection, keys)
            if run_id is None or r.owner.get("run_id") == run_id]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("nothing waits for an answer")
        return
    for row in rows:
        when = dt.datetime.fromtimestamp(row["created_at"]).strftime("%Y-%m-%d %H:%M:%S") if row["created_at"] else ""
        where = f"run {row['run_id']} task {row['task']}" if row["run_id"] else "in-process run"
        click.echo(f"{row['id']}  {when}  {row['robot']}  {where}")
        if row["kind"] == "approval":
            click.echo(f"    approve {row['tool']}({json.dumps(row['arguments'])})?  "
                       f"robot-lab answer {row['id']} --approve | --deny WHY")
        else:
            choices = f"  choices: {', '.join(row['choices'])}" if row["choices"] else ""
            default = f"  default: {row['default']}" if row["default"] is not None else ""
            click.echo(f"    {row['question']}{choices}{default}")


@click.command("answer")
@click.argument("target")
@click.argument("text", required=False)
@click.option("--approve", is_flag=True, help="Approve the tool call waiting for approval")
@click.option("--deny", "deny", default=None, metavar="WHY", help="Deny it, with the reason the model sees")
@click.option("--by", "by", default=None, help="Who answers (default: the login name)")
@click.option("--json", "as_json", is_flag=True, help="Print the answered request as JSON")
def answer(target: str, text: str | None, approve: bool, deny: str | None, by: str | None, as_json: bool) -> None:
    """Answer TARGET (a request id, or a run id with one pending request) with TEXT, or
    --approve / --deny WHY an approval. The run resumes on any worker of its robot."""
    _require_redis()
    from robot_lab.network.human_input import answer as give, for_run  # lazy: start-up time
    from robot_lab.inputs import InputStore  # lazy: start-up time
    from robot_lab.connection import get_redis  # lazy: start-up time
    from robot_lab.keys import default_keys  # lazy: start-up time

    if approve and deny is not None:
        raise click.UsageError("give --approve or --deny, not both")
    if text is None and not approve and deny is None:
        raise click.UsageError("give the answer TEXT, --approve or --deny WHY")
    connection, keys = get_redis(), default_keys()
    request_id = target
    if InputStore(connection, keys).get(target) is None:
        waiting = for_run(target, connection, keys)
        if len(waiting) == 1:
            request_id = waiting[0].id
        elif len(waiting) > 1:
            raise click.ClickException(f"run {target} has {len(waiting)} pending requests: "
                                       f"{', '.join(r.id for r in waiting)}; answer one by its id")
    decision = True if approve else (False if deny is not None else None)
    try:
        found = give(request_id, deny if deny is not None else text, approve=decision,
                     by=by or _login(), connection=connection, keys=keys)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(found.to_dict(), default=str))
        return
    where = f"run {found.owner.get('run_id')} task {found.owner.get('task')} resumes" if found.owner.get("run_id") else \
        "run it again with the same durable_id to resume"
    click.echo(f"answered {found.id}: {where}")


def _login() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no login name (a container): still say where it came from
        return "cli"
