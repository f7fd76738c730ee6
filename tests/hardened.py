"""The hardened test profile: the process-level tests run in the deployment docs/security.md
and deploy/k8s describe (``pytest --profile=hardened``; docs/contributing.md).

What it changes, for every Python process a test starts on the test Redis:

* Redis credentials per role: the process logs in as the user ``robot-lab acl --apply`` made
  for it -- ``rl-worker-<robot>`` for ``robot-lab worker <robot>`` (and ``rq worker
  robot:<robot>``, ``tests.busproc worker``), ``rl-pub-<name>`` for ``robot-lab send --from
  <name>`` and ``tests.busproc publish``, ``rl-coordinator`` for everything else
  (``run``, ``status``, ``answer``, the A2A tier, a test's own coordinator script). The admin
  (``default``) user has a password that only the test process holds, so a process that
  slips past this logs in as nobody rather than as an all-powerful user.
* ``signing.verify=require`` with every sender's key in a keys directory, mounted read-only at
  ``/etc/robot-lab/keys`` (where deploy/k8s mounts the Secret) inside a private mount
  namespace of the process: ``/etc`` is an overlay there, so the host's ``/etc`` is never
  written.
* the skill sandbox on (bwrap, ``sandbox.when_unavailable=refuse``).

The one place that applies it is :func:`boot`, run by ``tests/hardened_boot/sitecustomize.py``
as each child Python process starts (the profile puts that folder on ``PYTHONPATH``), so a
process started by ``Processes.start``, ``subprocess.run`` or ``Popen`` gets its role from
its own command line, and a test written once runs in both profiles. A worker started for
several robots becomes one worker process per robot (deploy runs one Deployment per robot;
a single Redis user cannot be several robots'), supervised by :func:`split_worker`.

Deviations from production, each for a reason: every process gets every sender's keys (a
worker verifies all senders; a publisher's ``send --wait`` verifies the robot's reply);
``signing.reload_interval`` is 0.5 s because a robot's key is made as its worker starts (robot
names are per test), where production mounts them all first -- shorter than any process takes
to start and send, longer than a reread per signature (10 ms with a few hundred keys); the test process itself stays
the admin user (it observes and cleans up) and signs with the keys directory.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
BOOT_DIR = Path(__file__).resolve().parent / "hardened_boot"
STATE_ENV = "RL_TEST_PROFILE_STATE"  # not ROBOT_LAB_*: settings would flag an unknown variable
KEYS_MOUNT = "/etc/robot-lab/keys"
PROFILES = ("default", "hardened")
# Known holes the hardened profile shows, being fixed, are marked xfail_hardened on their
# tests with the reason as a constant here (delete the mark, then the constant, once the fix
# lands). None open now.
# senders with a key from the start: the job signer, the A2A tier, `robot-lab send`'s and
# Bus.publish's default names, and the sender most tests use
COMMON_SENDERS = ("coordinator", "a2a", "cli", "anonymous", "client")
# settings every process of the profile runs with (on top of what the test set)
PROFILE_SETTINGS = {
    "ROBOT_LAB_SIGNING__VERIFY": "require",
    "ROBOT_LAB_SIGNING__RELOAD_INTERVAL": "0.5",
    "ROBOT_LAB_SANDBOX__ENABLED": "true",
    "ROBOT_LAB_SANDBOX__WHEN_UNAVAILABLE": "refuse",
}


@dataclass
class State:
    """What the test process hands its children (a JSON file named by ``$RL_TEST_PROFILE_STATE``)."""

    admin_url: str
    keys_dir: str
    passwords_dir: str
    work_dir: str
    redis_cli_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def roles_log(self) -> Path:
        return Path(self.work_dir) / "roles.log"

    def save(self) -> Path:
        path = Path(self.work_dir) / "state.json"
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: str) -> State:
        return cls(**json.loads(Path(path).read_text()))


# ---------------------------------------------------------------- the test process's side

def prepare(admin_url: str) -> State:
    """Make the session's keys and passwords folders and the state file; point this process
    (the observer) at the keys, and its children at :func:`boot`."""
    work = Path(tempfile.mkdtemp(prefix="robot-lab-hardened-"))
    state = State(admin_url=admin_url, keys_dir=str(work / "keys"), passwords_dir=str(work / "passwords"),
                  work_dir=str(work))
    for sub in ("keys", "passwords", "ns", "applied"):
        (work / sub).mkdir(mode=0o700)
    for sender in COMMON_SENDERS:
        ensure_key(Path(state.keys_dir), sender)
    os.environ[STATE_ENV] = str(state.save())
    os.environ.update(PROFILE_SETTINGS)
    os.environ["ROBOT_LAB_SIGNING__KEYS_DIR"] = state.keys_dir
    os.environ["PYTHONPATH"] = child_pythonpath(os.environ.get("PYTHONPATH", ""))
    return state


def sender_keys(*senders: str) -> None:
    """Keys for senders a test sends as from its own process (``Bus.request(..., from_="asker")``),
    made in the profile's keys folder before they are used; nothing in the default profile,
    where nothing is signed."""
    path = os.environ.get(STATE_ENV)
    if path:
        keys = Path(State.load(path).keys_dir)
        for sender in senders:
            ensure_key(keys, sender)


def child_pythonpath(rest: str = "") -> str:
    """``PYTHONPATH`` of a child process: the repository, and under the hardened profile first
    the folder whose ``sitecustomize`` runs :func:`boot`."""
    parts = [str(REPO_ROOT)] + [p for p in rest.split(os.pathsep) if p and p not in (str(REPO_ROOT), str(BOOT_DIR))]
    if os.environ.get(STATE_ENV):
        parts.insert(0, str(BOOT_DIR))
    return os.pathsep.join(parts)


def unavailable(redis_server: str | None) -> str:
    """Why the hardened profile cannot run here ('' when it can): Redis 7 for ACL key
    selectors, a working bwrap, and a private mount namespace for the keys mount."""
    if not redis_server:
        return "no redis-server binary (the profile starts a private server with ACL users)"
    out = subprocess.run([redis_server, "--version"], capture_output=True, text=True).stdout
    version = out.split("v=", 1)[-1].split()[0] if "v=" in out else "0"
    if int(version.split(".")[0] or 0) < 7:
        return f"redis-server {version}: ACL key selectors need Redis >= 7"
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "bwrap is not installed (the skill sandbox; .ci/run installs bubblewrap)"
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bwrap cannot make a sandbox here: {probe.stderr.strip()[:200]}"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys").mkdir()
        (Path(tmp) / "keys" / "probe").write_text("ok")
        (Path(tmp) / "ns").mkdir()
        code = ("import sys; from tests.hardened import enter_namespace; enter_namespace(sys.argv[1], sys.argv[2]); "
                f"print(open({KEYS_MOUNT + '/probe'!r}).read())")
        probe = subprocess.run([sys.executable, "-c", code, str(Path(tmp) / "keys"), str(Path(tmp) / "ns")],
                               capture_output=True, text=True, cwd=REPO_ROOT)
    if probe.stdout.strip() != "ok":
        return ("cannot mount the signing keys at /etc/robot-lab/keys in a private mount namespace (needs root or "
                f"CAP_SYS_ADMIN and overlayfs): {(probe.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    return ""


def select(items: list[Any], config: Any, reason: str) -> None:
    """Under ``--profile=hardened``: keep only the process-level tests (``*_procs.py`` files and
    tests marked ``e2e``), skip them all with ``reason`` when the profile cannot run here,
    honour ``not_hardened`` (skip, with why) and ``xfail_hardened`` (a known hole being fixed:
    xfail, not strict)."""
    import pytest

    if config.getoption("profile") != "hardened":
        return
    keep, drop = [], []
    for item in items:
        (keep if is_process_level(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    for item in keep:
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"hardened profile unavailable: {reason}"))
            continue
        skip = item.get_closest_marker("not_hardened")
        if skip is not None:
            item.add_marker(pytest.mark.skip(reason=f"not in the hardened profile: {_reason(skip)}"))
        known = item.get_closest_marker("xfail_hardened")
        if known is not None:
            item.add_marker(pytest.mark.xfail(reason=f"hardened profile, known hole: {_reason(known)}", strict=False))


def acl_denials(admin_url: str, reset: bool = False) -> list[str]:
    """What Redis refused the profile's users since the last reset (``ACL LOG``: user, command,
    key or channel), one line each, newest first; with ``reset`` the log is emptied after."""
    import redis

    admin = redis.Redis.from_url(admin_url, decode_responses=True)
    try:
        entries = admin.acl_log(50)
        if reset:
            admin.acl_log_reset()
    except redis.RedisError as exc:
        return [f"(ACL LOG unreadable: {exc})"]
    finally:
        admin.close()
    return [f"{e.get('username')} {e.get('reason')} {e.get('object')} (context {e.get('context')}, "
            f"{e.get('count')}x)" for e in entries]


def is_process_level(item: Any) -> bool:
    return item.path.name.endswith("_procs.py") or item.get_closest_marker("e2e") is not None


def _reason(marker: Any) -> str:
    text = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    if not text:
        raise ValueError(f"{marker.name} needs a reason: say why the test does not apply in the hardened profile")
    return str(text)


# ---------------------------------------------------------------- the child process's side

@dataclass(frozen=True)
class Role:
    """Who a process is: ``worker`` (of ``names[0]``), ``publisher`` (``names[0]``),
    ``coordinator``, or ``split`` (a worker for several robots, ``names``)."""

    kind: str
    names: tuple[str, ...] = ()

    def acl_args(self) -> list[str]:
        """``robot-lab acl`` arguments that make this role's user."""
        if self.kind == "worker":
            return ["--robot", self.names[0], "--no-coordinator"]
        if self.kind == "publisher":
            return ["--publisher", self.names[0], "--no-coordinator"]
        return ["--publisher", "hardened-profile", "--coordinator"]  # acl wants a name: one no process uses

    @property
    def user(self) -> str:
        return {"worker": f"rl-worker-{self.names[0] if self.names else ''}",
                "publisher": f"rl-pub-{self.names[0] if self.names else ''}"}.get(self.kind, "rl-coordinator")


def _program(argv: list[str]) -> list[str]:
    """The command line without the interpreter: ``[robot-lab, worker, ...]``,
    ``[-m, tests.busproc, ...]`` or ``[script.py, ...]``."""
    args = list(argv[1:]) if argv and Path(argv[0]).name.startswith("python") else list(argv)
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args.pop(0)  # interpreter flags (-u, -X ...)
    return args


def _worker_robots(args: list[str]) -> list[str]:
    """The robot names of ``robot-lab worker`` arguments (positionals; options with values skipped)."""
    from robot_lab.commands.worker import worker  # click only: cheap

    takes_value = {name for p in worker.params if getattr(p, "opts", None) and not getattr(p, "is_flag", False)
                   and p.param_type_name == "option" for name in p.opts}
    robots, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            i += 2 if arg in takes_value else 1
            continue
        robots.append(arg)
        i += 1
    return robots


def role_of(argv: list[str]) -> Role:
    """The role of a process from its command line (module docstring)."""
    args = _program(argv)
    if not args:
        return Role("coordinator")
    head = Path(args[0]).name
    if head == "-m" and len(args) > 1:
        module, rest = args[1], args[2:]
        if module == "tests.busproc" and rest[:1] == ["worker"] and len(rest) >= 3:
            return Role("worker", (rest[2],))
        if module == "tests.busproc" and rest[:1] == ["publish"]:
            return Role("publisher", ("anonymous",))
        return Role("coordinator")
    rest = args[1:]
    if head == "otel_proc.py" and len(rest) > 1:  # tests/otel_proc.py SPANS_FILE <robot-lab arguments>
        head, rest = "robot-lab", rest[1:]
    if head == "robot-lab" and rest:
        if rest[0] == "worker":
            robots = _worker_robots(rest[1:])
            if "--spawned" in rest or not robots:
                return Role("coordinator")  # docs/security.md: `worker --spawned` needs the coordinator user
            return Role("worker", (robots[0],)) if len(robots) == 1 else Role("split", tuple(robots))
        if rest[0] == "send":
            sender = "cli"
            for i, arg in enumerate(rest):
                if arg == "--from" and i + 1 < len(rest):
                    sender = rest[i + 1]
                elif arg.startswith("--from="):
                    sender = arg.split("=", 1)[1]
            return Role("publisher", (sender,))
    if head == "rq" and rest[:1] == ["worker"]:
        queues = [a for a in rest[1:] if a.startswith("robot:")]
        if len(queues) == 1:
            return Role("worker", (queues[0].split(":", 1)[1],))
    return Role("coordinator")


def ensure_key(keys_dir: Path, sender: str) -> None:
    """A signing key for ``sender`` (``<keys_dir>/<sender>/k1``), made once, atomically."""
    folder = keys_dir / sender
    if (folder / "k1").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".k1.{os.getpid()}"
    tmp.write_text(secrets.token_hex(32))
    os.replace(tmp, folder / "k1")


def _password(state: State, user: str) -> str:
    return (Path(state.passwords_dir) / user).read_text().strip()


def ensure_user(state: State, prefix: str, role: Role) -> str:
    """The role's Redis user under ``prefix``, made by ``robot-lab acl --apply`` as the admin
    (again only when it was last made for another prefix); returns its password.

    ``robot-lab acl`` names users by role, not by key prefix, and applying resets a user to one
    prefix; a test that starts a second deployment beside a running one (another prefix, same
    Redis) would take the first one's keys from its processes. So the user keeps, besides what
    acl made for ``prefix``, the key and channel rules acl makes for each prefix it was made
    for earlier in the session (:func:`_keep_earlier_prefixes`)."""
    marker = Path(state.work_dir) / "applied" / role.user
    earlier = marker.read_text().split() if marker.exists() else []
    if earlier[-1:] != [prefix]:
        env = {k: v for k, v in os.environ.items() if k != STATE_ENV and not k.startswith("ROBOT_LAB_ACL_PASSWORD_")}
        env.update(REDIS_URL=state.admin_url, ROBOT_LAB_KEY_PREFIX=prefix,
                   PYTHONPATH=os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                              if p != str(BOOT_DIR)))
        cli = Path(sys.executable).parent / "robot-lab"
        done = subprocess.run([str(cli), "acl", "--apply", *role.acl_args(), "--passwords-dir", state.passwords_dir],
                              env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SystemExit(f"hardened profile: robot-lab acl --apply {' '.join(role.acl_args())} failed: "
                             f"{done.stderr.strip() or done.stdout.strip()}")
        others = [p for p in earlier if p != prefix]
        if others:
            _keep_earlier_prefixes(state, role, others)
        marker.write_text(" ".join([*others, prefix]))
    return _password(state, role.user)


def _keep_earlier_prefixes(state: State, role: Role, prefixes: list[str]) -> None:
    """Add to the role's user the key and channel rules ``robot-lab acl`` makes for each of
    ``prefixes`` (ACL SETUSER without ``reset`` adds)."""
    import redis

    from robot_lab.keys import Keys
    from robot_lab.workers.acl_users import acl_users

    admin = redis.Redis.from_url(state.admin_url)
    try:
        for prefix in prefixes:
            robots = role.names[:1] if role.kind == "worker" else ()
            publishers = role.names[:1] if role.kind == "publisher" else ()
            [user] = [u for u in acl_users(Keys(prefix=prefix), robots, publishers, coordinator=role.kind == "coordinator")
                      if u.user == role.user]
            admin.execute_command("ACL", "SETUSER", user.user, *[r for r in user.rules if r[:1] in "~%&("])
    finally:
        admin.close()


def redact(url: str) -> str:
    """``url`` without its password (for headers and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    creds, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{creds.split(':', 1)[0]}:***@{host}"))


def user_url(admin_url: str, user: str, password: str) -> str:
    """``admin_url`` with ``user:password`` as its credentials."""
    parts = urlsplit(admin_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


_libc: Any = None
CLONE_NEWNS, MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 1, 32, 4096, 16384, 1 << 18


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def enter_namespace(keys_dir: str, scratch: str) -> None:
    """Move this (single-threaded) process into a private mount namespace where ``/etc`` is an
    overlay of the host's (writes go to a tmpfs on ``scratch``) and ``keys_dir`` is mounted
    read-only at ``/etc/robot-lab/keys``, as deploy/k8s mounts the signing-keys Secret. The
    host's mounts and files are untouched. Mounts under the host's ``/etc`` are carried over."""
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    submounts = sorted({line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                        if line.split()[4].startswith("/etc/")})
    _mount("tmpfs", scratch, "tmpfs", 0, "mode=0700")
    for sub in ("upper", "work", "hold"):
        os.mkdir(os.path.join(scratch, sub))
    held = []
    for i, point in enumerate(submounts):  # e.g. a container's /etc/hosts: keep it visible
        hold = os.path.join(scratch, "hold", str(i))
        if os.path.isdir(point):
            os.mkdir(hold)
        else:
            Path(hold).touch()
        _mount(point, hold, None, MS_BIND | MS_REC)
        held.append((hold, point))
    _mount("overlay", "/etc", "overlay", 0,
           f"lowerdir=/etc,upperdir={scratch}/upper,workdir={scratch}/work")
    for hold, point in held:
        _mount(hold, point, None, MS_BIND | MS_REC)
    os.makedirs(KEYS_MOUNT, exist_ok=True)
    _mount(keys_dir, KEYS_MOUNT, None, MS_BIND)
    _mount("none", KEYS_MOUNT, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _on_test_redis(state: State) -> bool:
    """Whether this process was pointed at the profile's server (REDIS_URL or ``--url``)."""
    urls = [os.environ.get("REDIS_URL", "")] + [a.split("=", 1)[-1] for a in sys.argv if "redis" in a]
    urls += [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a in ("--url", "-u")]
    return state.admin_url in urls


def boot() -> None:
    """Apply the profile to this process as it starts (``tests/hardened_boot/sitecustomize.py``):
    its role's Redis user (made by ``robot-lab acl --apply``), its signing keys, the settings
    of :data:`PROFILE_SETTINGS`, the keys mount in a private mount namespace. A process not
    pointed at the profile's Redis, and the supervisor of a split worker, are left alone."""
    path = os.environ.get(STATE_ENV)
    if not path or not os.path.exists(path):
        return
    state = State.load(path)
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if "tests.hardened" in argv or not _on_test_redis(state):
        return
    role = role_of(argv)
    if role.kind == "split":
        os.execv(sys.executable, [sys.executable, "-m", "tests.hardened", "split", *argv])
    prefix = os.environ.get("ROBOT_LAB_KEY_PREFIX", "robot_lab")
    keys = Path(state.keys_dir)
    for name in role.names:
        ensure_key(keys, name)
    password = ensure_user(state, prefix, role)
    url = user_url(state.admin_url, role.user, password)
    os.environ["REDIS_URL"] = url
    sys.argv[:] = [url if a == state.admin_url else a.replace(f"={state.admin_url}", f"={url}") for a in sys.argv]
    os.environ.update(PROFILE_SETTINGS)
    os.environ["ROBOT_LAB_SIGNING__KEYS_DIR"] = KEYS_MOUNT
    enter_namespace(state.keys_dir, str(Path(state.work_dir) / "ns"))
    with open(state.roles_log, "a") as log:
        log.write(f"{os.getpid()} {role.user} prefix={prefix} {' '.join(_program(argv))[:300]}\n")


def split_worker(argv: list[str]) -> int:
    """``robot-lab worker a b c`` as one ``robot-lab worker <robot>`` process per robot (each
    booted with its own user), killed with this process: SIGTERM and SIGINT are passed on,
    and the exit status is the first non-zero one of the children."""
    import robot_lab.commands.worker  # noqa: F401  (fail here, not in every child, if it cannot load)

    args = _program(argv)
    at = args.index("worker")
    robots = _worker_robots(args[at + 1:])
    options = [a for a in args[at + 1:] if a not in robots]
    prog = args[0] if Path(args[0]).is_absolute() else shutil.which(args[0]) or args[0]
    pdeathsig = ctypes.CDLL(None, use_errno=True).prctl

    def die_with_parent() -> None:
        pdeathsig(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a kill -9 of this process kills the robots' workers

    children = [subprocess.Popen([prog, "worker", robot, *options], preexec_fn=die_with_parent) for robot in robots]

    def forward(signum: int, _frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["split"]:
        raise SystemExit(split_worker(sys.argv[2:]))
    raise SystemExit(f"usage: python -m tests.hardened split ARGV...; got {sys.argv[1:]}")
