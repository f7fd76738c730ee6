"""The Node.js publisher of docs/bus.md (examples/node/publish.mjs), end to end: the real
`node` binary publishes an envelope to a robot served by a real BusPoller on a real Redis and
reads the reply from its own reply stream. The envelope it writes validates against the
shipped JSON Schema, as do the examples in the schema and in docs/bus.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading

import jsonschema
import pytest
import redis

from robot_lab.bus import Bus, BusPoller
from robot_lab.keys import Keys
from robot_lab.runtime.robot import build
from robot_lab.schemas import decode_message
from robot_lab.schemas.codec import shipped_schema_text
from tests.redis_server import REPO_ROOT

SCRIPT = REPO_ROOT / "examples" / "node" / "publish.mjs"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


def _schema() -> dict:
    return json.loads(shipped_schema_text("robot-message"))


def _validator() -> jsonschema.Draft202012Validator:
    schema = _schema()
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@needs_node
def test_node_envelope_validates_and_decodes() -> None:
    out = subprocess.run([NODE, str(SCRIPT), "billing", "where is my refund?", "--dry-run"],
                         capture_output=True, text=True, timeout=60, check=True)
    envelope = json.loads(out.stdout)
    _validator().validate(envelope)
    message = decode_message(out.stdout)
    assert message.to == "billing" and message.reply_to == message.from_ and message.deadline is not None


def test_schema_examples_and_docs_examples_validate() -> None:
    validator = _validator()
    definition = _schema()["$defs"]["RobotMessage"]
    for example in definition["examples"]:
        validator.validate(example)
        decode_message(json.dumps(example))
    for name, prop in definition["properties"].items():
        assert prop.get("description"), f"{name} has no description"
    docs = (REPO_ROOT / "docs" / "bus.md").read_text()
    envelopes = [json.loads(m) for m in re.findall(r"'(\{\"v\":1.*?\})'", docs)]
    assert envelopes, "docs/bus.md shows no envelope"
    for envelope in envelopes:
        validator.validate(envelope)
        decode_message(json.dumps(envelope))


@pytest.mark.parametrize("field, value", [("deadline", "tomorrow"), ("created_at", "2026-05-01 noon"),
                                          ("deadline", "2026-05-01T12:00:00")])
def test_schema_rejects_dates_that_are_not_rfc3339(field: str, value: str) -> None:
    example = dict(_schema()["$defs"]["RobotMessage"]["examples"][0], **{field: value})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(example, _schema())  # the pattern holds even without a format checker


@needs_node
def test_node_publisher_gets_a_reply(real_redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", key_prefix)
    client = redis.Redis.from_url(real_redis_url)
    keys = Keys(prefix=key_prefix)
    bus = Bus(redis=client, keys=keys)
    poller = BusPoller("billing", bus, redis=client).serve(build("billing", model="scripted/echo"))
    stop = threading.Event()
    thread = threading.Thread(target=poller.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        env = {"PATH": "/usr/bin:/bin", "REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix}
        out = subprocess.run([NODE, str(SCRIPT), "billing", "hello from node"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        reply = decode_message(out.stdout)
        assert reply.kind == "reply" and reply.content == "echo: hello from node"
        assert reply.conversation_id == "ticket-42" and reply.to.startswith("node-")
    finally:
        stop.set()
        thread.join(10)
        for key in client.scan_iter(match=f"{key_prefix}*"):
            client.delete(key)
        client.close()
