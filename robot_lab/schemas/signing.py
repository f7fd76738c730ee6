"""Envelope signatures: HMAC-SHA256 over a canonical form any language can rebuild.

The canonical form of an envelope is the RFC 8785 JSON Canonicalization Scheme (JCS) of the
envelope's JSON object with its ``signature`` member removed: object members sorted by their
names' UTF-16 code units, no whitespace, strings escaped as ``JSON.stringify`` escapes them,
numbers written as ECMAScript writes them, the whole encoded as UTF-8. It is computed from
the envelope *as it travels* (the JSON text in the stream entry), so fields a verifier does
not know (extensions) are signed too, and nothing depends on how a library re-encodes a date.

``signature`` holds the lowercase hex HMAC-SHA256 of those bytes; the key is the UTF-8 bytes of
the configured secret, and ``headers.key_id`` names which of the sender's keys signed (it is
inside the signed bytes). docs/security.md has the exact recipe, a test vector and a Node.js
signer; :mod:`robot_lab.bus.keyring` holds the keys and checks entries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from typing import Any

import msgspec

from robot_lab.schemas.codec import encode_message
from robot_lab.schemas.messages import RobotMessage

SIGNATURE_FIELD = "signature"
KEY_ID_HEADER = "key_id"
KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) bytes of a JSON value (dicts, lists, str, int, float, bool, None).

    Raises ValueError for what JSON cannot carry portably (NaN, infinities, lone surrogates,
    non-string keys)."""
    parts: list[str] = []
    _write(value, parts)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate from a "\ud800" escape
        raise ValueError(f"not canonicalizable: {exc.reason}") from None


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(es_number(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise ValueError(f"not a JSON value: {type(value).__name__}")


def _utf16_key(key: Any) -> bytes:
    if not isinstance(key, str):
        raise ValueError(f"object key {key!r} is not a string")
    return key.encode("utf-16-be", "surrogatepass")  # byte order = UTF-16 code unit order


def es_number(value: float) -> str:
    """A float as ECMAScript's ``Number.prototype.toString`` writes it (what JCS requires):
    the shortest round-trip digits, plain notation from 1e-6 up to 1e21, else ``de±x``."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError("NaN and infinities are not JSON")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    whole = whole.lstrip("0")
    if whole:
        digits, point = whole + frac, len(whole)
    else:  # 0.000ddd
        point = -(len(frac) - len(frac.lstrip("0")))
        digits = frac.lstrip("0")
    digits = digits.rstrip("0") or "0"
    n = point + (int(exp_text) if exp_text else 0)  # value = 0.digits * 10**n
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + text


def canonical_envelope(envelope: dict[str, Any]) -> bytes:
    """The signed bytes of an envelope JSON object: JCS of it without ``signature``."""
    return canonical_json({k: v for k, v in envelope.items() if k != SIGNATURE_FIELD})


def hmac_hex(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def envelope_signature(envelope: dict[str, Any], secret: bytes) -> str:
    """Lowercase hex HMAC-SHA256 of the canonical form of ``envelope`` (a decoded JSON object)."""
    return hmac_hex(secret, canonical_envelope(envelope))


def sign_message(message: RobotMessage, key_id: str, secret: bytes) -> RobotMessage:
    """``message`` with ``headers.key_id`` set and ``signature`` computed over what
    :func:`~robot_lab.schemas.codec.encode_message` will put on the wire."""
    if not KEY_ID_RE.match(key_id):
        raise ValueError(f"invalid key id {key_id!r}: use 1-64 letters, digits, '_' or '-'")
    unsigned = msgspec.structs.replace(message, signature=None,
                                       headers={**message.headers, KEY_ID_HEADER: key_id})
    doc = json.loads(encode_message(unsigned))
    return msgspec.structs.replace(unsigned, signature=envelope_signature(doc, secret))


def signature_matches(envelope: dict[str, Any], secret: bytes) -> bool:
    """Whether ``envelope['signature']`` is the HMAC of its canonical form (constant time)."""
    given = envelope.get(SIGNATURE_FIELD)
    if not isinstance(given, str) or not _HEX64.match(given):
        return False
    return hmac.compare_digest(given, envelope_signature(envelope, secret))
