"""Signatures of rq task jobs: the job signer's key over the job id, function and arguments.

The coordinator and every worker that advances or sweeps a run enqueue task jobs
(:mod:`.enqueue`); each signs what it enqueues when it holds a key of :data:`JOB_SIGNER`
(``signing.keys.coordinator``, or ``<keys_dir>/coordinator/<key id>``). The signature goes in
the job's rq ``meta``; :mod:`.job_policy` checks it under ``signing.verify=require``. The
signed bytes are the RFC 8785 form of ``{"id", "func", "args"}`` (docs/security.md, section 6),
HMAC-SHA256 as for envelopes.
"""

from __future__ import annotations

import hmac
from typing import Any

from robot_lab.bus.keyring import default_keyring
from robot_lab.schemas.signing import canonical_json, hmac_hex

JOB_SIGNER = "coordinator"
SIGNATURE_META = "robot_lab_signature"
KEY_ID_META = "robot_lab_key_id"


def _signed_bytes(job_id: str, func: str, args: list[Any]) -> bytes:
    return canonical_json({"id": job_id, "func": func, "args": list(args)})


def job_signature_meta(job_id: str, func: str, args: list[Any]) -> dict[str, str]:
    """rq ``meta`` carrying the job signer's signature, or ``{}`` when this process has no
    key of :data:`JOB_SIGNER`."""
    found = default_keyring().signing_key(JOB_SIGNER)
    if found is None:
        return {}
    key_id, secret = found
    return {SIGNATURE_META: hmac_hex(secret, _signed_bytes(job_id, func, args)), KEY_ID_META: key_id}


def signature_problem(job_id: str, func: str, args: list[Any], meta: Any) -> str:
    """Why the job's ``meta`` holds no valid signature of it ('' when it does)."""
    meta = meta if isinstance(meta, dict) else {}
    given, key_id = meta.get(SIGNATURE_META), meta.get(KEY_ID_META)
    if not isinstance(given, str) or not isinstance(key_id, str):
        return f"job {job_id!r} is not signed by {JOB_SIGNER!r}"
    secret = default_keyring().key(JOB_SIGNER, key_id)
    if secret is None:
        return f"no key {key_id!r} is configured for job signer {JOB_SIGNER!r}"
    if not hmac.compare_digest(given, hmac_hex(secret, _signed_bytes(job_id, func, args))):
        return f"the signature of job {job_id!r} does not match its id, function and arguments"
    return ""
