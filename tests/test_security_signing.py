"""Signed envelopes. HMAC-SHA256 over the RFC 8785 canonical form (the test
vector of docs/security.md), keys per sender with rotation, and each robot's mode: under
``require`` an unsigned, wrongly keyed, tampered, unknown-key or forged-``from`` entry is
dead-lettered as ``unauthenticated`` with no model call; under ``warn`` it is logged and runs.
Worker processes on a real Redis: tests/test_security_signing_procs.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from robot_lab.bus import Bus, BusPoller
from robot_lab.keys import Keys
from robot_lab.bus.keyring import Keyring, read_keys_dir
from robot_lab.cli import main
from robot_lab.errors import ConfigurationError, RemoteError
from robot_lab.llm.recording import clear_recorded_calls, recorded_calls
from robot_lab.runtime.robot import build
from robot_lab.schemas import decode_message, encode_message
from robot_lab.settings import get_settings
from robot_lab.schemas.signing import canonical_envelope, canonical_json, envelope_signature, sign_message
from tests.redis_server import REPO_ROOT, wait_for

DOCS = REPO_ROOT / "docs" / "security.md"
CLIENT_KEY = "client-key-0001-0123456789abcdef"
CLIENT_KEY_NEW = "client-key-0002-fedcba9876543210"
BILLING_KEY = "billing-key-0001-0123456789abcdef"
TECH_KEY = "technical-key-01-0123456789abcdef"

# --- the documented canonical form and test vector -------------------------------------------
VECTOR_KEY = b"robot-lab-test-vector-key-0001"
VECTOR_ENVELOPE = ('{"v":1,"id":"vec-0001","to":"billing","from":"frontdesk","reply_to":"frontdesk",'
                   '"conversation_id":"ticket-42","created_at":"2026-05-01T12:00:00.000Z","headers":{"key_id":"k1"},'
                   '"content":{"question":"Où est ma facture ?","amount":12.50,"lines":[1,2.0,1.0e-7]}}')
VECTOR_CANONICAL = ('{"content":{"amount":12.5,"lines":[1,2,1e-7],"question":"Où est ma facture ?"},'
                    '"conversation_id":"ticket-42","created_at":"2026-05-01T12:00:00.000Z","from":"frontdesk",'
                    '"headers":{"key_id":"k1"},"id":"vec-0001","reply_to":"frontdesk","to":"billing","v":1}')
VECTOR_SIGNATURE = "677f73c5c3d54ef2c0b41f81db91c20e28183acdf9433b7d6972c305f0fa27e2"


def test_the_documented_test_vector_holds() -> None:
    envelope = json.loads(VECTOR_ENVELOPE)
    assert canonical_envelope(envelope).decode() == VECTOR_CANONICAL
    assert envelope_signature(envelope, VECTOR_KEY) == VECTOR_SIGNATURE
    # a signature member (any value) is left out of what is signed
    assert envelope_signature({**envelope, "signature": "x" * 64}, VECTOR_KEY) == VECTOR_SIGNATURE
    docs = DOCS.read_text()
    for text in (VECTOR_KEY.decode(), VECTOR_ENVELOPE, VECTOR_CANONICAL, VECTOR_SIGNATURE):
        assert text in docs, f"docs/security.md lacks {text[:40]!r}"


def test_openssl_one_liner_of_the_docs_gives_the_vector() -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    out = subprocess.run([openssl, "dgst", "-sha256", "-hmac", VECTOR_KEY.decode()], input=VECTOR_CANONICAL.encode(),
                         capture_output=True, check=True, timeout=30).stdout.decode()
    assert out.strip().endswith(VECTOR_SIGNATURE)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_canonical_form_is_byte_for_byte_the_same() -> None:
    """The 4-line canonicalizer of examples/node/publish.mjs against ours, on the values where
    JSON writers differ: floats in both notations, integral floats, escapes, astral characters
    and key order by UTF-16 code units."""
    doc = {"b": [1.5, 0.1, 1e-7, 1.5e-7, 1e21, 1e22, 0.000001, 9.999e20, 5e-324, -0.5, 100.25, 1e16, 2.0,
                 4.060815241312629e18, 1.7976931348623157e308],
           "a": "x\u0001\n\"\\\u2028é😀", "\ue000": 1, "😀": 2, "z": None, "y": [True, False, {"k": -0.0}]}
    script = (REPO_ROOT / "examples" / "node" / "publish.mjs").read_text()
    canon = script[script.index("const canonical"):script.index("\n\n", script.index("const canonical"))]
    node = shutil.which("node")
    assert node is not None
    out = subprocess.run([node, "-e", canon + "\nlet s='';process.stdin.on('data',d=>s+=d)"
                          ".on('end',()=>process.stdout.write(canonical(JSON.parse(s))));"],
                         input=json.dumps(doc).encode(), capture_output=True, check=True, timeout=30).stdout
    assert out == canonical_json(doc)


def test_canonical_form_refuses_what_json_cannot_carry() -> None:
    for bad in (float("nan"), float("inf"), {1: "x"}, "\ud800", object()):
        with pytest.raises(ValueError):
            canonical_json(bad)


def test_signed_message_round_trips_through_the_wire() -> None:
    message = sign_message(decode_message(VECTOR_ENVELOPE), "k1", VECTOR_KEY)
    wire = json.loads(encode_message(message))
    assert wire["headers"]["key_id"] == "k1" and len(wire["signature"]) == 64
    assert envelope_signature(wire, VECTOR_KEY) == wire["signature"]
    with pytest.raises(ValueError, match="invalid key id"):
        sign_message(message, "no spaces", VECTOR_KEY)


# --- keys --------------------------------------------------------------------------------------
def test_keyring_rejects_short_secrets_and_bad_key_ids(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least 16"):
        Keyring({"client": {"k1": "short"}})
    with pytest.raises(ConfigurationError, match="key id"):
        Keyring({"client": {"k 1": CLIENT_KEY}})
    (tmp_path / "client.k1").write_text("short\n")
    with pytest.raises(ConfigurationError, match="at least 16"):
        read_keys_dir(tmp_path)


def test_keys_from_a_secret_volume_directory(tmp_path: Path) -> None:
    """A Kubernetes Secret mounted as files: ``<sender>.<key_id>`` or ``<sender>/<key_id>``;
    the volume's hidden ``..data`` entries are skipped; the current key is the last listed
    unless ``current`` names one."""
    (tmp_path / "..data").mkdir()
    (tmp_path / "client.k1").write_text(CLIENT_KEY + "\n")
    (tmp_path / "client.k2").write_text(CLIENT_KEY_NEW)
    (tmp_path / "billing").mkdir()
    (tmp_path / "billing" / "b1").write_text(BILLING_KEY)
    ring = Keyring(keys_dir=str(tmp_path))
    assert ring.senders() == ["billing", "client"]
    assert ring.signing_key("client") == ("k2", CLIENT_KEY_NEW.encode())
    assert ring.key("billing", "b1") == BILLING_KEY.encode()
    pinned = Keyring(keys_dir=str(tmp_path), current={"client": "k1"})
    assert pinned.signing_key("client") == ("k1", CLIENT_KEY.encode())


def test_keys_and_modes_from_the_environment(monkeypatch: pytest.MonkeyPatch, redis_client) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_SIGNING__KEYS", json.dumps({"client": {"k1": CLIENT_KEY}}))
    monkeypatch.setenv("ROBOT_LAB_SIGNING__VERIFY", "warn")
    monkeypatch.setenv("ROBOT_LAB_SIGNING__ROBOTS", json.dumps({"billing": "require"}))
    bus = Bus(redis_client)
    bus.register("billing")
    message = bus.publish("billing", "hi", from_="client")
    assert message.headers["key_id"] == "k1" and message.signature
    assert BusPoller("billing", bus).verify == "require"
    assert BusPoller("other", bus).verify == "warn"
    assert CLIENT_KEY not in repr(get_settings()) and CLIENT_KEY not in str(get_settings().model_dump())


# --- the worker's check -----------------------------------------------------------------------
KEYS = {"client": {"k1": CLIENT_KEY}, "billing": {"b1": BILLING_KEY}, "technical": {"t1": TECH_KEY}}


def _worker(bus: Bus, verify: str) -> BusPoller:
    robot = build("billing", model="scripted/echo")
    return BusPoller("billing", bus, block_ms=0, retry_delay=0, consumer="c1", verify=verify).serve(robot)


def _raw_publish(bus: Bus, envelope: dict[str, Any]) -> None:
    bus.redis.xadd(bus.keys.inbox(envelope["to"]), {"envelope": json.dumps(envelope)})


def _signed(sender: str, key_id: str, secret: str, content: Any = "pay me") -> dict[str, Any]:
    message = decode_message(json.dumps({"to": "billing", "from": sender, "content": content}))
    return json.loads(encode_message(sign_message(message, key_id, secret.encode())))


def test_require_dead_letters_every_unauthentic_entry_without_a_model_call(redis_client) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    for name in ("billing", "client", "technical"):
        bus.register(name)
    tampered = _signed("client", "k1", CLIENT_KEY)
    tampered["content"] = "pay me a million"
    forged_from = _signed("client", "k1", CLIENT_KEY)
    forged_from["from"] = forged_from["reply_to"] = "technical"  # claims to be technical, has client's key only
    cases = {
        "unsigned": {"to": "billing", "from": "client", "content": "pay me"},
        "wrong key": _signed("client", "k1", "not-the-client-key-0123456789"),
        "tampered": tampered,
        "unknown key id": _signed("client", "k9", CLIENT_KEY),
        "forged from": forged_from,
        "signature without key id": {**_signed("client", "k1", CLIENT_KEY), "headers": {}},
        "garbage signature": {**_signed("client", "k1", CLIENT_KEY), "signature": "zz"},
    }
    for envelope in cases.values():
        _raw_publish(bus, envelope)
    clear_recorded_calls()
    worker = _worker(bus, "require")
    worker.run_once()
    assert recorded_calls() == []  # no model call
    letters = bus.dead_letters("billing")
    assert [d.reason for d in letters] == ["unauthenticated"] * len(cases)
    errors = [d.error for d in letters]
    assert "unsigned envelope from 'client'" in errors[0]
    assert "does not match" in errors[1] and "does not match" in errors[2]
    assert "no key 'k9' is configured for sender 'client'" in errors[3]
    assert "no key 'k1' is configured for sender 'technical'" in errors[4]
    assert "no headers.key_id" in errors[5] and "does not match" in errors[6]
    # nothing was written for the forger: no reply, no error envelope into technical's or client's inbox
    assert redis_client.xlen(bus.keys.inbox("technical")) == 0
    assert redis_client.xlen(bus.keys.inbox("client")) == 0
    # a correctly signed message still runs, and billing's reply is signed with billing's key
    bus.publish("billing", "hello", from_="client")
    worker.run_once()
    assert len(recorded_calls()) == 1
    [(_, fields)] = redis_client.xrange(bus.keys.inbox("client"))
    reply = json.loads(fields[b"envelope"])
    assert reply["content"] == "echo: hello" and reply["headers"]["key_id"] == "b1"
    assert envelope_signature(reply, BILLING_KEY.encode()) == reply["signature"]


@pytest.mark.parametrize("mode", ["warn", "off"])
def test_warn_logs_and_runs_and_off_checks_nothing(redis_client, mode: str) -> None:  # type: ignore[no-untyped-def]
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    bus.register("billing")
    _raw_publish(bus, {"to": "billing", "from": "client", "content": "unsigned"})
    clear_recorded_calls()
    with capture_logs() as logs:
        _worker(bus, mode).run_once()
    assert len(recorded_calls()) == 1 and bus.dead_letters("billing") == []
    events = [e for e in logs if e["event"] == "bus.unauthenticated"]
    if mode == "off":
        assert events == []
        return
    [event] = events
    assert event["mode"] == "warn" and event["sender"] == "client" and "unsigned" in event["error"]
    assert CLIENT_KEY not in json.dumps(logs, default=str)  # never log a secret


def test_rotation_old_and_new_keys_both_verify(redis_client) -> None:  # type: ignore[no-untyped-def]
    """Rotation: the verifier lists both keys; a publisher still on k1 and one already on k2
    are both accepted, and a publisher signs with its current key."""
    verifier = Keyring({**KEYS, "client": {"k1": CLIENT_KEY, "k2": CLIENT_KEY_NEW}})
    bus = Bus(redis_client, keyring=verifier)
    bus.register("billing")
    old = Bus(redis_client, keyring=Keyring({"client": {"k1": CLIENT_KEY}})).publish("billing", "old", from_="client")
    new = Bus(redis_client, keyring=Keyring({"client": {"k1": CLIENT_KEY, "k2": CLIENT_KEY_NEW}},
                                            current={"client": "k2"})).publish("billing", "new", from_="client")
    assert (old.headers["key_id"], new.headers["key_id"]) == ("k1", "k2")
    clear_recorded_calls()
    _worker(bus, "require").run_once()
    assert [c["request"] for c in recorded_calls()] == ["old", "new"]
    assert bus.dead_letters("billing") == []
    # k1 retired: the verifier drops it, and k1 signatures are refused from then on
    retired = Bus(redis_client, keyring=Keyring({**KEYS, "client": {"k2": CLIENT_KEY_NEW}}))
    Bus(redis_client, keyring=Keyring({"client": {"k1": CLIENT_KEY}})).publish("billing", "stale", from_="client")
    _worker(retired, "require").run_once()
    assert [d.reason for d in bus.dead_letters("billing")] == ["unauthenticated"]


def test_request_under_require_ignores_a_forged_reply(redis_client) -> None:  # type: ignore[no-untyped-def]
    """A requester under require takes only a reply signed by the robot it asked: a forged
    reply written first into its reply stream is skipped, the real one is returned."""
    bus = Bus(redis_client, keyring=Keyring(KEYS), verify="require")
    bus.register("billing")
    forger = Bus(redis_client, keyring=Keyring())
    worker = _worker(bus, "require")

    def serve() -> None:
        for _ in range(50):
            [(_, entries)] = redis_client.xread({bus.keys.inbox("billing"): "0-0"}, count=1, block=100) or [(0, [])]
            if entries:
                message = decode_message(entries[0][1][b"envelope"])
                forger.deliver_reply(forger.build_reply(message, "forged answer", from_="billing"))
                worker.run_once()
                return

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        reply = bus.request("billing", "real question", from_="client", timeout=10)
    finally:
        thread.join()
    assert reply.content == "echo: real question" and reply.headers["key_id"] == "b1"


def test_an_unauthenticated_request_fails_cleanly_on_the_requester(redis_client) -> None:  # type: ignore[no-untyped-def]
    """Refused entries get no error envelope (the sender may be forged), so a requester with
    no key simply times out; a refused entry never becomes a RemoteError either."""
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    bus.register("billing")
    anonymous = Bus(redis_client, keyring=Keyring())
    worker = _worker(bus, "require")
    thread = threading.Thread(target=lambda: [worker.run_once(block_ms=50) for _ in range(10)])
    thread.start()
    try:
        with pytest.raises(Exception) as info:
            anonymous.request("billing", "hi", from_="nobody", timeout=1)
    finally:
        thread.join()
    assert not isinstance(info.value, RemoteError) and "no reply" in str(info.value)
    assert [d.reason for d in bus.dead_letters("billing")] == ["unauthenticated"]


def test_robot_lab_send_signs(redis_client, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ROBOT_LAB_SIGNING__KEYS", json.dumps({"ops": {"o1": "ops-key-0001-0123456789abcdef"}}))
    bus = Bus()
    bus.register("billing")
    result = CliRunner().invoke(main, ["send", "billing", "hello", "--from", "ops"])
    assert result.exit_code == 0, result.output
    [(_, fields)] = bus.redis.xrange(bus.keys.inbox("billing"))
    envelope = json.loads(fields[b"envelope"])
    assert envelope["headers"]["key_id"] == "o1"
    assert envelope_signature(envelope, b"ops-key-0001-0123456789abcdef") == envelope["signature"]
    assert Keyring({"ops": {"o1": "ops-key-0001-0123456789abcdef"}}).problem(fields[b"envelope"],
                                                                              decode_message(fields[b"envelope"])) == ""
    result = CliRunner().invoke(main, ["send", "billing", "hello", "--from", "someone-else"])
    assert result.exit_code == 0
    assert b"signature" not in bus.redis.xrange(bus.keys.inbox("billing"))[-1][1][b"envelope"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_publisher_signs_and_a_require_worker_answers(real_redis_url: str, key_prefix: str,
                                                           real_client) -> None:  # type: ignore[no-untyped-def]
    client = real_client
    node_key = "node-desk-key-0001-0123456789"
    bus = Bus(client, keys=Keys(prefix=key_prefix), keyring=Keyring({"node-desk": {"n1": node_key}}))
    clear_recorded_calls()
    poller = BusPoller("billing", bus, verify="require").serve(build("billing", model="scripted/echo"))
    stop = threading.Event()
    thread = threading.Thread(target=poller.run_forever, args=(stop,), daemon=True)
    bus.register("billing")
    thread.start()
    script = str(REPO_ROOT / "examples" / "node" / "publish.mjs")
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix,
           "ROBOT_LAB_FROM": "node-desk"}
    try:
        out = subprocess.run([shutil.which("node") or "node", script, "billing", "signed from node"],
                             env={**env, "ROBOT_LAB_KEY_ID": "n1", "ROBOT_LAB_KEY": node_key},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert decode_message(out.stdout).content == "echo: signed from node"
        # the same publisher with a wrong key is refused: dead-lettered, no model call, no reply
        calls = len(recorded_calls())
        wrong = subprocess.run([shutil.which("node") or "node", script, "billing", "forged", "--dry-run"],
                               env={**env, "ROBOT_LAB_KEY_ID": "n1", "ROBOT_LAB_KEY": "wrong-key-0123456789abcdef"},
                               capture_output=True, text=True, timeout=60, check=True)
        client.xadd(bus.keys.inbox("billing"), {"envelope": wrong.stdout.strip()})
        wait_for(lambda: bus.dead_letters("billing"))
        assert [d.reason for d in bus.dead_letters("billing")] == ["unauthenticated"]
        assert len(recorded_calls()) == calls
    finally:
        stop.set()
        thread.join(10)


def test_shell_recipe_of_the_docs_is_accepted_under_require(real_redis_url: str, key_prefix: str,
                                                           real_client) -> None:  # type: ignore[no-untyped-def]
    bash, openssl, cli = shutil.which("bash"), shutil.which("openssl"), shutil.which("redis-cli")
    if not (bash and openssl and cli):
        pytest.skip("bash, openssl and redis-cli are needed")
    docs = DOCS.read_text()
    start = docs.index("```sh", docs.index("A shell, with")) + len("```sh")
    recipe = docs[start:docs.index("```", start)]
    client = real_client
    key = "frontdesk-key-01-0123456789abcdef"
    bus = Bus(client, keys=Keys(prefix=key_prefix), keyring=Keyring({"frontdesk": {"k1": key}}))
    bus.register("billing")
    bus.register("frontdesk")
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "KEY": key, "REDIS_URL": real_redis_url, "PREFIX": key_prefix}
    subprocess.run([bash, "-c", recipe], env=env, check=True, capture_output=True, timeout=30)
    clear_recorded_calls()
    _worker(bus, "require").run_once()
    assert bus.dead_letters("billing") == []
    [(_, fields)] = client.xrange(bus.keys.inbox("frontdesk"))
    assert decode_message(fields[b"envelope"]).content == "echo: My invoice is wrong"
    # the same recipe with another key is refused
    subprocess.run([bash, "-c", recipe], env={**env, "KEY": "not-frontdesk-key-0123456789"}, check=True,
                   capture_output=True, timeout=30)
    _worker(bus, "require").run_once()
    assert [d.reason for d in bus.dead_letters("billing")] == ["unauthenticated"]
    assert len(recorded_calls()) == 1


def test_a_forged_reply_to_send_message_never_reaches_the_outbox(redis_client) -> None:  # type: ignore[no-untyped-def]
    """The reviewer's case: a forged reply placed in frontdesk's inbox was returned by
    wait_for_reply. Under require it is dead-lettered; the signed reply is correlated."""
    bus = Bus(redis_client, keyring=Keyring({"frontdesk": {"f1": "frontdesk-key-01-0123456789abcdef"}, **KEYS}))
    for name in ("billing", "frontdesk"):
        bus.register(name)
    sent = bus.send_message("billing", "question", from_="frontdesk")
    forged = {"to": "frontdesk", "from": "billing", "kind": "reply", "in_reply_to": sent.id, "content": "forged"}
    _raw_publish(bus, forged)
    frontdesk = BusPoller("frontdesk", bus, block_ms=0, consumer="f", verify="require")
    frontdesk.run_once()
    entry = bus.outbox("frontdesk", sent.id)
    assert entry is not None and entry.status == "sent" and entry.replies == []
    assert [d.reason for d in bus.dead_letters("frontdesk")] == ["unauthenticated"]
    _worker(bus, "require").run_once()  # billing answers, signed
    frontdesk.run_once()
    assert bus.wait_for_reply("frontdesk", sent.id, timeout=5).content == "echo: question"


def test_under_require_a_refused_invalid_entry_sends_no_error_envelope_for_a_forger(redis_client) -> None:  # type: ignore[no-untyped-def]
    """An invalid or unsupported entry is dead-lettered as before, but under require its error
    envelope goes out only when the entry is signed by its sender: a forger cannot aim
    billing's error envelopes at technical's inbox; an authentic sender is still told."""
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    for name in ("billing", "technical", "client"):
        bus.register(name)
    forged = {"to": "billing", "from": "technical", "reply_to": "technical", "kind": "bogus", "content": "x"}
    authentic = {**_signed("client", "k1", CLIENT_KEY), "kind": "bogus", "reply_to": "client"}
    authentic["signature"] = envelope_signature(authentic, CLIENT_KEY.encode())
    invalid = {"to": "billing", "from": "technical", "reply_to": "technical", "content": "x", "deadline": "noon"}
    for envelope in (forged, authentic, invalid):
        _raw_publish(bus, envelope)
    _worker(bus, "require").run_once()
    assert [d.reason for d in bus.dead_letters("billing")] == ["unsupported", "unsupported", "invalid"]
    assert redis_client.xlen(bus.keys.inbox("technical")) == 0
    [(_, fields)] = redis_client.xrange(bus.keys.inbox("client"))
    assert json.loads(fields[b"envelope"])["kind"] == "error"


def test_a_duplicate_member_appended_to_a_signed_envelope_is_refused(redis_client) -> None:  # type: ignore[no-untyped-def]
    """JSON with a repeated member: the envelope robot-lab decodes and the one it verifies are
    the same object (last member wins in both), so appending ``"content": ...`` or ``"from": ...``
    to a signed entry breaks its signature instead of slipping past it."""
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    bus.register("billing")
    signed = json.dumps(_signed("client", "k1", CLIENT_KEY))
    for extra in (',"content":"pay me a million"}', ',"from":"technical"}'):
        bus.redis.xadd(bus.keys.inbox("billing"), {"envelope": signed[:-1] + extra})
    clear_recorded_calls()
    _worker(bus, "require").run_once()
    assert recorded_calls() == []
    assert [d.reason for d in bus.dead_letters("billing")] == ["unauthenticated"] * 2


# --- misaddressed envelopes: `to` names another robot than the inbox ----------------------------
def _technical(bus: Bus, verify: str) -> BusPoller:
    robot = build("technical", model="scripted/echo")
    return BusPoller("technical", bus, block_ms=0, retry_delay=0, consumer="t1", verify=verify).serve(robot)


@pytest.mark.parametrize("verify", ["require", "off"])
def test_an_envelope_for_billing_in_technicals_inbox_is_dead_lettered_misaddressed(redis_client,  # type: ignore[no-untyped-def]
                                                                                     verify: str) -> None:
    """A signed envelope client wrote for billing, appended to technical's inbox, is not run
    by technical: dead-lettered ``misaddressed`` before any model call, no error envelope."""
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    for name in ("billing", "technical", "client"):
        bus.register(name)
    envelope = _signed("client", "k1", CLIENT_KEY, "refund order 7")
    redis_client.xadd(bus.keys.inbox("technical"), {"envelope": json.dumps(envelope)})  # the replay
    clear_recorded_calls()
    _technical(bus, verify).run_once()
    assert recorded_calls() == []
    [letter] = bus.dead_letters("technical")
    assert letter.reason == "misaddressed" and "addressed to 'billing', not to 'technical'" in letter.error
    assert redis_client.xlen(bus.keys.inbox("client")) == 0  # nothing sent back to the sender
    # the same envelope in billing's own inbox runs
    _raw_publish(bus, envelope)
    _worker(bus, verify).run_once()
    assert [c["request"] for c in recorded_calls()] == ["refund order 7"]


def test_misaddressed_warn_keeps_robot_labs_behaviour_except_under_require(redis_client,  # type: ignore[no-untyped-def]
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.settings import reload_settings

    monkeypatch.setenv("ROBOT_LAB_BUS__MISADDRESSED", "warn")
    reload_settings()
    bus = Bus(redis_client, keyring=Keyring(KEYS))
    for name in ("billing", "technical"):
        bus.register(name)
    clear_recorded_calls()
    with capture_logs() as logs:
        for verify, content in (("off", "handled anyway"), ("require", "never handled")):
            envelope = _signed("client", "k1", CLIENT_KEY, content)
            redis_client.xadd(bus.keys.inbox("technical"), {"envelope": json.dumps(envelope)})
            _technical(bus, verify).run_once()
    assert [c["request"] for c in recorded_calls()] == ["handled anyway"]  # off + warn: run
    assert [d.reason for d in bus.dead_letters("technical")] == ["misaddressed"]  # require: never
    assert [e["to"] for e in logs if e["event"] == "bus.misaddressed"] == ["billing", "billing"]
