"""ScriptTool (naming, interpreters, results) and real confinement with bubblewrap."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from robot_lab.settings import SandboxSettings, Settings, SkillGrant, SkillsSettings
from robot_lab.skills import AgentSkill, Capabilities, ScriptTool, SkillCatalog, derive_name, extract_description
from robot_lab.sandbox.sandbox import python_executable
from robot_lab.sandbox import sandbox as sandbox_mod
from robot_lab.sandbox.workspace_tools import workspace_tools
from tests.redis_server import wait_for
from tests.test_skills import write_skill


@pytest.fixture
def bwrap() -> None:
    """Real bwrap: a missing one fails the test (CI installs bubblewrap); a bwrap that
    cannot create namespaces on this machine (some containers) skips, saying so."""
    usable, reason = sandbox_mod.bwrap_status()
    if usable:
        return
    if sandbox_mod.bwrap_path() is None:
        pytest.fail("bwrap is not installed: apt-get install bubblewrap (the sandbox tests need it)")
    pytest.skip(f"skipped because bwrap cannot create namespaces on this machine: {reason}")


needs_bwrap = pytest.mark.usefixtures("bwrap")


def tools_of(directory: Path, sandbox: SandboxSettings, skills: SkillsSettings | None = None) -> dict[str, ScriptTool]:
    """The skill's tools under ``sandbox`` and, when given, the per-skill grants of ``skills``."""
    skill = AgentSkill(directory)
    ceiling = Capabilities.ceiling(sandbox, skill=skill.name, skills=skills or SkillsSettings())
    return {t.script_name: t for t in skill.script_tools(ceiling, sandbox=sandbox)}


# --- naming, descriptions, interpreters (no sandbox needed) ------------------------------------------


@pytest.mark.parametrize(("filename", "name"), [
    ("check-deploy.sh", "check_deploy"), ("run_tests.py", "run_tests"), ("--odd..name!.js", "odd_name"),
    ("noext", "noext"), ("x" * 80 + ".py", "x" * 64), ("!!!.sh", "script"),
])
def test_derive_name(filename: str, name: str) -> None:
    assert derive_name(filename) == name


def test_extract_description(tmp_path: Path) -> None:
    cases = {
        "a.sh": "#!/usr/bin/env bash\n# Verifies a deployment.\necho\n",
        "b.py": '#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n"""Counts words in a file.\n\nMore."""\n',
        "c.py": "# Comment wins when no docstring.\nprint(1)\n",
        "d.js": "#!/usr/bin/env node\n// Lists npm packages.\n",
        "e.sh": "echo no comment\n# too late\n",
    }
    for filename, text in cases.items():
        (tmp_path / filename).write_text(text)
    assert extract_description(tmp_path / "a.sh") == "Verifies a deployment."
    assert extract_description(tmp_path / "b.py") == "Counts words in a file."
    assert extract_description(tmp_path / "c.py") == "Comment wins when no docstring."
    assert extract_description(tmp_path / "d.js") == "Lists npm packages."
    assert extract_description(tmp_path / "e.sh") == "Run e"


def test_interpreter_choice_and_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "node" else f"/usr/bin/{name}")
    directory = write_skill(tmp_path, "interp", scripts={
        "plain.py": "print('py')\n",
        "plain.sh": "echo sh\n",
        "exec_tool": "#!/bin/sh\necho exec\n",
        "bang_noexec": "#!/bin/sh\necho bang\n",
        "exec_nobang.py": "import sys\nprint(sys.executable)\n",  # exec bit, no #!: the extension rule
        "env_python": "#!/usr/bin/env python3\nprint(1)\n",  # robot-lab's Python, not the system's
        "utils.py": '"""Helpers."""\nimport os\n\ndef helper():\n    return 1\n',  # a library: no tool
        "template.pdf": "%PDF-1.4 data\n",  # data: no tool, no warning
        "fields.csv": "a,b\n",
        "lint.js": "console.log(1)\n",  # node is missing: skipped with a warning
    }, executable=("exec_tool", "exec_nobang.py", "env_python"))
    skill = AgentSkill(directory)
    with capture_logs() as logs:
        tools = {t.script_name: t for t in skill.script_tools(Capabilities())}
    assert set(tools) == {"plain", "exec_tool", "bang_noexec", "exec_nobang", "env_python"}
    assert tools["exec_tool"].command == [str(directory.resolve() / "scripts" / "exec_tool")]
    assert tools["bang_noexec"].command[0] == "/bin/sh"
    here = python_executable(sys.executable)
    assert tools["plain"].command[0] == here and tools["plain"].python is not None
    assert tools["exec_nobang"].command[0] == here
    assert tools["env_python"].command[0] == here
    assert any(e["event"] == "script_tool.skipped" and "lint.js" in e["script"] for e in logs)
    assert any("lint.js: skipped: node is not installed" in w for w in skill.warnings)
    assert not any(name in w for w in skill.warnings for name in ("template.pdf", "fields.csv", "utils.py"))
    # plain.py and plain.sh both derive "plain": the second is skipped, with a warning
    assert any("tool name 'interp__plain' already taken" in w for w in skill.warnings)
    assert tools["plain"].parameters["properties"]["args"]["type"] == "string"
    assert tools["plain"].to_openai()["function"]["name"] == "interp__plain"


def test_python_per_root_and_globally(tmp_path: Path) -> None:
    root = tmp_path / "vendor"
    directory = write_skill(root, "pyroot", scripts={"go.py": "print(1)\n"})
    settings = Settings(skills={"root_python": {str(root): "/opt/py/bin/python3"}})
    skill = SkillCatalog([root], settings=settings).get("pyroot")
    assert skill.python == "/opt/py/bin/python3"
    assert skill.script_tools(Capabilities())[0].command[0] == "/opt/py/bin/python3"
    other = AgentSkill(directory, settings=Settings(skills={"python": "/usr/bin/python3"}))
    assert other.script_tools(Capabilities())[0].command[0] == "/usr/bin/python3"


def test_python_path_with_dotdot_and_symlinks_is_resolved(tmp_path: Path) -> None:
    link = tmp_path / "linked-bin"
    link.symlink_to(Path(sys.executable).parent)
    weird = str(link / ".." / "linked-bin" / Path(sys.executable).name)
    resolved = python_executable(weird)
    assert ".." not in resolved and "linked-bin" not in resolved
    assert resolved == os.path.join(os.path.realpath(Path(sys.executable).parent), Path(sys.executable).name)


def test_script_tools_are_cached_until_a_script_changes(tmp_path: Path) -> None:
    directory = write_skill(tmp_path, "cached", scripts={"a.py": "print(1)\n"})
    skill = AgentSkill(directory)
    first = skill.script_tools(Capabilities())
    assert skill.script_tools(Capabilities())[0] is first[0]
    (directory / "scripts" / "b.py").write_text("print(2)\n")
    assert [t.script_name for t in skill.script_tools(Capabilities())] == ["a", "b"]


def test_args_split_like_a_shell_and_bad_quotes(tmp_path: Path) -> None:
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined")
    directory = write_skill(tmp_path, "args", scripts={"echo.py": "import sys, json\nprint(json.dumps(sys.argv[1:]))\n"})
    tool = tools_of(directory, sandbox)["echo"]
    assert json.loads(tool.call({"args": "a 'b c' \"d e\""})) == ["a", "b c", "d e"]
    assert json.loads(tool.call({})) == []
    assert tool.call({"args": "unbalanced 'quote"}).startswith("Error (bad args):")


def test_exit_code_and_output_cap_unconfined(tmp_path: Path) -> None:
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined", max_output_bytes=1000)
    directory = write_skill(tmp_path, "results", scripts={
        "fail.sh": "echo before failing\nexit 3\n",
        "loud.py": "import sys\nsys.stdout.write('x' * 200000)\n",
    })
    tools = tools_of(directory, sandbox)
    assert tools["fail"].call({}) == "Error (exit 3):\nbefore failing"
    loud = tools["loud"].call({})
    assert loud.startswith("x" * 1000) and "[output truncated: 200000 bytes, first 1000 shown]" in loud
    assert tools["loud"].last_outcome is not None and tools["loud"].last_outcome.mode == "unconfined"


def test_refuses_when_sandbox_disabled_and_policy_refuse(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    sandbox = SandboxSettings(enabled=False, when_unavailable="refuse", fs_write=[str(tmp_path)])
    directory = write_skill(tmp_path / "skills", "refused", scripts={
        "touch.py": f"open({str(marker)!r}, 'w').write('x')\n"}, extra=f"fs_write: [{tmp_path}]")
    result = tools_of(directory, sandbox)["touch"].call({})
    assert result.startswith("Error (sandbox unavailable): sandboxing is disabled")
    assert not marker.exists()


def test_unconfined_policy_runs_with_warning_and_scrubbed_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_TEST_HIDDEN", "hidden")
    monkeypatch.setattr(sandbox_mod, "_warned", set())
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined")
    directory = write_skill(tmp_path, "loose", scripts={"env.py": "import os, json\nprint(json.dumps(sorted(os.environ)))\n"})
    with capture_logs() as logs:
        names = json.loads(tools_of(directory, sandbox)["env"].call({}))
    assert "RL_TEST_HIDDEN" not in names
    assert any(e["event"] == "sandbox.unconfined" for e in logs)


def test_unconfined_timeout_kills_the_process_group(tmp_path: Path) -> None:
    token = f"{300 + secrets.randbelow(10_000)}.{secrets.randbelow(10**6):06d}"
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined", timeout=1)
    directory = write_skill(tmp_path, "slow", scripts={"spin.sh": f"sleep {token} &\nsleep {token}\n"},
                            extra="timeout: 1")
    result = tools_of(directory, sandbox)["spin"].call({})
    assert result.startswith("Error (timed out):") and "[killed: exceeded 1s]" in result
    assert wait_for(lambda: not _processes_with(token)), _processes_with(token)


def test_core_trust_runs_unconfined_with_parent_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_TEST_PARENT", "parent")
    secret = Path(os.environ["HOME"]) / "core-readable.txt"
    secret.write_text("core can read home")
    sandbox = SandboxSettings(enabled=True, when_unavailable="refuse")
    directory = write_skill(tmp_path, "trusted", extra="trust: core", scripts={
        "read.py": f"import os\nprint(open({str(secret)!r}).read(), os.environ.get('RL_TEST_PARENT'))\n"})
    trusted = SkillsSettings(core_trusted=["trusted"])  # the operator names it: SKILL.md alone only asks
    assert tools_of(directory, sandbox, trusted)["read"].call({}) == "core can read home parent"


# --- confinement with bwrap ------------------------------------------------------------------------


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def listener() -> Iterator[dict[str, Any]]:
    """A loopback TCP listener in the test process that records accepted connections."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    state: dict[str, Any] = {"port": server.getsockname()[1], "accepted": 0, "stop": False}

    def serve() -> None:
        while not state["stop"]:
            try:
                conn, _ = server.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            state["accepted"] += 1
            conn.sendall(b"hello-from-listener\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state["stop"] = True
        thread.join(2)
        server.close()


CONNECT = """
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3)
    print("CONNECTED", s.recv(100).decode().strip())
except OSError as exc:
    print("BLOCKED", type(exc).__name__, exc)
"""


@needs_bwrap
def test_cannot_read_home(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    (home / "secret.txt").write_text("TOP SECRET")
    data = tmp_path / "data"
    data.mkdir()
    (data / "ok.txt").write_text("granted data")
    sandbox = SandboxSettings(fs_read=[str(data), str(tmp_path / "skills")])
    probe = f"""
import os
for path in ({str(home / 'secret.txt')!r}, {str(data / 'ok.txt')!r}, "/etc/shadow"):
    try:
        print(path, "READ", open(path).read().strip() or "(empty)")
    except OSError as exc:
        print(path, "DENIED", type(exc).__name__)
print("HOME", os.environ["HOME"], os.path.exists({str(home)!r}))
"""
    directory = write_skill(tmp_path / "skills", "reader", scripts={"probe.py": probe},
                            extra=f"fs_read: [{home}, {data}]")
    out = tools_of(directory, sandbox)["probe"].call({})
    assert f"{home / 'secret.txt'} DENIED" in out, out
    assert f"{data / 'ok.txt'} READ granted data" in out, out
    assert "TOP SECRET" not in out
    assert "HOME /tmp False" in out
    if Path("/etc/shadow").exists():
        assert "/etc/shadow READ" not in out or "/etc/shadow READ (empty)" in out


@needs_bwrap
def test_cannot_write_outside_fs_write(tmp_path: Path) -> None:
    home = Path(os.environ["HOME"])
    out_dir, ro_dir = tmp_path / "out", tmp_path / "ro"
    out_dir.mkdir()
    ro_dir.mkdir()
    sandbox = SandboxSettings(fs_read=[str(ro_dir)], fs_write=[str(out_dir)])
    targets = {
        "out": out_dir / "allowed.txt",
        "ro": ro_dir / "nope.txt",
        "home": home / "nope.txt",
        "sibling": tmp_path / "nope.txt",
    }
    probe = "import json\nresults = {}\n"
    for key, path in targets.items():
        probe += (f"try:\n    open({str(path)!r}, 'w').write('x')\n    results[{key!r}] = 'WROTE'\n"
                  f"except OSError as exc:\n    results[{key!r}] = type(exc).__name__\n")
    probe += "import os\ntry:\n    open(os.path.join(os.path.dirname(__file__), 'x'), 'w')\n    results['skill'] = 'WROTE'\n"
    probe += "except OSError as exc:\n    results['skill'] = type(exc).__name__\nprint(json.dumps(results))\n"
    directory = write_skill(tmp_path / "skills", "writer", scripts={"probe.py": probe},
                            extra=f"fs_read: [{ro_dir}]\nfs_write: [{out_dir}, {tmp_path}]")
    results = json.loads(tools_of(directory, sandbox)["probe"].call({}))
    assert results["out"] == "WROTE" and targets["out"].read_text() == "x"
    assert results["ro"] != "WROTE" and results["skill"] != "WROTE"
    for key in ("ro", "home", "sibling"):
        assert not targets[key].exists(), key
    assert not (directory / "scripts" / "x").exists()


@needs_bwrap
def test_no_network_unless_granted(tmp_path: Path, listener: dict[str, Any]) -> None:
    sandbox = SandboxSettings(network=False)
    directory = write_skill(tmp_path, "offline", scripts={"connect.py": CONNECT}, extra="network: true")
    out = tools_of(directory, sandbox)["connect"].call({"args": str(listener["port"])})
    assert out.startswith("BLOCKED"), out
    assert listener["accepted"] == 0


@needs_bwrap
def test_network_when_skill_and_ceiling_allow(tmp_path: Path, listener: dict[str, Any]) -> None:
    sandbox = SandboxSettings(network=True)
    directory = write_skill(tmp_path, "online", scripts={"connect.py": CONNECT}, extra="network: true")
    out = tools_of(directory, sandbox)["connect"].call({"args": str(listener["port"])})
    assert out == "CONNECTED hello-from-listener", out
    assert listener["accepted"] == 1
    # the skill did not ask: no network even though the ceiling allows it
    quiet = write_skill(tmp_path, "quiet", scripts={"connect.py": CONNECT})
    assert tools_of(quiet, sandbox)["connect"].call({"args": str(listener["port"])}).startswith("BLOCKED")


@needs_bwrap
def test_timeout_kills_script_and_its_child(tmp_path: Path) -> None:
    token = f"{300 + secrets.randbelow(10_000)}.{secrets.randbelow(10**6):06d}"
    sandbox = SandboxSettings(timeout=30)
    script = f"""
import subprocess, time
subprocess.Popen(["sleep", "{token}"])
subprocess.Popen(["sleep", "{token}"], start_new_session=True)  # leaves the process group
print("children started", flush=True)
time.sleep(600)
"""
    directory = write_skill(tmp_path, "sleepy", scripts={"spawn.py": script}, extra="timeout: 1.5")
    tool = tools_of(directory, sandbox)["spawn"]
    assert tool.grant.timeout == 1.5
    result = tool.call({})
    assert result.startswith("Error (timed out):\nchildren started"), result
    assert "[killed: exceeded 1.5s]" in result
    assert tool.last_outcome is not None and tool.last_outcome.mode == "bwrap"
    assert wait_for(lambda: not _processes_with(token)), _processes_with(token)


@needs_bwrap
def test_only_declared_env_vars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_TEST_DECLARED", "visible")
    monkeypatch.setenv("RL_TEST_UNDECLARED", "invisible")
    monkeypatch.setenv("RL_TEST_TOKEN", "s3cr3t-value")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak-123456")
    sandbox = SandboxSettings()
    directory = write_skill(tmp_path, "envy", scripts={
        "env.py": "import os, json\nprint(json.dumps(dict(os.environ)))\n",
    }, extra="env: [RL_TEST_DECLARED, RL_TEST_MISSING]\nsecrets: [RL_TEST_TOKEN]")
    granted = SkillsSettings(grants={"envy": SkillGrant(env=["RL_TEST_DECLARED", "RL_TEST_MISSING"],
                                                        secrets=["RL_TEST_TOKEN"])})
    seen = json.loads(tools_of(directory, sandbox, granted)["env"].call({}))
    assert seen["RL_TEST_DECLARED"] == "visible"
    assert seen["RL_TEST_TOKEN"] == "s3cr3t-value"
    assert "RL_TEST_UNDECLARED" not in seen and "OPENAI_API_KEY" not in seen and "RL_TEST_MISSING" not in seen
    baseline = {"PATH", "HOME", "LANG", "TMPDIR", "PWD", "LC_CTYPE", "SHLVL", "_"}
    assert set(seen) - baseline == {"RL_TEST_DECLARED", "RL_TEST_TOKEN", "PYTHONPATH"}
    assert seen["PYTHONPATH"] == os.path.realpath(directory)  # the bundle: ``from scripts.x import ...``
    assert seen["HOME"] == "/tmp"


@needs_bwrap
def test_python_script_without_exec_bit_and_shell_and_exec_runs_confined(tmp_path: Path) -> None:
    sandbox = SandboxSettings()
    directory = write_skill(tmp_path, "kinds", scripts={
        "count.py": "import sys\nprint(len(sys.argv) - 1)\n",
        "hello.sh": "echo \"hello $1\"\n",
        "direct": "#!/bin/sh\necho direct \"$@\"\nexit 4\n",
    }, executable=("direct",))
    tools = tools_of(directory, sandbox)
    assert tools["count"].call({"args": "a b c"}) == "3"
    assert tools["hello"].call({"args": "world"}) == "hello world"
    assert tools["direct"].call({"args": "x"}) == "Error (exit 4):\ndirect x"
    assert all(t.last_outcome is not None and t.last_outcome.mode == "bwrap" for t in tools.values())


@needs_bwrap
def test_bwrap_argv_orders_writable_inside_readonly(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    rw = ro / "rw"
    rw.mkdir(parents=True)
    grant = Capabilities(fs_read=[str(ro)], fs_write=[str(rw)], network=False)
    argv = sandbox_mod.bwrap_argv(["true"], grant, skill_dir=str(tmp_path), cwd=str(tmp_path))
    assert "--share-net" not in argv and "--unshare-all" in argv
    assert argv.index(str(rw)) > argv.index(str(ro))
    assert argv[argv.index(str(rw)) - 1] == "--bind"
    tmpfs = argv.index("--tmpfs", argv.index("/proc"))
    assert tmpfs < argv.index(str(ro))


@pytest.mark.parametrize("policy", ["refuse", "unconfined"])
def test_unusable_bwrap_follows_when_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    monkeypatch.setattr(sandbox_mod, "_probe", (False, "bwrap cannot create namespaces on this machine: (simulated)"))
    monkeypatch.setattr(sandbox_mod, "_warned", set())
    marker = tmp_path / "out" / "ran"
    marker.parent.mkdir()
    sandbox = SandboxSettings(enabled=True, when_unavailable=policy, fs_write=[str(marker.parent)])
    directory = write_skill(tmp_path / "skills", "nobwrap", extra=f"fs_write: [{marker.parent}]", scripts={
        "touch.py": f"open({str(marker)!r}, 'w').write('x')\nprint('ran')\n"})
    with capture_logs() as logs:
        result = tools_of(directory, sandbox)["touch"].call({})
    if policy == "refuse":
        assert result.startswith("Error (sandbox unavailable): bwrap cannot create namespaces on this machine")
        assert not marker.exists()
        assert any(e["event"] == "sandbox.refused" for e in logs)
    else:
        assert result == "ran" and marker.exists()
        assert any(e["event"] == "sandbox.unconfined" for e in logs)


def test_killed_and_silent_scripts_say_so(tmp_path: Path) -> None:
    sandbox = SandboxSettings(enabled=False, when_unavailable="unconfined")
    directory = write_skill(tmp_path, "quiet", scripts={
        "silent.sh": "true\n",
        "killed.sh": "echo partial\nkill -TERM $$\n",
        "shell143.sh": "exit 143\n",
    })
    tools = tools_of(directory, sandbox)
    assert tools["silent"].call({}) == "(the script succeeded and printed nothing)"
    assert tools["killed"].call({}) == "Error (killed by signal 15, SIGTERM):\npartial"
    assert tools["shell143"].call({}) == "Error (killed by signal 15, SIGTERM):\n(no output)"
    assert sandbox_mod.Outcome("", 3, False, False, "bwrap", 0.0).text() == "Error (exit 3):\n(no output)"


# --- what of the host a script sees: /etc, and ptrace ------------------------------------------------


# Mounts, inside the private mount namespace the test makes (never the host's): an overlay on
# /etc (so folders can be made without touching the host's /etc), a tmpfs at deploy/k8s's
# signing-keys path, and a tmpfs under /etc/ssl, a folder scripts do see. Then the probe.
ETC_MOUNTS = """set -e
mount -t tmpfs tmpfs "$1"
mkdir "$1/upper" "$1/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc
mkdir -p /etc/robot-lab/keys /etc/ssl/mounted
mount -t tmpfs tmpfs /etc/robot-lab/keys
mount -t tmpfs tmpfs /etc/ssl/mounted
echo KEY-SECRET-1 > /etc/robot-lab/keys/coordinator.key
echo KEY-SECRET-2 > /etc/ssl/mounted/extra.key
shift
exec "$@"
"""

ETC_PROBE = """
import json, sys
from robot_lab.settings import SandboxSettings, SkillsSettings
from robot_lab.skills import AgentSkill, Capabilities
from robot_lab.sandbox.workspace_tools import workspace_tools
tools = {t.name: t for t in workspace_tools(sys.argv[1], sandbox=SandboxSettings())}
run = lambda command: tools["run_command"].call({"command": command})
granted = SandboxSettings(fs_read=["/etc/ssl/mounted"])
ceiling = Capabilities.ceiling(granted, skill="sslreader", skills=SkillsSettings())
print(json.dumps({
    "granted": AgentSkill(sys.argv[2]).script_tools(ceiling, sandbox=granted)[0].call({}),
    "host_sees": open("/etc/robot-lab/keys/coordinator.key").read().strip(),
    "cat": run("cat /etc/robot-lab/keys/coordinator.key /etc/ssl/mounted/extra.key"),
    "ls": run("ls -A /etc"),
    "read": tools["read_file"].call({"path": "/etc/robot-lab/keys/coordinator.key"}),
    "list": tools["list_files"].call({"path": "/etc"}),
    "mode": tools["run_command"].last_outcome.mode,
}))
"""


def in_private_mount_namespace(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run inside a mount namespace of its own holding :data:`ETC_MOUNTS`."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) is not installed")
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]  # a non-root run mounts in a user namespace
    scratch = tmp_path / "etc-overlay"
    scratch.mkdir()
    done = subprocess.run([unshare, "--mount", "--propagation", "private", *userns, "/bin/sh", "-c", ETC_MOUNTS,
                           "sh", str(scratch), *argv], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 and "mount" in done.stderr and not done.stdout:
        pytest.skip(f"cannot make a private mount namespace with an /etc overlay here: {done.stderr.strip()}")
    return done


@needs_bwrap
def test_mounts_under_etc_are_not_visible_to_scripts_or_the_workspace_tools(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    reader = write_skill(tmp_path / "skills", "sslreader", extra="fs_read: [/etc/ssl/mounted]",
                         scripts={"read.sh": "cat /etc/ssl/mounted/extra.key\n"})
    done = in_private_mount_namespace(tmp_path, [sys.executable, "-c", ETC_PROBE, str(workspace), str(reader)])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["host_sees"] == "KEY-SECRET-1" and seen["mode"] == "bwrap"  # the mounts are there, outside
    assert "KEY-SECRET" not in seen["cat"] and "No such file or directory" in seen["cat"], seen["cat"]
    assert "KEY-SECRET" not in seen["read"] and "No such file or directory" in seen["read"], seen["read"]
    listed = seen["ls"].split()
    assert "passwd" in listed and "ssl" in listed
    for hidden in ("robot-lab", "shadow", "gshadow", "sudoers", "ssh", "fstab", "hostname", "machine-id"):
        assert hidden not in listed, seen["ls"]
    assert "robot-lab" not in seen["list"] and "shadow" not in seen["list"] and "mounted/" not in seen["list"]
    assert seen["granted"] == "KEY-SECRET-2"  # what the operator grants is seen, mount or not


@needs_bwrap
def test_interpreters_and_office_start_with_the_narrow_etc(tmp_path: Path) -> None:
    tools = {t.name: t for t in workspace_tools(tmp_path, sandbox=SandboxSettings(timeout=120))}
    run = tools["run_command"]
    named = run.call({"command": "python -c 'import ssl, pwd, os; print(pwd.getpwuid(os.getuid()).pw_name, "
                                 "ssl.create_default_context().cert_store_stats()[\"x509_ca\"] > 0)'"})
    assert named == f"{pwd.getpwuid(os.getuid()).pw_name} True", named  # users and CA certificates are there
    assert run.call({"command": "id -un && ls /etc/ssl/certs | head -1 >/dev/null && echo ok"}).endswith("ok")
    if shutil.which("node"):
        assert run.call({"command": "node -e 'console.log(1 + 1)'"}) == "2"
    if shutil.which("soffice"):
        out = run.call({"command": "printf 'a,b\\n1,2\\n' > t.csv && soffice --headless --convert-to xlsx t.csv "
                                   ">/dev/null 2>&1; ls t.xlsx"})
        assert out.startswith("t.xlsx"), out


PTRACE = """
import ctypes, ctypes.util, os
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
PTRACE_ATTACH = 16
result = libc.ptrace(PTRACE_ATTACH, 1, None, None)
print("ptrace", result, os.strerror(ctypes.get_errno()) if result != 0 else "attached")
"""


@needs_bwrap
def test_ptrace_of_the_sandboxs_init_fails_fast(tmp_path: Path) -> None:
    sandbox = SandboxSettings(timeout=30)
    directory = write_skill(tmp_path, "tracer", scripts={"trace.py": PTRACE})
    tool = tools_of(directory, sandbox)["trace"]
    assert tool.call({}) == "ptrace -1 Operation not permitted"
    assert tool.last_outcome is not None and tool.last_outcome.mode == "bwrap" and not tool.last_outcome.timed_out


@needs_bwrap
def test_an_etc_file_off_the_list_is_seen_only_when_granted(tmp_path: Path) -> None:
    target = next((p for p in ("/etc/hostname", "/etc/shells", "/etc/fstab") if os.path.isfile(p)), None)
    if target is None:
        pytest.skip("no /etc file off the list to grant on this machine")
    directory = write_skill(tmp_path, "etcreader", scripts={"peek.sh": f"cat {target} >/dev/null && echo seen\n"},
                            extra=f"fs_read: [{target}]")
    assert "No such file or directory" in tools_of(directory, SandboxSettings())["peek"].call({})
    assert tools_of(directory, SandboxSettings(fs_read=[target]))["peek"].call({}) == "seen"
