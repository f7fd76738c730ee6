"""The hardened test profile does what it says (tests/hardened.py): processes started the way
every process-level test starts them log in as their own Redis ACL user, see the signing keys
at /etc/robot-lab/keys in a mount namespace of their own (the host's /etc untouched), run
under signing.verify=require with the sandbox on, and a worker for several robots becomes one
process per robot. Runs under ``--profile=hardened`` only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from robot_lab.bus import Bus
from robot_lab.keys import Keys
from tests.a2a_procs import wait_for_bus_worker
from tests.fixtures.secure import APP
from tests.hardened import KEYS_MOUNT, State
from tests.redis_server import REPO_ROOT, wait_for
from tests.worker_procs import VENV_BIN, child_env, processes  # noqa: F401

pytestmark = pytest.mark.slow


def _users(client: redis.Redis) -> dict[str, list[int]]:
    """Connected clients by user name: their ids."""
    found: dict[str, list[int]] = {}
    for entry in client.client_list():
        found.setdefault(entry.get("user", ""), []).append(int(entry["id"]))
    return found


def test_a_child_process_gets_its_user_the_keys_mount_and_the_profile_settings(
        hardened_state: State, real_redis_url: str, key_prefix: str) -> None:
    host_etc_before = os.path.exists("/etc/robot-lab")
    code = ("import json, os; print(json.dumps({'url': os.environ['REDIS_URL'], "
            f"'keys': sorted(os.listdir({KEYS_MOUNT!r})), "
            f"'coordinator': open({KEYS_MOUNT!r} + '/coordinator/k1').read(), "
            "'settings': {k: v for k, v in os.environ.items() if k.startswith(('ROBOT_LAB_SIGNING', 'ROBOT_LAB_SANDBOX'))}}))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(real_redis_url, key_prefix), cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["url"].startswith("redis://rl-coordinator:") and real_redis_url not in seen["url"]
    assert {"coordinator", "a2a", "cli"} <= set(seen["keys"])
    assert seen["coordinator"] == (Path(hardened_state.keys_dir) / "coordinator" / "k1").read_text()
    assert seen["settings"]["ROBOT_LAB_SIGNING__VERIFY"] == "require"
    assert seen["settings"]["ROBOT_LAB_SIGNING__KEYS_DIR"] == KEYS_MOUNT
    assert seen["settings"]["ROBOT_LAB_SANDBOX__WHEN_UNAVAILABLE"] == "refuse"
    assert os.path.exists("/etc/robot-lab") == host_etc_before  # the host's /etc is untouched
    # the admin user needs its password: a process that slipped past the profile gets nothing
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(real_redis_url.replace(real_redis_url.split("@")[0].split("//")[1] + "@", "")).ping()


def test_a_worker_logs_in_as_its_robots_user_and_refuses_an_unsigned_message(
        hardened_state: State, real_client: redis.Redis, real_redis_url: str, key_prefix: str,
        processes: Any) -> None:  # noqa: F811
    processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "--app", APP],
                    child_env(real_redis_url, key_prefix), "worker")
    wait_for_bus_worker(real_client, key_prefix, "billing")
    assert "rl-worker-billing" in _users(real_client)
    assert "rl-coordinator" not in _users(real_client)
    keys = Keys(prefix=key_prefix)
    bus = Bus(real_client, keys=keys)
    signed = bus.request("billing", "hello", from_="cli", timeout=60)  # this process signs with the keys folder
    assert signed.from_ == "billing" and "hello" in str(signed.content)
    unsigned = bus.publish("billing", "forged", from_="nobody-has-this-key")
    wait_for(lambda: real_client.xlen(keys.dlq("billing")) >= 1, timeout=60, interval=0.2)
    [(_, fields)] = real_client.xrange(keys.dlq("billing"))
    text = json.dumps({k.decode(): v.decode(errors="replace") for k, v in fields.items()})
    assert unsigned.id in text and "unauthenticated" in text, processes.logs()


def test_a_worker_for_two_robots_is_a_process_per_robot_that_dies_with_it(
        hardened_state: State, real_client: redis.Redis, real_redis_url: str, key_prefix: str,
        processes: Any) -> None:  # noqa: F811
    proc = processes.start([str(VENV_BIN / "robot-lab"), "worker", "billing", "technical", "--app", APP],
                           child_env(real_redis_url, key_prefix), "worker")
    for robot in ("billing", "technical"):
        wait_for_bus_worker(real_client, key_prefix, robot)
    assert {"rl-worker-billing", "rl-worker-technical"} <= set(_users(real_client))
    assert Bus(real_client, keys=Keys(prefix=key_prefix)).request("technical", "hi", from_="cli", timeout=60)
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor only: its robots' workers go with it
    wait_for(lambda: not {"rl-worker-billing", "rl-worker-technical"} & set(_users(real_client)), timeout=60,
             interval=0.2)


def test_a_second_key_prefix_in_one_session_leaves_the_first_ones_processes_their_keys(
        hardened_state: State, real_client: redis.Redis, real_redis_url: str, key_prefix: str) -> None:
    """``robot-lab acl`` names users by role, not by prefix: a test that starts a deployment
    beside a running one (the A2A stack and a server on another prefix) must not take the
    first one's keys away from its processes."""
    other = f"{key_prefix}-second"
    code = "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL']).set(os.environ['ROBOT_LAB_KEY_PREFIX'] + ':probe', 1)"
    for prefix in (key_prefix, other):
        done = subprocess.run([sys.executable, "-c", code], env=child_env(real_redis_url, prefix), cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    for prefix in (key_prefix, other):
        assert real_client.execute_command("ACL", "DRYRUN", "rl-coordinator", "SET", f"{prefix}:probe", "1") == b"OK"
    assert real_client.execute_command("ACL", "DRYRUN", "rl-coordinator", "SET", "rltest-elsewhere:probe", "1") != b"OK"
    real_client.delete(f"{other}:probe")
