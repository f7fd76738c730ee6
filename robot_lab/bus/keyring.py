"""Signing keys per sender, and the check an inbox entry passes before it is handled.

A :class:`Keyring` holds each sender's keys by key id: from settings (``signing.keys``,
``ROBOT_LAB_SIGNING__KEYS``) and from a directory of files (``signing.keys_dir``, a mounted
Kubernetes Secret), re-read every ``signing.reload_interval`` seconds so a rotated Secret is
picked up without a restart. The bus signs what a sender with a key publishes or replies
(:meth:`Keyring.sign`); a poller checks each entry with :func:`authenticate` under the
robot's mode (``off | warn | require``). The canonical form and the HMAC are in
:mod:`robot_lab.schemas.signing`; docs/security.md documents both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from robot_lab.errors import ConfigurationError
from robot_lab.logging import get_logger
from robot_lab.schemas import RobotMessage
from robot_lab.schemas.signing import KEY_ID_HEADER, KEY_ID_RE, SIGNATURE_FIELD, sign_message, signature_matches
from robot_lab.settings import get_settings

if TYPE_CHECKING:  # names only: no pydantic models at import (start-up time)
    from robot_lab.settings import Settings, SigningSettings

log = get_logger("robot_lab.bus.keyring")

MIN_SECRET_BYTES = 16
VERIFY_MODES = ("off", "warn", "require")
Keys = dict[str, dict[str, bytes]]  # sender -> key id -> secret


def _check_key(sender: str, key_id: str, secret: bytes, where: str) -> None:
    if not KEY_ID_RE.match(key_id):
        raise ConfigurationError(f"signing key {sender}/{key_id!r} ({where}): a key id is 1-64 letters, digits, "
                                 "'_' or '-'")
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigurationError(f"signing key {sender}/{key_id} ({where}) is {len(secret)} bytes; use at least "
                                 f"{MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)")


def read_keys_dir(path: str | Path) -> Keys:
    """Keys from files: ``<dir>/<sender>/<key_id>`` or ``<dir>/<sender>.<key_id>`` (split at
    the last dot), one secret per file, surrounding whitespace stripped. Names starting with
    ``.`` are skipped (a Secret volume's ``..data`` links)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigurationError(f"signing.keys_dir {str(root)!r} is not a directory")
    found: Keys = {}

    def add(sender: str, key_id: str, file: Path) -> None:
        secret = file.read_bytes().strip()
        _check_key(sender, key_id, secret, str(file))
        found.setdefault(sender, {})[key_id] = secret

    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            for file in sorted(entry.iterdir()):
                if not file.name.startswith(".") and file.is_file():
                    add(entry.name, file.name, file)
        elif entry.is_file() and "." in entry.name:
            sender, _, key_id = entry.name.rpartition(".")
            add(sender, key_id, entry)
    return found


class Keyring:
    """Secrets per sender and key id; signs for a sender and finds a verifier's key."""

    def __init__(self, keys: Mapping[str, Mapping[str, bytes | str]] | None = None, *,
                 current: Mapping[str, str] | None = None, keys_dir: str | None = None,
                 reload_interval: float = 30.0) -> None:
        self._static: Keys = {}
        for sender, by_id in (keys or {}).items():
            for key_id, secret in by_id.items():
                raw = secret.encode() if isinstance(secret, str) else bytes(secret)
                _check_key(sender, key_id, raw, "signing.keys")
                self._static.setdefault(sender, {})[key_id] = raw
        self._current = dict(current or {})
        self._dir = keys_dir
        self._interval = reload_interval
        self._lock = threading.Lock()
        self._loaded_at = float("-inf")
        self._keys: Keys = self._static
        self._refresh()

    @classmethod
    def from_settings(cls, settings: SigningSettings) -> Keyring:
        keys = {s: {k: v.get_secret_value() for k, v in ids.items()} for s, ids in settings.keys.items()}
        return cls(keys, current=settings.current, keys_dir=settings.keys_dir,
                   reload_interval=settings.reload_interval)

    def _refresh(self) -> Keys:
        if self._dir is None or time.monotonic() - self._loaded_at < self._interval:
            return self._keys
        with self._lock:
            if time.monotonic() - self._loaded_at >= self._interval:
                merged = {s: dict(ids) for s, ids in read_keys_dir(self._dir).items()}
                for sender, ids in self._static.items():
                    merged.setdefault(sender, {}).update(ids)
                self._keys, self._loaded_at = merged, time.monotonic()
        return self._keys

    def __bool__(self) -> bool:
        return bool(self._refresh())

    def senders(self) -> list[str]:
        return sorted(self._refresh())

    def key(self, sender: str, key_id: str) -> bytes | None:
        return self._refresh().get(sender, {}).get(key_id)

    def signing_key(self, sender: str) -> tuple[str, bytes] | None:
        """``(key id, secret)`` ``sender`` signs with: ``signing.current[sender]``, else its
        last key (settings order, then files sorted by name)."""
        ids = self._refresh().get(sender)
        if not ids:
            return None
        key_id = self._current.get(sender)
        if key_id is None or key_id not in ids:
            if key_id is not None:
                log.warning("bus.signing_key_missing", sender=sender, key_id=key_id)
            key_id = list(ids)[-1]
        return key_id, ids[key_id]

    def sign(self, message: RobotMessage) -> RobotMessage:
        """``message`` signed with its sender's current key; unchanged when it has none."""
        found = self.signing_key(message.from_)
        return message if found is None else sign_message(message, *found)

    def problem(self, raw: bytes, message: RobotMessage) -> str:
        """Why the entry ``raw`` (decoded as ``message``) is not authentic; '' when it is."""
        if message.signature is None:
            return f"unsigned envelope from {message.from_!r}"
        key_id = message.headers.get(KEY_ID_HEADER)
        if not key_id:
            return f"envelope from {message.from_!r} has a signature but no headers.{KEY_ID_HEADER}"
        secret = self.key(message.from_, key_id)
        if secret is None:
            return f"no key {key_id!r} is configured for sender {message.from_!r}"
        try:
            doc = json.loads(raw)
            ok = isinstance(doc, dict) and signature_matches(doc, secret)
        except (ValueError, RecursionError, TypeError):
            ok = False
        if not ok:
            return f"the {SIGNATURE_FIELD} does not match the envelope (key {key_id!r} of {message.from_!r})"
        return ""


_default: tuple[Settings, Keyring] | None = None


def default_keyring() -> Keyring:
    """The keyring of the process settings (built once per settings object)."""
    global _default
    settings = get_settings()
    if _default is None or _default[0] is not settings:
        _default = (settings, Keyring.from_settings(settings.signing))
    return _default[1]


def verify_mode(robot: str) -> str:
    """The verification mode of ``robot`` from settings (``signing.robots`` over ``signing.verify``)."""
    return get_settings().signing.mode_for(robot)
