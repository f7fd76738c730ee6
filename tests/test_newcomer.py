"""Each mistake a newcomer or an operator makes, run through the real ``robot-lab`` command:
one clear line, no traceback, a non-zero exit where the command failed. ``--debug`` is the one way to see a traceback.

Most cases run the installed console script in a subprocess, as a user would, so that what
is asserted is exactly what reaches the terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from robot_lab.keys import Keys
from tests.ports import free_port
from tests.redis_server import REPO_ROOT
from tests.worker_procs import VENV_BIN, uid

ROBOT_LAB = str(VENV_BIN / "robot-lab")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "ROBOT_LAB_REDIS_URL", "ROBOT_LAB_APP",
                                                         "ROBOT_LAB_LOG_LEVEL", "OPENAI_API_KEY")}
    env.update(ROBOT_LAB_ALLOW_MODEL_REQUESTS="0", LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONPATH=str(REPO_ROOT),
               COLUMNS="200")
    env.update(extra)
    return env


def cli(*args: str, cwd: Path | None = None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ROBOT_LAB, *args], env=_env(**env), cwd=cwd or REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_clear_line(out: subprocess.CompletedProcess[str], *expected: str, code: int = 1) -> str:
    """The failure is one ``Error:`` line on stderr that says ``expected``; no traceback."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out.stderr
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


# --- Redis: unreachable, malformed URLs, wrong password --------------------------------------

def test_unreachable_redis() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for command in (["status"], ["runs"], ["send", "billing", "hi"], ["bus", "stats"]):
        assert_one_clear_line(cli(*command, REDIS_URL=url), f"cannot reach Redis at {url}", "check REDIS_URL")


def test_debug_shows_the_traceback() -> None:
    out = cli("--debug", "status", REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    assert out.returncode == 1 and "Traceback" in out.stderr and "ConnectionError" in out.stderr


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:6379/abc", "database 'abc' is not a number"),
    ("unix://user:s3cret@somehost/run/redis.sock", "a unix:// URL names a socket path, not a host"),
    ("redis://:s3cret@127.0.0.1:notaport/0", "bad port"),
    ("http://127.0.0.1:6379", "unknown scheme 'http'"),
    ("redis://a:1,b:2/0", "several hosts need redis+sentinel:// or redis+cluster://"),
])
def test_bad_redis_url(url: str, expected: str) -> None:
    out = cli("status", REDIS_URL=url)
    line = assert_one_clear_line(out, expected)
    assert "s3cret" not in out.stdout + out.stderr and ("***" in line or "s3cret" not in url)


def test_unix_socket_url_with_credentials_connects_or_says_why(tmp_path: Path) -> None:
    """``unix://user:pw@/path`` gets a clear error, not an IndexError deep in redis-py."""
    sock = tmp_path / "nothing.sock"
    assert_one_clear_line(cli("status", REDIS_URL=f"unix://user:s3cret@{sock}"), "cannot reach Redis at unix://user:***@")


def test_unix_socket_url_works(tmp_path: Path) -> None:
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("no redis-server binary")
    sock = tmp_path / "r.sock"
    server = subprocess.Popen(["/usr/bin/redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                               "--appendonly", "no", "--requirepass", "pw"], stdout=subprocess.DEVNULL)
    try:
        from tests.redis_server import wait_for

        wait_for(sock.exists)
        out = cli("status", "--json", REDIS_URL=f"unix://:pw@{sock}?db=3")
        assert out.returncode == 0, out.stderr
        assert_one_clear_line(cli("status", REDIS_URL=f"unix://:wrong@{sock}"), "refused the credentials")
    finally:
        server.terminate()
        server.wait(10)


def test_wrong_password(real_redis_url: str) -> None:
    parts = urlsplit(real_redis_url)
    url = f"redis://:wrong-pw@{parts.hostname}:{parts.port}/0"
    out = cli("status", REDIS_URL=url)
    assert_one_clear_line(out, "refused the credentials", "check the user and password in REDIS_URL")
    assert "wrong-pw" not in out.stderr


def test_bad_setting_names_the_variable() -> None:
    assert_one_clear_line(cli("status", ROBOT_LAB_WORKER_HEARTBEAT="abc"), "invalid setting worker_heartbeat = 'abc'",
                          "ROBOT_LAB_WORKER_HEARTBEAT")


# --- robots, apps, targets ------------------------------------------------------------------

def test_unknown_robot(real_redis_url: str, key_prefix: str) -> None:
    out = cli("worker", "nosuchbot", REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    line = assert_one_clear_line(out, "unknown robot 'nosuchbot'", "set ROBOT_LAB_APP or --app")
    assert "no app" not in line.replace("no app given", "")  # not "not in no app"
    out = cli("status", "nosuchbot", REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    assert out.returncode == 1 and "unknown robot 'nosuchbot'" in out.stdout and "Traceback" not in out.stderr
    assert "nosuchbot  " not in out.stdout  # no row of zeros for it
    assert "no robots yet" not in out.stdout  # the typo's problem line says it all


def test_status_check_exits_3_while_a_problem_line_is_printed(real_redis_url: str, key_prefix: str) -> None:
    env = {"REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix}
    assert cli("status", "--check", **env).returncode == 0  # nothing here needs a human
    import redis

    from robot_lab.keys import Keys

    client = redis.Redis.from_url(real_redis_url)
    client.xadd(Keys(prefix=key_prefix).dlq("ghost"), {"envelope": "{}", "reason": "invalid"})
    client.sadd(f"{key_prefix}:robots", "ghost")
    plain = cli("status", **env)
    assert plain.returncode == 0 and "! ghost: 1 dead letter(s)" in plain.stdout
    checked = cli("status", "--check", **env)
    assert checked.returncode == 3 and "! ghost: 1 dead letter(s)" in checked.stdout


def test_bad_app_paths(tmp_path: Path, real_redis_url: str, key_prefix: str) -> None:
    redis_env = {"REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix}
    assert_one_clear_line(cli("worker", "x", "--app", "nosuch.mod:app", **redis_env),
                          "cannot import app 'nosuch.mod:app'", "No module named 'nosuch'")
    (tmp_path / "brokenapp.py").write_text("import robot_lab\n\napp = robot_lab.App(nmae='typo')\n")
    line = assert_one_clear_line(cli("worker", "x", "--app", "brokenapp:app", cwd=tmp_path,
                                     PYTHONPATH=f"{tmp_path}:{REPO_ROOT}", **redis_env),
                                 "cannot import app 'brokenapp:app'", "TypeError")
    assert "brokenapp.py:3" in line
    (tmp_path / "app.yml").write_text("robots: hello\n")
    assert_one_clear_line(cli("run", f"{tmp_path / 'app.yml'}:net", "hi"), "robots must be a list")
    assert_one_clear_line(cli("run", "nosuch.mod:net", "hi"), "cannot import 'nosuch.mod'")


# --- models: what retrying cannot fix fails at once -----------------------------------------

def test_missing_credentials_fail_fast() -> None:
    out = cli("chat", "-m", "openai/gpt-4o-mini", "hello", ROBOT_LAB_ALLOW_MODEL_REQUESTS="1")
    assert_one_clear_line(out, "no credentials: set OPENAI_API_KEY")
    assert "llm.retry" not in out.stderr
    # noticed before litellm's import (seconds): the key of a common provider is checked first
    code = ("import sys\nfrom robot_lab.cli import main\n"
            "try:\n    main(['chat', '-m', 'anthropic/claude-3-5-haiku', 'hi'], standalone_mode=False)\n"
            "except Exception as exc:\n    print('ERROR=' + str(exc))\n"
            "print('LITELLM=' + str('litellm' in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], env=_env(ROBOT_LAB_ALLOW_MODEL_REQUESTS="1",
                                                                 ANTHROPIC_API_KEY=""),
                          capture_output=True, text=True, timeout=120)
    assert "no credentials: set ANTHROPIC_API_KEY" in done.stdout and "LITELLM=False" in done.stdout, done.stdout


def test_unknown_scripted_behaviour_fails_fast() -> None:
    out = cli("chat", "-m", "scripted/nosuchbehaviour", "hello")
    assert_one_clear_line(out, "scripted model 'nosuchbehaviour'", f"looked for {REPO_ROOT}/nosuchbehaviour[.yml",
                          "ROBOT_LAB_SCRIPTS_DIR is not set")  # where it looked
    assert "llm.retry" not in out.stderr
    scripts = cli("chat", "-m", "scripted/nosuchbehaviour", "hello", ROBOT_LAB_SCRIPTS_DIR="/srv/scripts")
    assert_one_clear_line(scripts, "/srv/scripts/nosuchbehaviour[.yml|.yaml|.json])")


def test_gateway_does_not_retry_permanent_provider_errors() -> None:
    from robot_lab.errors import ConfigurationError
    from robot_lab.llm.gateway import LLMGateway

    sleeps: list[float] = []
    gateway = LLMGateway(max_retries=3, sleep=sleeps.append)
    with pytest.raises(ConfigurationError, match="not a built-in behaviour"):
        gateway.complete("scripted/nosuchbehaviour", [{"role": "user", "content": "x"}])
    assert sleeps == []


# --- timeouts and waits ----------------------------------------------------------------------

def test_run_without_workers_says_so_and_times_out_with_one_line(real_redis_url: str, key_prefix: str) -> None:
    out = cli("run", "robot_lab.demo:support", "I was charged twice", "--timeout", "6",
              REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    line = assert_one_clear_line(out, "did not finish within 6 s", "no live worker serves it",
                                 "robot-lab watch", "robot-lab cancel", code=124)
    run_id = line.split()[2]
    assert f"robot-lab cancel {run_id}" in line and "robot:classifier" in line
    notes = [n for n in out.stderr.splitlines() if n.startswith("note: no live worker on robot:classifier")]
    assert notes, out.stderr
    assert "run.submitted" not in out.stderr  # human path: no structlog lines by default
    assert cli("cancel", run_id, REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix).returncode == 0
    _drop_rq_queues(real_redis_url)


def test_demo_without_workers_notes_and_times_out(real_redis_url: str, key_prefix: str) -> None:
    out = cli("demo", "--plain", "--timeout", "6", "--delay-ms", "0", REDIS_URL=real_redis_url,
              ROBOT_LAB_KEY_PREFIX=key_prefix)
    assert_one_clear_line(out, "did not finish within 6 s", "robot:classifier", code=124)
    assert "note: no live worker on robot:classifier" in out.stdout
    _drop_rq_queues(real_redis_url)


def test_embedded_run_timeout_is_one_line() -> None:
    out = cli("run", "robot_lab.demo:support", "hi", "--timeout", "0.01")
    assert_one_clear_line(out, "did not finish within 0.01 s", "embedded mode", code=124)


def _drop_rq_queues(url: str) -> None:
    from rq import Queue

    conn = redis.Redis.from_url(url)
    for robot in ("classifier", "billing", "technical", "general", "sentiment", "urgency", "summarizer"):
        Queue(f"robot:{robot}", connection=conn).delete(delete_jobs=True)
    conn.close()


# --- the bus: wording, orphans, modes ------------------------------------------------------

def test_send_to_unknown_robot_suggests_the_flag(real_redis_url: str, key_prefix: str) -> None:
    out = cli("send", "nosuchbot", "hi", REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    line = assert_one_clear_line(out, "Unknown channel: 'nosuchbot'", "--create")
    assert "create=True" not in line


def test_send_create_to_a_typo_is_an_orphan_until_removed(real_redis_url: str, key_prefix: str) -> None:
    env = {"REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix}
    typo = f"billng-{uid()}"
    out = cli("send", typo, "hi", "--create", **env)
    assert out.returncode == 0 and "no robot of that name is published" in out.stderr
    status = cli("status", **env)
    assert f"orphan inbox '{typo}'" in status.stdout and f"robot-lab bus remove {typo}" in status.stdout
    assert cli("bus", "remove", typo, **env).returncode == 0
    assert "orphan" not in cli("status", **env).stdout
    conn = redis.Redis.from_url(real_redis_url)
    assert not conn.exists(Keys(prefix=key_prefix).inbox(typo))
    conn.close()


def test_embedded_mode_says_why_results_are_empty() -> None:
    out = cli("status")
    assert out.returncode == 0 and "embedded mode (no REDIS_URL)" in out.stdout and "┏" not in out.stdout
    runs = cli("runs")
    assert runs.returncode == 0 and "no runs yet" in runs.stdout and "┏" not in runs.stdout
    stats = cli("bus", "stats")
    assert stats.returncode == 0 and "no REDIS_URL" in stats.stdout
    assert_one_clear_line(cli("send", "billing", "hi"), "embedded mode sees only the inboxes of this one process")
    assert_one_clear_line(cli("run", "robot_lab.demo:support", "hi", "--no-wait"), "--no-wait needs REDIS_URL",
                          code=2)
    assert_one_clear_line(cli("send", "billing", "hi", "--wait"), "--wait needs REDIS_URL", code=2)
    assert_one_clear_line(cli("watch", "some-run"), "watch needs REDIS_URL")
    assert_one_clear_line(cli("cancel", "some-run"), "an embedded run lives only in the process that started it")
    assert "no REDIS_URL" in cli("dlq", "list", "billing").stdout


def test_runs_says_no_runs_yet(real_redis_url: str, key_prefix: str) -> None:
    out = cli("runs", REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    assert out.returncode == 0 and out.stdout.strip() == "no runs yet"


# --- quiet human paths -----------------------------------------------------------------------

def test_interactive_commands_log_at_warning_unless_asked() -> None:
    quiet = cli("run", "robot_lab.demo:support", "Do you have an office in Lisbon?", ROBOT_LAB_LOG_FORMAT="json")
    assert quiet.returncode == 0, quiet.stderr
    assert '"level": "info"' not in quiet.stderr
    loud = cli("-v", "run", "robot_lab.demo:support", "Do you have an office in Lisbon?", ROBOT_LAB_LOG_FORMAT="json")
    assert loud.returncode == 0 and '"level": "info"' in loud.stderr


def test_app_that_fails_to_import_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "netmod.py").write_text(textwrap.dedent("""\
        from robot_lab import create_network

        net = create_network("n")
        raise RuntimeError("database not configured")
    """))
    out = cli("run", "netmod:net", "hi", cwd=tmp_path, PYTHONPATH=f"{tmp_path}:{REPO_ROOT}")
    line = assert_one_clear_line(out, "cannot import 'netmod'", "RuntimeError: database not configured")
    assert "netmod.py:4" in line


def test_demo_delay_travels_with_the_run() -> None:
    """``demo --delay-ms`` in distributed mode: the delay is in the robots' model names, which
    every worker that imported the demo app resolves to the same script."""
    from robot_lab import demo
    from robot_lab.llm import scripted

    app = demo.build_app(250)
    assert app.robot_spec("billing").model == "scripted/demo-billing@250"
    assert scripted._script_for("demo-billing@250").default.sleep_ms == 250
    assert scripted._script_for("demo-urgency@100").default.sleep_ms == 150
    assert scripted._script_for("demo-billing@soon") is None


# --- health: a folder per user and worker group; dead neighbours aged out ---------------------

def test_health_folder_is_per_user_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from robot_lab.workers.health import health_dir

    monkeypatch.delenv("ROBOT_LAB_HEALTH_DIR", raising=False)
    monkeypatch.setenv("ROBOT_LAB_KEY_PREFIX", "team-a")
    folder = health_dir()
    assert folder.name == "team-a" and folder.parent.name == f"robot-lab-health-{os.getuid()}"


def test_dead_neighbour_is_reported_once_and_does_not_fail_the_probe(tmp_path: Path, redis_client,  # type: ignore[no-untyped-def]
                                                                       key_prefix: str) -> None:
    import json

    from robot_lab.workers.health import WorkerHeartbeat, check_health

    beat = WorkerHeartbeat(redis_client, Keys(prefix=key_prefix), "robot-lab.me.1", ["x"], role="worker",
                           interval=1, directory=tmp_path)
    assert beat.beat()
    dead = dict(json.loads(beat.file.read_text()), pid=2**22 + 12345, name="robot-lab.me.dead")
    (tmp_path / "robot-lab.me.dead.json").write_text(json.dumps(dead))
    ok, lines = check_health(tmp_path)
    assert ok and any(line.startswith("robot-lab.me.dead: process") and "is gone" in line for line in lines)
    ok, lines = check_health(tmp_path)
    assert ok and lines == [line for line in lines if "me.dead" not in line] and len(lines) == 1
    beat.stop()


# --- docs for users ------------------------------------------------------------------------

def test_user_docs_link_only_inside_the_repo_and_speak_to_users() -> None:
    import re

    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (page.parent / target).resolve().is_relative_to(REPO_ROOT.resolve()), (page.name, target)
            assert (page.parent / target).exists(), (page.name, target)
        assert not re.search(r"\bthe brief\b", text, re.I), page.name


def test_watch_takes_the_short_run_ids_the_tables_show(real_redis_url: str, key_prefix: str) -> None:
    """The dashboard and tables show a run's last 12 characters; `watch` and `cancel` take them."""
    from robot_lab.network.coordinator import Coordinator
    from robot_lab.network.dsl import create_network
    from robot_lab.runtime.robot import build

    client = redis.Redis.from_url(real_redis_url)
    net = create_network("nobody")
    net.task("wait", build(f"unserved-{uid()}", model="scripted/echo"))
    handle = Coordinator(connection=client, keys=Keys(prefix=key_prefix)).submit(net, "hi")  # no worker
    env = {"REDIS_URL": real_redis_url, "ROBOT_LAB_KEY_PREFIX": key_prefix}
    out = cli("watch", handle.run_id[-12:], "--plain", "--timeout", "1", **env)
    assert "run.started" in out.stdout  # it found the run
    assert_one_clear_line(out, f"run {handle.run_id} did not finish within 1 s", "no live worker serves it",
                          code=124)
    assert cli("cancel", handle.run_id[-12:], **env).stdout.strip() == f"run {handle.run_id[-12:]}: cancelled"
    assert handle.status == "cancelled"
    assert_one_clear_line(cli("watch", "zzzz-not-a-run", **env), "run 'zzzz-not-a-run' not found")
    client.close()


def test_run_no_wait_without_a_message_is_a_usage_error(real_redis_url: str, key_prefix: str) -> None:
    out = cli("run", "robot_lab.demo:support", "--no-wait", REDIS_URL=real_redis_url, ROBOT_LAB_KEY_PREFIX=key_prefix)
    assert_one_clear_line(out, "--no-wait needs a MESSAGE", code=2)
