"""Redis ACL users (``robot-lab acl``) on a private real redis-server.

A publisher appends to inboxes but cannot read another robot's inbox, write memory, touch
specs, runs or rq, list keys, or read another publisher's reply streams. A worker cannot
read, trim or delete another robot's inbox, DLQ, conversations or spec -- only append to its
inbox (replies, delegation) and use the shared structures docs/security.md lists. A real
``robot-lab worker`` logged in as its robot's user serves a publisher's request end to end."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from click.testing import CliRunner

from robot_lab.bus import Bus
from robot_lab.cli import main
from robot_lab.keys import Keys
from robot_lab.schemas import RobotMessage, decode_message
from robot_lab.settings import reload_settings
from robot_lab import folded_writes
from robot_lab.workers.acl_users import acl_users, apply_users
from tests.fixtures.secure import APP
from tests.redis_server import REPO_ROOT, RedisServer, wait_for
from tests.worker_procs import VENV_BIN, child_env, processes  # noqa: F401

SCRIPTS = REPO_ROOT / "tests" / "fixtures" / "scripts"

PREFIX = "acltest"
KEYS = Keys(PREFIX)
DENIED = redis.exceptions.NoPermissionError


class AclServer:
    def __init__(self, url: str, passwords: dict[str, str]) -> None:
        self.url, self.passwords = url, passwords
        self.admin = redis.Redis.from_url(url)

    def user_url(self, user: str) -> str:
        host = self.url.split("://", 1)[1]
        return f"redis://{quote(user)}:{quote(self.passwords[user])}@{host}"

    def client(self, user: str) -> redis.Redis:
        return redis.Redis.from_url(self.user_url(user))


@pytest.fixture(scope="module")
def server() -> Iterator[AclServer]:
    private = RedisServer()
    url = private.start(private=True)
    if url is None:
        pytest.skip(f"no private redis-server: {private.reason}")
    try:
        admin = redis.Redis.from_url(url)
        if int(admin.info("server")["redis_version"].split(".")[0]) < 7:
            pytest.skip("Redis ACL selectors need Redis >= 7")
        users = acl_users(KEYS, ["billing", "technical"], ["frontdesk", "other-desk"])
        passwords = {u.user: secrets.token_urlsafe(24) for u in users}
        apply_users(admin, users, passwords)
        bus = Bus(admin, keys=KEYS)
        for robot in ("billing", "technical"):
            bus.register(robot)
        admin.xadd(KEYS.inbox("technical"), {"envelope": b'{"to":"technical","content":"private"}'})
        admin.xadd(KEYS.dlq("technical"), {"envelope": b"{}", "reason": "failed"})
        admin.set(KEYS.conversation("technical", "c1"), b"[]")
        admin.set(KEYS.robot_spec("technical"), b'{"name":"technical"}')
        admin.xadd(KEYS.inbox("_reply.other-desk.1"), {"envelope": b"{}"})
        admin.close()
        yield AclServer(url, passwords)
    finally:
        private.stop()


def _denied(call: Any, *args: Any) -> bool:
    try:
        call(*args)
    except DENIED:
        return True
    except redis.ResponseError as exc:  # a script's refused command comes back as a script error
        return "NOPERM" in str(exc) or "can't access" in str(exc)
    return False


def test_a_publisher_appends_but_cannot_read_inboxes_or_write_memory(server: AclServer) -> None:
    pub = server.client("rl-pub-frontdesk")
    bus = Bus(pub, keys=KEYS)
    message = bus.publish("billing", "hello", from_="frontdesk")  # XADD to any inbox: allowed
    assert server.admin.xrange(KEYS.inbox("billing"))[-1][1][b"envelope"].count(message.id.encode()) == 1
    assert bus.robots() == ["billing", "technical"]  # the registry is readable
    inbox = KEYS.inbox("billing")
    for call, args in [
        (pub.xrange, (inbox,)), (pub.xread, ({inbox: "0-0"},)), (pub.xlen, (inbox,)),
        (pub.xreadgroup, ("billing", "thief", {inbox: ">"})), (pub.xrange, (KEYS.dlq("technical"),)),
        (pub.delete, (inbox,)), (pub.xtrim, (inbox, 0)), (pub.xgroup_destroy, (inbox, "billing")),
        (pub.hset, (KEYS.memory("run:r1"), "k", "v")), (pub.hget, (KEYS.memory("run:r1"), "k")),
        (pub.get, (KEYS.conversation("technical", "c1"),)), (pub.set, (KEYS.robot_spec("billing"), "{}")),
        (pub.srem, (KEYS.registry(), "billing")), (pub.lpush, ("rq:queue:robot:billing", "job")),
        (pub.xrange, (KEYS.inbox("_reply.other-desk.1"),)), (pub.scan, ()), (pub.keys, ("*",)),
        (pub.flushall, ()), (pub.config_get, ("*",)), (pub.acl_list, ()),
        (pub.eval, ("return redis.call('XRANGE', KEYS[1], '-', '+')", 1, inbox)),
    ]:
        assert _denied(call, *args), f"publisher was allowed {call.__name__}{args}"
    # its own inbox, outbox and reply streams are its own
    pub.xgroup_create(KEYS.inbox("_reply.frontdesk.1"), "_", id="$", mkstream=True)
    assert pub.xrange(KEYS.inbox("_reply.frontdesk.1")) == []
    sent = bus.send_message("billing", "with outbox", from_="frontdesk")
    assert bus.outbox("frontdesk", sent.id) is not None


def test_a_worker_cannot_touch_another_robots_keys(server: AclServer) -> None:
    worker = server.client("rl-worker-billing")
    tech = KEYS.inbox("technical")
    spy = worker.register_script("return redis.call('XRANGE', KEYS[1], '-', '+')")
    for call, args in [
        (worker.xrange, (tech,)), (worker.xread, ({tech: "0-0"},)), (worker.xlen, (tech,)),
        (worker.xreadgroup, ("technical", "thief", {tech: ">"})), (worker.xautoclaim, (tech, "technical", "t", 0)),
        (worker.xack, (tech, "technical", "0-1")), (worker.delete, (tech,)), (worker.xtrim, (tech, 0)),
        (worker.xrange, (KEYS.dlq("technical"),)), (worker.delete, (KEYS.dlq("technical"),)),
        (worker.get, (KEYS.conversation("technical", "c1"),)), (worker.set, (KEYS.robot_spec("technical"), "{}")),
        (worker.get, (KEYS.robot_spec("technical"),)), (worker.xrange, (KEYS.inbox("_reply.other-desk.1"),)),
        (worker.scan, ()), (worker.keys, ("*",)), (worker.flushall, ()), (worker.acl_list, ()),
        (spy, ([tech],)),
    ]:
        assert _denied(call, *args), f"billing's worker was allowed {getattr(call, '__name__', call)}{args}"
    # the exceptions the design needs (docs/security.md): append a reply to any inbox ...
    bus = Bus(worker, keys=KEYS)
    bus.publish("technical", "delegated", from_="billing")  # delegation
    for sender in ("technical", "new-desk"):  # a reply; to a missing inbox it is created with a TTL
        bus.deliver_reply(bus.build_reply(RobotMessage(to="billing", from_=sender, content="q"), "answer"))
    assert server.admin.xlen(tech) == 3
    assert server.admin.ttl(KEYS.inbox("new-desk")) > 0
    # ... and shared run memory, while its own keys are all its own
    worker.hset(KEYS.memory("run:r1"), "k", "v")
    worker.xrange(KEYS.inbox("billing"))
    worker.set(KEYS.conversation("billing", "c1"), "[]")
    # a task of a run pinned to another build is handed back, and its sweeper re-enqueues those
    worker.zadd(KEYS.builds_handed(), {"b-1\tr1\tt\tj": 1.0})
    assert worker.zrangebyscore(KEYS.builds_handed(), "-inf", "+inf") and worker.zrem(KEYS.builds_handed(), "b-1\tr1\tt\tj")


@pytest.mark.slow
def test_a_worker_logged_in_as_its_user_serves_a_message_end_to_end(server: AclServer, tmp_path: Path,
                                                                    processes) -> None:  # noqa: F811
    env = child_env(server.user_url("rl-worker-billing"), PREFIX)
    env.pop("ROBOT_LAB_TEST_REDIS_URL", None)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP], env, "worker")
    admin = server.admin
    bus = Bus(server.client("rl-pub-frontdesk"), keys=KEYS)
    try:
        wait_for(lambda: worker.poll() is not None or admin.zcard(KEYS.workers()) > 0, timeout=90)
        assert worker.poll() is None, "the worker exited"
        reply = bus.request("billing", "hello through ACLs", from_="frontdesk", timeout=60)
    except Exception:
        print(processes.logs())
        raise
    assert reply.content == "echo: hello through ACLs" and reply.from_ == "billing"
    # a network task through rq: the coordinator (its own user) enqueues, billing's worker runs it
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from tests.fixtures.secure import make_app

    net = create_network("acl-net")
    billing = make_app().build_robot("billing")
    net.task("answer", billing)
    # the second task's rq records travel folded into one script call (the first task loaded
    # it: robot_lab/folded_writes.py), whose commands the user's key rules check as well
    net.task("again", billing, depends_on="answer")
    coordinator = Coordinator(connection=server.client("rl-coordinator"), keys=KEYS)
    result = coordinator.submit(net, "a task through ACLs").wait(timeout=60)
    assert result.status == "completed" and result["answer"].reply == "echo: a task through ACLs"
    assert result["again"].reply.startswith("echo: ")
    assert admin.script_exists(folded_writes.APPLY_SHA) == [True]
    from rq import Queue

    from robot_lab.network.serializer import JobSerializer

    queue = Queue("robot:billing", connection=admin, serializer=JobSerializer)
    assert len(queue.finished_job_registry) == 2 and len(queue.started_job_registry) == 0
    assert worker.poll() is None
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    assert "NOPERM" not in log and "no permissions" not in log, log[-3000:]


def test_cli_prints_and_applies_users_without_showing_passwords(server: AclServer, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", "clitest")
    out = CliRunner().invoke(main, ["acl", "--robot", "cli-robot", "--publisher", "cli-desk", "--no-coordinator"])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if not line.startswith("#")]
    assert len(lines) == 2 and "'~clitest:robot:cli-robot:*'" in lines[0]
    assert '">$ROBOT_LAB_ACL_PASSWORD_RL_WORKER_CLI_ROBOT"' in lines[0]
    as_json = json.loads(CliRunner().invoke(main, ["acl", "--robot", "cli-robot", "--json"]).output)
    assert [u["user"] for u in as_json["users"]] == ["rl-worker-cli-robot", "rl-coordinator"]
    assert as_json["users"][0]["password_env"] == "ROBOT_LAB_ACL_PASSWORD_RL_WORKER_CLI_ROBOT"
    # --apply: one password from the environment, one generated into the folder (0600)
    monkeypatch.setenv("REDIS_URL", server.url)
    monkeypatch.setenv("ROBOT_LAB_ACL_PASSWORD_RL_PUB_CLI_DESK", "desk-password-from-env")
    reload_settings()
    folder = tmp_path / "passwords"
    out = CliRunner().invoke(main, ["acl", "--apply", "--robot", "cli-robot", "--publisher", "cli-desk",
                                    "--no-coordinator", "--passwords-dir", str(folder)])
    assert out.exit_code == 0, out.output
    generated = (folder / "rl-worker-cli-robot").read_text().strip()
    assert stat.S_IMODE(os.stat(folder / "rl-worker-cli-robot").st_mode) == 0o600
    assert generated not in out.output and "desk-password-from-env" not in out.output
    assert not (folder / "rl-pub-cli-desk").exists()
    assert redis.Redis.from_url(server.url, username="rl-worker-cli-robot", password=generated).ping()
    assert redis.Redis.from_url(server.url, username="rl-pub-cli-desk", password="desk-password-from-env").ping()
    # no password anywhere: a clear error, no traceback
    monkeypatch.delenv("ROBOT_LAB_ACL_PASSWORD_RL_PUB_CLI_DESK")
    out = CliRunner().invoke(main, ["acl", "--apply", "--publisher", "cli-desk", "--no-coordinator"])
    assert out.exit_code == 1 and "ROBOT_LAB_ACL_PASSWORD_RL_PUB_CLI_DESK" in out.output
    assert "Traceback" not in out.output
    out = CliRunner().invoke(main, ["acl"])
    assert out.exit_code == 2 and "--robot" in out.output


def test_rq_rules_follow_rq_key_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``RQ_KEY_PREFIX={rq}`` (Redis Cluster) the rq rules name ``{rq}:*``, not ``rq:*``."""
    from robot_lab import rq_connection

    plain = {rule for user in acl_users(Keys(prefix="p"), ["billing"]) for rule in user.rules}
    assert {"~rq:*", "&rq:*"} <= plain
    monkeypatch.setattr(rq_connection, "rq_prefix", lambda: "{rq}")
    tagged = {rule for user in acl_users(Keys(prefix="p"), ["billing"]) for rule in user.rules}
    assert {"~{rq}:*", "&{rq}:*"} <= tagged and "~rq:*" not in tagged


def test_appenders_reach_inboxes_only_not_a_robots_bus_state(server: AclServer) -> None:
    """Stream squatting: ``XADD`` is granted on ``P:bus:*``, which holds only inboxes and
    reply streams; billing's conversation heads and queue, DLQ, reply records, outbox and
    parked messages (and the request a conversation waits on) live under ``P:robot:billing:``, so neither a publisher nor technical's worker can
    create a stream there (a wrong-typed key would stop billing's poller; a fake dead
    letter or reply record would be read as billing's own)."""
    targets = [KEYS.conversation_heads("billing"), KEYS.conversation_queue("billing"), KEYS.dlq("billing"),
               KEYS.replied_for("billing", "frontdesk:m-1"), KEYS.outbox_entry("billing", "m-1"),
               KEYS.parked_message("billing", "r-1"), KEYS.parked_conversation("billing", "c1")]
    for user in ("rl-pub-frontdesk", "rl-worker-technical"):
        client = server.client(user)
        for key in targets:
            assert _denied(client.xadd, key, {"x": "y"}), f"{user} may XADD {key}"
        client.xadd(KEYS.inbox("billing"), {"envelope": b'{"to":"billing","content":"hi"}'})  # inboxes: yes
    assert all(server.admin.exists(key) == 0 for key in targets)
    for key in targets:
        assert not key.startswith(f"{PREFIX}:bus:")


def _cli(url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = child_env(url, PREFIX, **extra)
    env.pop("ROBOT_LAB_TEST_REDIS_URL", None)
    return subprocess.run([str(VENV_BIN / "robot-lab"), *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_a_conversation_message_and_a_served_question_under_acl_users(server: AclServer, tmp_path: Path,
                                                                      processes) -> None:  # noqa: F811
    """Users from ``robot-lab acl --apply``; a real worker of ``asker`` logged in as its user.
    A message with a conversation id (``robot-lab send --conversation c1 --wait``) is served:
    its robot asks which order (the message parks under the robot's own keys), ``robot-lab
    answer`` as the coordinator wakes it, and the final reply reaches the sender; then the
    same for a message with no conversation. The publisher cannot squat the conversation's
    wait key with a stream beforehand."""
    folder = tmp_path / "passwords"
    applied = _cli(server.url, "acl", "--apply", "--robot", "asker", "--publisher", "askdesk", "--no-coordinator",
                   "--passwords-dir", str(folder))
    assert applied.returncode == 0, applied.stderr + applied.stdout
    server.passwords.update({user: (folder / user).read_text().strip() for user in ("rl-worker-asker", "rl-pub-askdesk")})
    admin = server.admin
    desk = server.client("rl-pub-askdesk")
    assert _denied(desk.xadd, KEYS.parked_conversation("asker", "c1"), {"x": "y"})  # no squatting the wait
    assert _denied(desk.xadd, KEYS.parked_message("asker", "r-1"), {"x": "y"})
    env = child_env(server.user_url("rl-worker-asker"), PREFIX, ROBOT_LAB_SCRIPTS_DIR=str(SCRIPTS))
    env.pop("ROBOT_LAB_TEST_REDIS_URL", None)
    worker = processes.start([str(VENV_BIN / "robot-lab"), "worker", "asker", "--app", APP], env, "asker")
    desk_url, coordinator_url = server.user_url("rl-pub-askdesk"), server.user_url("rl-coordinator")

    def served(text: str, answer: str, *conversation: str) -> Any:
        """Send ``text`` and wait for the question; answer it with the CLI; the final reply."""
        sent = _cli(desk_url, "send", "asker", text, *conversation, "--from", "askdesk", "--wait", "--timeout", "60",
                    "--json")
        assert sent.returncode == 0, sent.stderr + sent.stdout
        question = json.loads(sent.stdout)["reply"]
        assert question["question"] == "Which order?" and question["choices"] == ["A1", "B2"]
        request_id = question["request_id"]
        assert admin.exists(KEYS.parked_message("asker", request_id))
        if conversation:
            assert admin.get(KEYS.parked_conversation("asker", conversation[-1])) == request_id.encode()
        answered = _cli(coordinator_url, "answer", request_id, answer, "--by", "desk-person")
        assert answered.returncode == 0, answered.stderr + answered.stdout

        def final() -> Any:  # the reply goes to the private reply stream the sender waited on
            for stream in admin.keys(f"{PREFIX}:bus:_reply.askdesk.*"):
                for _, fields in admin.xrange(stream):
                    message = decode_message(fields[b"envelope"])
                    if message.kind == "reply" and message.content == f"refunding - ask_user: {answer}":
                        return message
            return None

        return wait_for(final, timeout=90)

    try:
        wait_for(lambda: worker.poll() is not None or admin.sismember(KEYS.registry(), "asker"), timeout=90)
        assert worker.poll() is None, "the worker exited"
        served("refund please", "B2", "--conversation", "c1")  # a conversation, and its question
        served("another refund", "A1")  # a served question with no conversation
    except Exception:
        print(processes.logs())
        raise
    wait_for(lambda: not admin.exists(KEYS.parked_conversation("asker", "c1")), timeout=60)
    assert admin.xlen(KEYS.dlq("asker")) == 0
    log = Path(worker.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    assert "NOPERM" not in log and "no permissions" not in log, log[-3000:]


def test_another_robots_worker_times_out_a_served_question_without_reading_its_parked_keys(
        server: AclServer) -> None:
    """billing's worker parks a served message on a question with a deadline; technical's
    worker's sweep (any worker's) times it out: it may not read billing's parked keys, and
    needs not -- the request's record says where the message waits -- so the answer envelope
    lands in billing's inbox, in its conversation, from the message's sender."""
    from robot_lab.bus.parking import Parking
    from robot_lab.errors import InputRequired
    from robot_lab.inputs import InputStore
    from robot_lab.network import human_input

    billing = server.client("rl-worker-billing")
    rid = f"req-{secrets.token_hex(4)}"
    request = {"id": rid, "question": "Which order?", "choices": ["A1", "B2"], "default": "A1", "kind": "question",
               "robot": "billing", "created_at": 1.0, "deadline": 2.0}
    InputStore(billing, KEYS).create(request, {"kind": "message", "robot": "billing",
                                               "durable_id": "bus:billing:frontdesk:m-7"}, ttl=600)
    message = RobotMessage(to="billing", from_="frontdesk", content="refund", conversation_id="c-sweep", id="m-7")
    exc = InputRequired("Which order?")
    exc.request = request
    Parking(Bus(billing, keys=KEYS), "billing").park(message, message, exc)
    assert server.admin.get(KEYS.parked_conversation("billing", "c-sweep")) == rid.encode()

    assert human_input.sweep(server.client("rl-worker-technical"), KEYS, now=10.0) == 1
    entries = {entry: decode_message(f[b"envelope"]) for entry, f in server.admin.xrange(KEYS.inbox("billing"))}
    [(entry, wake)] = [(entry, m) for entry, m in entries.items() if m.in_reply_to == rid]
    server.admin.xdel(KEYS.inbox("billing"), entry)  # no other test's worker of billing runs it
    server.admin.delete(KEYS.parked_message("billing", rid), KEYS.parked_conversation("billing", "c-sweep"))
    assert wake.kind == "answer" and wake.content["text"] == "A1" and wake.from_ == "frontdesk"
    assert wake.conversation_id == "c-sweep"
