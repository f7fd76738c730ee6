"""Bus commands: ``send``, ``tail``, ``bus stats`` and ``dlq list|show|replay|purge``.

They talk to REDIS_URL (or the embedded fakeredis when unset, which only sees this
process) with the configured key prefix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from robot_lab.errors import AwaitTimeout, BusError, SchemaError
from robot_lab.text.strings import as_str


def _bus() -> Any:
    from robot_lab.bus import Bus  # lazy: start-up time

    return Bus()


def _inbox_exists(robot: str) -> bool:
    """Whether ``robot`` has an inbox: what ``Bus.exists`` (and ``publish``) checks, read
    without building a Bus."""
    from robot_lab.connection import get_redis  # lazy: start-up time
    from robot_lab.keys import default_keys  # lazy: start-up time

    return bool(get_redis().exists(default_keys().inbox(robot)))


def _embedded() -> bool:
    from robot_lab.settings import get_settings  # lazy: start-up time

    return get_settings().embedded


EMBEDDED_NOTE = ("no inboxes: no REDIS_URL, so this command sees only its own in-process Redis; "
                 "set REDIS_URL to the Redis your workers use")


def _no_inbox(bus: Any, robot: str) -> click.ClickException:
    """The error for a robot without an inbox, saying what exists and what to do."""
    return _no_inbox_under(bus.robots(), bus.keys.prefix, robot)


def _no_inbox_under(known: list[str], prefix: str, robot: str) -> click.ClickException:
    listed = f"known: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''}" if known else "there are none"
    hint = ("no REDIS_URL: embedded mode sees only the inboxes of this one process; set REDIS_URL to the Redis "
            "your workers use") if _embedded() else "start its worker, or pass --create to make the inbox"
    return click.ClickException(
        f"Unknown channel: {robot!r} has no inbox under prefix {prefix!r} ({listed}); {hint}"
    )


def _content(text: str, as_json: bool) -> Any:
    if not as_json:
        return text
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="TEXT") from exc
    if not isinstance(value, dict):
        raise click.BadParameter("--content-json content must be a JSON object", param_hint="TEXT")
    return value


def _show_content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


@click.command()
@click.argument("robot")
@click.argument("text")
@click.option("--wait", is_flag=True, help="Block for the reply and print it.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait with --wait.")
@click.option("--conversation", "conversation_id", help="Conversation id (ordering key).")
@click.option("--from", "from_", default="cli", show_default=True, help="Sender name.")
@click.option("--content-json", "content_json", is_flag=True, help="TEXT is a JSON object, sent as content.")
@click.option("--json", "as_json", is_flag=True,
              help='Print the result as JSON: {"id": ...}, with --wait {"id", "reply"} (the reply\'s content)')
@click.option("--create", is_flag=True, help="Create the robot's inbox if nobody registered it.")
@click.option("--attach", "attachments", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A file for the robot's skills workspace, sent as bytes; repeatable.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="With --wait: save the files the reply carries into this folder.")
def send(
    robot: str, text: str, wait: bool, timeout: float, conversation_id: str | None, from_: str,
    content_json: bool, as_json: bool, create: bool, attachments: tuple[str, ...] = (), out: str | None = None,
) -> None:
    """Publish TEXT to ROBOT's inbox; prints the message id, or the reply with --wait.

    The envelope is signed when a key for the --from name is configured (signing.keys or
    signing.keys_dir, docs/security.md); under signing.verify=require, --wait accepts only
    a reply signed by ROBOT."""
    content = _content(text, content_json)
    if out is not None and not wait:
        raise click.UsageError("--out saves the reply's files: it needs --wait")
    extensions = _attachments(attachments)
    exists = _inbox_exists(robot)  # before the Bus: a refusal builds no keyring, scripts nor models
    if wait and _embedded() and not exists:
        raise click.UsageError("--wait needs REDIS_URL: in embedded mode no worker shares this process's "
                               "in-process Redis, so no reply can come")
    if not exists and not create:
        from robot_lab.connection import get_redis  # lazy: start-up time
        from robot_lab.keys import default_keys  # lazy: start-up time

        keys = default_keys()  # the registry Bus.robots lists
        raise _no_inbox_under(sorted(as_str(m) for m in get_redis().smembers(keys.registry())), keys.prefix, robot)
    bus = _bus()
    if not exists:
        bus.register(robot)
        if not _embedded() and not bus.redis.exists(bus.keys.robot_spec(robot)):
            click.echo(f"note: created inbox {robot!r}, but no robot of that name is published; until a worker "
                       f"serves it, `robot-lab status` lists it as an orphan (`robot-lab bus remove {robot}` "
                       "deletes it)", err=True)
    try:
        if wait:
            reply = bus.request(robot, content, timeout=timeout, from_=from_, conversation_id=conversation_id,
                                extensions=extensions)
            click.echo(json.dumps({"id": reply.in_reply_to, "reply": reply.content}) if as_json
                       else _show_content(reply.content))
            _reply_files(bus, reply, out)
        else:
            message = bus.publish(robot, content, from_=from_, conversation_id=conversation_id,
                                  extensions=extensions)
            click.echo(json.dumps({"id": message.id}) if as_json else message.id)
    except AwaitTimeout as exc:
        hint = ("no REDIS_URL: embedded mode has no worker to answer" if _embedded() else
                f"is a worker serving {robot!r}? (`robot-lab status {robot}`; raise --timeout for a slow model)")
        raise click.ClickException(f"{exc}; {hint}") from exc
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc


def _attachments(paths: tuple[str, ...]) -> dict[str, Any] | None:
    if not paths:
        return None

    from robot_lab.sandbox.workspace import envelope_attachments  # lazy: start-up time

    return {"attachments": envelope_attachments([(Path(p).name, Path(p).read_bytes()) for p in paths])}


def _reply_files(bus: Any, reply: Any, out: str | None) -> None:
    """List the files a reply carries (stderr); save them under ``out`` when given."""
    from robot_lab.bus.reply_files import save_attachments  # lazy: start-up time

    files = reply.extensions.get("attachments") or []
    for item in files:
        how = "inline" if "content_base64" in item else (f"ref {item['ref']}" if item.get("ref") else
                                                          f"not sent: {item.get('missing')}")
        click.echo(f"file: {item.get('name')} ({item.get('size')} bytes, {how})", err=True)
    if out is not None and files:
        for path in save_attachments(bus, [f for f in files if "missing" not in f], out):
            click.echo(f"saved: {path}", err=True)


def _format_entry(entry_id: str, fields: dict[bytes, bytes], as_json: bool) -> str:
    from robot_lab.schemas import decode_message  # lazy: start-up time

    raw = fields.get(b"envelope")
    if as_json:
        return raw.decode("utf-8", "replace") if raw is not None else json.dumps({k.decode(): v.decode() for k, v in fields.items()})
    if raw is None:
        return f"{entry_id}  INVALID (no envelope field)"
    try:
        m = decode_message(raw)
    except SchemaError as exc:
        return f"{entry_id}  INVALID {exc}"
    extra = f" conv={m.conversation_id}" if m.conversation_id else ""
    reply = f" re={m.in_reply_to}" if m.in_reply_to else ""
    return f"{entry_id}  {m.from_} -> {m.to} [{m.kind}]{extra}{reply}  {_show_content(m.content)}"


@click.command()
@click.argument("robot")
@click.option("--from-start", is_flag=True, help="Print the entries already in the inbox first.")
@click.option("--count", "-n", type=int, default=None, help="Stop after N entries.")
@click.option("--json", "as_json", is_flag=True, help="Print raw envelopes (one JSON per line).")
@click.option("--timeout", type=float, default=None, help="Stop after this many seconds.")
def tail(robot: str, from_start: bool, count: int | None, as_json: bool, timeout: float | None) -> None:
    """Follow ROBOT's inbox live (reads with XREAD; consumes nothing)."""
    bus = _bus()
    key = bus.keys.inbox(robot)
    if not bus.exists(robot):
        raise _no_inbox(bus, robot)
    cursor = "0-0"
    if not from_start:
        last = bus.redis.xrevrange(key, count=1)
        cursor = last[0][0].decode() if last else "0-0"
    seen = 0
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while count is None or seen < count:
            if end is not None and time.monotonic() >= end:
                break
            result = bus.redis.xread({key: cursor}, count=100, block=500)
            for _stream, entries in result or []:
                for entry_id, fields in entries:
                    cursor = entry_id.decode()
                    click.echo(_format_entry(cursor, fields, as_json))
                    seen += 1
                    if count is not None and seen >= count:
                        return
    except KeyboardInterrupt:  # pragma: no cover - interactive
        return


@click.group("bus")
def bus_group() -> None:
    """Inspect robot inboxes (stats) and remove stray ones (remove)."""


@bus_group.command("stats")
@click.argument("robots", nargs=-1)
@click.option("--json", "as_json", is_flag=True)
def stats(robots: tuple[str, ...], as_json: bool) -> None:
    """Per robot: length, groups, consumers, pending, lag and DLQ size."""
    rows = _bus().stats(list(robots) or None)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo(EMBEDDED_NOTE if _embedded() else "no inboxes yet (a worker registers its robots' inboxes)")
        return
    from rich.console import Console  # lazy: start-up time
    from rich.table import Table  # lazy: start-up time

    table = Table("robot", "length", "groups", "consumers", "pending", "lag", "dlq")
    for r in rows:
        table.add_row(r.robot, str(r.length), str(r.groups), str(r.consumers), str(r.pending),
                      "?" if r.lag is None else str(r.lag), str(r.dlq))
    Console().print(table)


@bus_group.command("remove")
@click.argument("robots", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also remove an inbox whose robot is published or served.")
def remove(robots: tuple[str, ...], force: bool) -> None:
    """Delete the inbox, dead letters and registration of ROBOTS (a mistyped `send --create`)."""
    bus = _bus()
    for robot in robots:
        if not bus.exists(robot) and robot not in bus.robots():
            raise _no_inbox(bus, robot)
        if not force and bus.redis.exists(bus.keys.robot_spec(robot)):
            raise click.ClickException(f"{robot!r} is a published robot; pass --force to delete its inbox anyway")
        bus.unregister(robot, drop=True)
        click.echo(f"removed inbox {robot!r}")


def _require_robot(bus: Any, robot: str) -> None:
    """A typo in ROBOT must not read as "0 dead letters": a robot with neither an inbox nor
    dead letters is unknown."""
    if _embedded():  # this process's own fakeredis knows no robot: say why instead (EMBEDDED_NOTE)
        return
    known = bus.robots()
    if robot in known or bus.dead_letters(robot, 1):
        return
    listed = f"known: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''}" if known else "there are none"
    raise click.ClickException(
        f"unknown robot {robot!r}: no inbox and no dead letters under prefix {bus.keys.prefix!r} ({listed})"
    )


@click.group("dlq")
def dlq_group() -> None:
    """Dead letters of a robot: list, show, replay, purge."""


@dlq_group.command("list")
@click.argument("robot")
@click.option("--count", "-n", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dlq_list(robot: str, count: int, as_json: bool) -> None:
    """List ROBOT's dead letters, oldest first."""
    bus = _bus()
    letters = bus.dead_letters(robot, count)
    if not letters:
        _require_robot(bus, robot)
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in letters], indent=2))
        return
    if not letters:
        click.echo(f"no dead letters for {robot!r}")
        if _embedded():
            click.echo(EMBEDDED_NOTE)
        return
    for d in letters:
        click.echo(f"{d.dlq_id}  {d.reason:<14} deliveries={d.deliveries}  {d.error}")


@dlq_group.command("show")
@click.argument("robot")
@click.argument("dlq_id")
def dlq_show(robot: str, dlq_id: str) -> None:
    """Print one dead letter with its envelope."""
    try:
        letter = _bus().dead_letter(robot, dlq_id)
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc
    data = letter.to_dict()
    try:
        data["envelope"] = json.loads(letter.envelope)
    except ValueError:
        pass
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@dlq_group.command("replay")
@click.argument("robot")
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Replay every dead letter of ROBOT.")
def dlq_replay(robot: str, ids: tuple[str, ...], all_: bool) -> None:
    """Put dead letters back on ROBOT's inbox (fresh delivery count)."""
    if not ids and not all_:
        raise click.UsageError("give dead-letter ids or --all")
    bus = _bus()
    _require_robot(bus, robot)
    try:
        new_ids = bus.replay_dead_letters(robot, None if all_ else list(ids))
    except BusError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"replayed {len(new_ids)} message(s) into {robot!r}")


@dlq_group.command("purge")
@click.argument("robot")
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Delete every dead letter of ROBOT.")
def dlq_purge(robot: str, ids: tuple[str, ...], all_: bool) -> None:
    """Delete dead letters of ROBOT."""
    if not ids and not all_:
        raise click.UsageError("give dead-letter ids or --all")
    bus = _bus()
    _require_robot(bus, robot)
    n = bus.purge_dead_letters(robot, None if all_ else list(ids))
    click.echo(f"purged {n} dead letter(s) of {robot!r}")
