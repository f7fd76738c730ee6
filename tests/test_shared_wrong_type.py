"""A shared index of the wrong type -- any worker's Redis user may write the registry, the
worker, run and input indexes (``robot-lab acl``) -- does not fail ``robot-lab status`` or
``robot-lab pending`` whole with a WRONGTYPE that names no key: the key is named in a problem
line, read as empty, and everything else is shown (real Redis, the CLI in-process)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from robot_lab.bus import Bus
from robot_lab.cli import main
from robot_lab.inputs import InputStore
from robot_lab.keys import Keys

INDEXES = {"registry": "set", "workers": "zset", "runs_index": "zset", "runs_active": "set",
           "inputs_pending": "zset", "inputs_deadlines": "zset", "builds_handed": "zset"}


@pytest.mark.parametrize("index", sorted(INDEXES))
def test_status_names_a_shared_index_of_the_wrong_type_and_shows_the_rest(real_client, key_prefix, index) -> None:
    keys = Keys(key_prefix)
    Bus(real_client, keys=keys).register("billing")
    real_client.xadd(keys.dlq("billing"), {"envelope": b"{}", "reason": "failed"})
    key = getattr(keys, index)()
    real_client.set(key, "by hand")
    out = CliRunner().invoke(main, ["status"])
    assert out.exit_code == 0, out.output
    assert f"! {key} is a string, not a {INDEXES[index]}" in out.output, out.output
    if index != "registry":  # the rest: billing's row and its own problem line
        assert "billing: 1 dead letter(s)" in out.output, out.output
    checked = CliRunner().invoke(main, ["status", "--check", "--json"])
    assert checked.exit_code == 3
    assert any(p.startswith(f"{key} is a string") for p in json.loads(checked.output)["problems"])


def test_pending_names_its_index_of_the_wrong_type_and_still_lists_and_answers_what_waits(real_client,
                                                                                       key_prefix) -> None:
    keys = Keys(key_prefix)
    store = InputStore(real_client, keys)
    for rid, created in (("req-2", 2.0), ("req-1", 1.0)):
        store.create({"id": rid, "question": f"question {rid}?", "created_at": created, "deadline": 9e9,
                      "robot": "billing"}, {"kind": "local", "durable_id": f"d-{rid}"}, ttl=600)
    real_client.set(keys.inputs_pending(), "by hand")
    real_client.set(keys.inputs_deadlines(), "by hand")
    out = CliRunner().invoke(main, ["pending", "--json"])
    assert out.exit_code == 0, out.output
    assert [row["id"] for row in json.loads(out.stdout)] == ["req-1", "req-2"]  # oldest first
    assert f"! {keys.inputs_pending()} is a string, not a zset" in out.stderr
    assert f"! {keys.inputs_deadlines()} is a string, not a zset" in out.stderr
    answered = CliRunner().invoke(main, ["answer", "req-1", "yes"])
    assert answered.exit_code == 0, answered.output
    out = CliRunner().invoke(main, ["pending"])
    assert out.exit_code == 0 and "req-2" in out.stdout and "req-1" not in out.stdout
