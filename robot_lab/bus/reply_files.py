"""The files a run wrote, carried back in its reply: inline, or by reference through Redis.

A served robot's skills write into a workspace on the worker's host; the publisher is
usually elsewhere. So a reply lists each file of ``RobotResult.files`` in its top-level
``attachments`` list (an extension field, like a message's attachments):

* ``{"name", "size", "sha256", "media_type", "content_base64"}`` while the reply's files
  add up to at most ``bus.attachment_inline_bytes`` (the envelope stays under
  ``bus.max_envelope_bytes``);
* ``{"name", "size", "sha256", "media_type", "ref"}`` otherwise: the bytes are stored under
  ``<prefix>:file:<sha256>`` for ``bus.file_ttl`` seconds, and any process reaches them with
  :func:`fetch_file` (``Bus.fetch_file``, ``robot-lab files get``);
* ``{..., "missing": "<why>"}`` for a file larger than ``bus.max_file_bytes`` or gone.

The digest names the content, so a redelivered reply or two replies with one file share
one key.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from typing import Any

from robot_lab.errors import BusError
from robot_lab.logging import get_logger

log = get_logger("robot_lab.bus.reply_files")


def reply_attachments(bus: Any, result: Any) -> list[dict[str, Any]]:
    """The ``attachments`` of the reply to ``result`` (a RobotResult with ``files``)."""
    files = list(getattr(result, "files", None) or [])
    folder = getattr(result, "workspace", None)
    if not files or not folder:
        return []
    settings = bus.settings
    inline_left = int(getattr(settings, "attachment_inline_bytes", 256 * 1024))
    largest = int(getattr(settings, "max_file_bytes", 50 * 1024 * 1024))
    out: list[dict[str, Any]] = []
    for item in files:
        entry: dict[str, Any] = {"name": item.path, "size": item.size, "sha256": item.sha256,
                                 "media_type": item.media_type}
        out.append(entry)
        if item.size > largest:
            entry["missing"] = f"larger than bus.max_file_bytes ({largest})"
            continue
        try:
            data = _read(os.path.join(folder, item.path), item.size)
        except OSError as exc:
            entry["missing"] = f"cannot read it: {exc.strerror or exc}"
            continue
        if hashlib.sha256(data).hexdigest() != item.sha256:
            entry["missing"] = "changed after the run ended"
            continue
        if len(data) <= inline_left:
            inline_left -= len(data)
            entry["content_base64"] = base64.b64encode(data).decode("ascii")
        else:
            bus.redis.set(bus.keys.result_file(item.sha256), data, ex=int(getattr(settings, "file_ttl", 86_400)))
            entry["ref"] = item.sha256
    log.info("bus.reply_files", files=len(out), inline=sum("content_base64" in e for e in out),
             stored=sum("ref" in e for e in out))
    return out


def _read(path: str, size: int) -> bytes:
    """The file, refusing a link (a script could have left one to a host file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        return handle.read(size + 1)


def fetch_file(bus: Any, attachment: Mapping[str, Any] | str) -> bytes:
    """The bytes of one reply attachment (inline or a ``ref``), checked against its digest.
    Raises BusError when a reference expired or a file was not sent."""
    if isinstance(attachment, str):
        attachment = {"ref": attachment, "sha256": attachment, "name": attachment}
    name = attachment.get("name", "?")
    if attachment.get("content_base64") is not None:
        data = base64.b64decode(str(attachment["content_base64"]))
    elif attachment.get("ref"):
        raw = bus.redis.get(bus.keys.result_file(str(attachment["ref"])))
        if raw is None:
            raise BusError(f"file {name!r} is no longer stored (bus.file_ttl passed, or another Redis)")
        data = bytes(raw)
    else:
        raise BusError(f"file {name!r} was not sent: {attachment.get('missing', 'no content and no ref')}")
    want = attachment.get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise BusError(f"file {name!r} does not match its sha256")
    return data


def save_attachments(bus: Any, attachments: list[Mapping[str, Any]], folder: str) -> list[str]:
    """Write a reply's files into ``folder`` (names kept to their relative paths, never
    outside it); the paths written."""
    root = os.path.realpath(folder)
    os.makedirs(root, exist_ok=True)
    written: list[str] = []
    for item in attachments:
        rel = os.path.normpath(str(item.get("name", ""))).lstrip("/")
        target = os.path.realpath(os.path.join(root, rel))
        if not rel or rel.startswith("..") or not target.startswith(root + os.sep):
            raise BusError(f"attachment name {item.get('name')!r} is not a relative path")
        data = fetch_file(bus, item)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(data)
        written.append(target)
    return written


__all__ = ["fetch_file", "reply_attachments", "save_attachments"]
