"""Running one skill script: under ``bwrap`` on Linux, with a timeout and an output cap.

robot_lab core runs scripts unconfined with no timeout; its optional ``robot_lab-sandbox``
gem confines them with Seatbelt on macOS only. robot-lab is a server-side runtime, so the
Linux confinement is built in, with bubblewrap:

* read-only: the system dirs (``/usr``, ``/bin``, ``/lib*``), of ``/etc`` only the entries
  programs need (:data:`ETC_ENTRIES`, nothing mounted under them), the skill's own directory,
  the Python running robot-lab (for ``.py`` scripts without a shebang), and every granted
  ``fs_read`` path;
* writable: the granted ``fs_write`` paths only;
* a private ``/tmp`` (also the script's ``HOME``, bounded by ``sandbox.tmp_max_bytes``),
  fresh ``/proc`` and ``/dev``, no ``$HOME``;
* no capabilities, and no ``ptrace`` (:mod:`robot_lab.sandbox.seccomp`);
* new user/pid/ipc/uts/cgroup namespaces, and a new network namespace (loopback only)
  unless network was granted by both the skill and the ceiling;
* an environment holding only ``PATH``, ``HOME``, ``LANG``, ``TMPDIR`` and the variables
  and secrets the skill asked for *and* the operator's ceiling allows;
* process and memory limits (:mod:`robot_lab.sandbox.limits`).

Whatever the mode, the script runs in its own process group that is killed (SIGKILL) at the
timeout and again after it exits (stray children); unconfined calls also kill every process
carrying the call's token (:mod:`robot_lab.sandbox.reaper`) and, where one can be made, every
member of the call's pids cgroup, so a ``setsid`` child does not outlive the call. Output
past ``max_output_bytes`` is dropped. Failures are text for the model: ``Error (exit N):``,
``Error (timed out):``, followed by the limits in force when one of them was likely hit.
"""

from __future__ import annotations

import glob
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from robot_lab.errors import SandboxError
from robot_lab.logging import declare_secret, get_logger
from robot_lab.settings import get_settings
from robot_lab.sandbox import reaper, seccomp
from robot_lab.sandbox.capabilities import Capabilities, is_under
from robot_lab.sandbox.limits import CallCgroup, Limits, rlimit_prefix
from robot_lab.sandbox.quota import Quota

log = get_logger("robot_lab.sandbox.sandbox")

SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a script sees: what programs read to start (the loader's cache, the
# alternatives links, interpreters' config), to name users and groups, and for
# certificates, fonts, locales and time zones. Never /etc whole: a deployment mounts its
# secrets there (deploy/k8s: the signing keys at /etc/robot-lab/keys), and anything
# mounted *under* a listed folder is masked too (:func:`etc_mounts`). Shell patterns.
ETC_ENTRIES = (
    "passwd", "group", "nsswitch.conf", "hosts", "services", "protocols", "networks",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives",
    "localtime", "timezone", "locale.alias", "locale.conf", "default/locale",
    "ssl", "ca-certificates", "ca-certificates.conf", "pki", "crypto-policies",
    "fonts", "libreoffice", "papersize", "java-*", "python3*", "perl", "ImageMagick-*",
    "mime.types", "mailcap", "magic", "magic.mime", "xml", "sgml", "terminfo", "inputrc",
    "os-release", "lsb-release", "debian_version", "mtab", "gitconfig", "npmrc", "pip.conf", "matplotlibrc",
)
# Only when the call has the network: the resolver's configuration.
ETC_NETWORK = ("resolv.conf", "host.conf", "gai.conf")
# Private keys inside a listed folder, masked by an empty tmpfs.
MASKED_DIRS = ("/etc/ssl/private", "/etc/pki/tls/private", "/etc/pki/CA/private")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_probe_lock = threading.Lock()
_probe: tuple[bool, str] | None = None
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Outcome:
    """What came of one script run."""

    output: str
    returncode: int | None  # None: killed at the timeout
    timed_out: bool
    truncated: bool
    mode: str  # "bwrap" | "unconfined" | "refused"
    elapsed: float
    note: str = ""  # the limits in force, when the failure looks like one was hit

    def text(self, timeout: float | None = None) -> str:
        """The Ruby gem's ``format_result``: the output, or an ``Error (...)`` text for the model."""
        body = self._text(timeout)
        return f"{body}\n{self.note}" if self.note else body

    def _text(self, timeout: float | None) -> str:
        if self.mode == "refused":
            return self.output
        if self.timed_out:
            limit = f"{timeout:g}s" if timeout is not None else "the timeout"
            body = f"{self.output}\n" if self.output else ""
            return f"Error (timed out):\n{body}[killed: exceeded {limit}]"
        if self.returncode == 0:
            return self.output if self.output.strip() else "(the script succeeded and printed nothing)"
        signum = killed_by(self.returncode)
        if signum is not None:
            return f"Error (killed by signal {signum}, {_signal_name(signum)}):\n{self.output or '(no output)'}"
        return f"Error (exit {self.returncode}):\n{self.output or '(no output)'}"


def killed_by(returncode: int | None) -> int | None:
    """The signal that ended a script: a negative return code, or the shell and bwrap
    convention 128+N (``exit 143`` is SIGTERM) for the signals a script is killed with."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if returncode - 128 in (signal.SIGHUP, signal.SIGINT, signal.SIGKILL, signal.SIGSEGV, signal.SIGPIPE,
                            signal.SIGTERM, signal.SIGABRT, signal.SIGXCPU):
        return returncode - 128
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --- availability ---------------------------------------------------------------------


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_status(refresh: bool = False) -> tuple[bool, str]:
    """Whether ``bwrap`` exists *and* can create the namespaces we use here, and why not.

    Probed once per process (a container may ship bwrap but forbid user namespaces).
    """
    global _probe
    with _probe_lock:
        if _probe is not None and not refresh:
            return _probe
        exe = bwrap_path()
        if exe is None:
            _probe = (False, "bwrap is not installed (apt-get install bubblewrap)")
            return _probe
        cmd = [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
               "--dev", "/dev", "--tmpfs", "/tmp", "true"]
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _probe = (False, f"bwrap could not be started: {exc}")
            return _probe
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
            _probe = (False, f"bwrap cannot create namespaces on this machine: {err}")
        else:
            _probe = (True, f"bwrap at {exe}")
        return _probe


_sizes_tmpfs: bool | None = None


def bwrap_sizes_tmpfs() -> bool:
    """Whether this bwrap can bound a tmpfs (``--size``, bubblewrap 0.8 and later), from its
    ``--help``, read once per process; a warning when it cannot (/tmp is then unbounded)."""
    global _sizes_tmpfs
    if _sizes_tmpfs is None:
        exe = bwrap_path()
        try:
            done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=15,
                                  stdin=subprocess.DEVNULL) if exe else None
        except (OSError, subprocess.TimeoutExpired):
            done = None
        _sizes_tmpfs = done is not None and "--size " in done.stdout + done.stderr
        if exe and not _sizes_tmpfs:
            log.warning("sandbox.tmp_unbounded", bwrap=exe,
                        note="this bwrap has no --size: the sandbox's /tmp is not bounded by sandbox.tmp_max_bytes")
    return _sizes_tmpfs


# --- environment ------------------------------------------------------------------------


def script_env(grant: Capabilities, *, home: str = "/tmp", parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The scrubbed environment: a fixed base plus what the skill declared.

    ``env: [NAME]`` passes the parent's value through, ``env: {NAME: value}`` sets it;
    ``secrets: [NAME]`` passes the parent's value and masks it in every later log line.
    """
    parent = os.environ if parent is None else parent
    env = {"PATH": SAFE_PATH, "HOME": home, "TMPDIR": "/tmp", "LANG": parent.get("LANG", "C.UTF-8") or "C.UTF-8"}
    for name, value in grant.env.items():
        if value is not None:
            env[name] = value
        elif name in parent:
            env[name] = parent[name]
    for name in grant.secrets:
        if name in parent:
            env[name] = parent[name]
            declare_secret(parent[name])
    return env


# --- the bwrap command line -------------------------------------------------------------


def python_executable(exe: str | None = None) -> str:
    """``exe`` (default: the Python running robot-lab) with its folder resolved.

    The folder is made absolute with ``..`` and symlinks resolved, so the path exists as
    written inside bwrap (which binds real paths); the file name is kept, because a venv's
    ``bin/python`` is a symlink whose own location is what makes it the venv's Python.
    """
    exe = exe or sys.executable
    if os.sep not in exe:
        exe = shutil.which(exe) or exe
    exe = os.path.abspath(os.path.expanduser(exe))
    return os.path.join(os.path.realpath(os.path.dirname(exe)), os.path.basename(exe))


_roots_cache: dict[str, list[str]] = {}


def python_roots(python: str | None = None) -> list[str]:
    """The folders a Python needs to start (its venv and base installation), real paths.

    For the interpreter running robot-lab they come from ``sys``; another one (a configured
    ``skills.python``) is asked once per process.
    """
    exe = python or sys.executable
    cached = _roots_cache.get(exe)
    if cached is not None:
        return cached
    if python is None or os.path.realpath(exe) == os.path.realpath(sys.executable) and \
            os.path.realpath(os.path.dirname(exe)) == os.path.realpath(os.path.dirname(sys.executable)):
        roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    else:
        try:
            done = subprocess.run(
                [exe, "-c", "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix); "
                            "print(sys.base_exec_prefix)"],
                capture_output=True, timeout=15, stdin=subprocess.DEVNULL, text=True,
            )
            roots = set(done.stdout.split("\n")) if done.returncode == 0 else set()
        except (OSError, subprocess.TimeoutExpired):
            roots = set()
    roots.add(os.path.dirname(os.path.realpath(os.path.dirname(exe))))  # the venv holding bin/python
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(exe))))  # the installation it links to
    found = sorted(r for r in {os.path.realpath(r.strip()) for r in roots if r.strip()}
                   if r and r != "/" and os.path.isdir(r))
    _roots_cache[exe] = found
    return found


def _is_system(path: str, etc: Sequence[str] = ()) -> bool:
    return any(path == d or path.startswith(d + "/") for d in (*SYSTEM_RO, *etc))


def _mount_points() -> list[str]:
    """Every mount point of this process's mount namespace (``/proc/self/mountinfo``)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # octal escapes: \040 is a space
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def etc_entries(network: bool) -> list[str]:
    """The /etc paths a script sees (:data:`ETC_ENTRIES`, plus :data:`ETC_NETWORK` with
    the network), those that exist here, sorted."""
    found: set[str] = set()
    for pattern in (*ETC_ENTRIES, *(ETC_NETWORK if network else ())):
        found.update(glob.glob(os.path.join("/etc", pattern)))
    return sorted(found)


def etc_mounts(entries: Sequence[str]) -> list[str]:
    """Mount points strictly under a listed /etc folder (a Secret mounted into
    ``/etc/ssl/...``): bwrap binds recursively, so each is masked by an empty tmpfs or
    ``/dev/null``. A listed entry that is a mount point itself (Docker's /etc/hosts) is fine."""
    folders = [e for e in entries if os.path.isdir(e) and not os.path.islink(e)]
    return sorted({p for p in _mount_points() for f in folders if p.startswith(f + "/")})


def bwrap_argv(
    command: Sequence[str],
    grant: Capabilities,
    *,
    skill_dir: str,
    cwd: str,
    extra_ro: Sequence[str] = (),
    extra_rw: Sequence[str] = (),
    exe: str | None = None,
    seccomp_fd: int | None = None,
    tmp_bytes: int = 0,
) -> list[str]:
    """The ``bwrap`` command line that confines ``command`` to ``grant``.

    ``seccomp_fd`` is an open file holding the filter of :mod:`robot_lab.sandbox.seccomp`
    (the caller passes it to the bwrap process): no ptrace inside the sandbox.
    ``tmp_bytes`` bounds the private ``/tmp`` (a tmpfs: memory, counted by no other limit).

    Mount order matters (later mounts shadow earlier ones): system dirs, /proc, /dev, the
    private /tmp, then read-only paths, then writable ones, each sorted shallow-first so a
    writable directory inside a read-only one stays writable.
    """
    # --cap-drop ALL: a root worker's scripts would otherwise keep every capability
    argv: list[str] = [exe or bwrap_path() or "bwrap", "--die-with-parent", "--unshare-all", "--cap-drop", "ALL"]
    if grant.network:
        argv.append("--share-net")
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    etc = etc_entries(grant.network)
    for path in [*SYSTEM_RO, *etc]:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    hidden = etc_mounts(etc)
    for path in hidden:
        argv += ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
    for path in MASKED_DIRS:
        if os.path.isdir(path) and not os.path.islink(path) and _is_system(path, etc):
            argv += ["--tmpfs", path]
    if grant.network:
        for path in ("/run/systemd/resolve", "/run/resolvconf"):
            if os.path.isdir(path):
                argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_bytes and bwrap_sizes_tmpfs():
        argv += ["--size", str(tmp_bytes)]  # else the kernel's default: half the RAM
    argv += ["--tmpfs", "/tmp"]

    read_only = [skill_dir, *extra_ro, *grant.fs_read]
    binds: list[tuple[str, str]] = []
    seen: set[str] = set()
    for path in read_only:
        real = os.path.realpath(path)
        # a path the system binds already show is skipped, unless a mask hides it (an
        # operator who grants a file mounted under /etc/ssl gets it, bound over the mask)
        if real in seen or _is_system(real, etc) and not any(is_under(real, h) for h in hidden):
            continue
        if not os.path.exists(real):
            log.warning("sandbox.path_missing", path=real, access="read")
            continue
        seen.add(real)
        binds.append(("--ro-bind", real))
    for path in (*grant.fs_write, *extra_rw):
        real = os.path.realpath(path)
        if not os.path.exists(real):
            log.warning("sandbox.path_missing", path=real, access="write")
            continue
        binds.append(("--bind", real))
    binds.sort(key=lambda item: (item[1].count("/"), item[0] == "--bind"))
    for flag, path in binds:
        argv += [flag, path, path]
    argv += ["--chdir", cwd, "--"]
    argv += list(command)
    return argv


def choose_cwd(grant: Capabilities, skill_dir: str) -> str:
    """The caller's cwd when the grant covers it (scripts see the project), else the skill dir."""
    here = os.path.realpath(os.getcwd())
    for root in (*grant.fs_write, *grant.fs_read):
        if is_under(here, root):
            return here
    return skill_dir


# --- running --------------------------------------------------------------------------------


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def execute(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    timeout: float,
    max_output: int,
    mode: str,
    reap: Callable[[], object] | None = None,
    watch: Callable[[], str | None] | None = None,
    pass_fds: Sequence[int] = (),
) -> Outcome:
    """Run ``argv`` in a new process group; combined stdout+stderr, capped, bounded in time.

    Single-threaded: a selector reads the pipe until EOF, the deadline, or the process exit
    (a background child that keeps the pipe open does not hold the call until the timeout).
    ``reap`` kills what the process group misses (``setsid`` children), at the timeout and
    at the end. ``watch`` is polled about every 0.25 s; a reason it returns stops the script
    (the workspace quota) and becomes the outcome's note. ``pass_fds`` stay open in the
    child (bwrap's ``--seccomp FD``).
    """

    def kill_all(pgid: int) -> None:
        _kill_group(pgid)
        if reap is not None:
            reap()

    started = time.monotonic()
    deadline = started + timeout
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(env), cwd=cwd, start_new_session=True, pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        return Outcome(f"cannot start {argv[0]}: {exc.strerror or exc}", 127, False, False, mode,
                       time.monotonic() - started)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    kept = 0
    total = 0
    timed_out = False
    stopped: str | None = None
    watched = started
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                kill_all(proc.pid)
                break
            events = selector.select(min(remaining, 0.1))
            if watch is not None and time.monotonic() - watched >= 0.25:
                watched = time.monotonic()
                stopped = watch()
                if stopped:
                    kill_all(proc.pid)
                    break
            if not events:
                if proc.poll() is not None:
                    break  # exited; whatever still holds the pipe is a stray child
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                break
            total += len(data)
            if kept < max_output:
                piece = data[: max_output - kept]
                chunks.append(piece)
                kept += len(piece)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) if not timed_out else 5)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_all(proc.pid)
            proc.wait(timeout=5)
    finally:
        kill_all(proc.pid)  # stray children of a finished script, and every timed-out one
        selector.close()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    output = b"".join(chunks).decode("utf-8", errors="replace").rstrip("\n")
    truncated = total > kept
    if truncated:
        output += f"\n[output truncated: {total} bytes, first {kept} shown]"
    if stopped is None and watch is not None:
        stopped = watch()  # a script that filled it between two polls and exited
    return Outcome(output, None if timed_out else proc.returncode, timed_out, truncated, mode,
                   time.monotonic() - started, note=f"[the script was stopped: {stopped}]" if stopped else "")


_PROCESS_SIGNS = ("cannot fork", "can't fork", "resource temporarily unavailable", "blockingioerror",
                  "fork: retry", "pthread_create")
_MEMORY_SIGNS = ("memoryerror", "cannot allocate memory", "out of memory", "bad_alloc", "failed to allocate")


_NETWORK_RE = re.compile(
    r"network is unreachable|temporary failure in name resolution|name or service not known|could not resolve "
    r"host|\bgetaddrinfo\b|\benotfound\b|\beai_again\b|\benetunreach\b|failed to establish a new connection|"
    r"nodename nor servname|no address associated with hostname", re.I)


def network_note(outcome: Outcome, grant: Capabilities, label: str = "") -> str:
    """Said when a failed call without the network grant looks like it wanted the network."""
    if grant.network or (outcome.returncode == 0 and not outcome.timed_out) or outcome.mode == "refused":
        return ""
    if not _NETWORK_RE.search(outcome.output):  # FileNotFoundError is no ENOTFOUND: words only
        return ""
    skill = label.split("/", 1)[0] if "/" in label else ""
    grant_name = f"skills.grants.{skill}.network" if skill and skill != "workspace" else "skills.grants.<skill>.network"
    return (f"[no network in the sandbox: sandbox.network is false and {grant_name} is not set; "
            "the operator decides]")


def _limit_note(outcome: Outcome, limits: Limits, cgroup: CallCgroup | None) -> str:
    """The limits in force, appended when a failed call looks like it hit one of them."""
    if outcome.returncode == 0 and not outcome.timed_out:
        return ""
    lowered = outcome.output.lower()
    hit_processes = (cgroup is not None and cgroup.hit_limit()) or any(s in lowered for s in _PROCESS_SIGNS)
    hit_memory = any(s in lowered for s in _MEMORY_SIGNS)
    if not (hit_processes and limits.processes) and not (hit_memory and limits.memory_mb):
        return ""
    what = "process" if hit_processes and limits.processes else "memory"
    return f"[the script hit the {what} limit] {limits.note()}"


def run_script(
    command: Sequence[str],
    *,
    grant: Capabilities,
    skill_dir: str,
    sandbox: Any = None,
    python: str | None = None,
    workspace: str | None = None,
    label: str = "",
    extra_ro: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run a script command under the grant, choosing the mode from trust and settings.

    * ``trust: core`` *granted* (the operator named the skill in ``skills.core_trusted``):
      unconfined, the parent's environment; timeout, limits and cap still apply;
    * sandbox enabled and bwrap usable: confined by :func:`bwrap_argv`;
    * otherwise ``sandbox.when_unavailable``: ``refuse`` (an error text, nothing runs) or
      ``unconfined`` (a warning, scrubbed environment, timeout, limits and cap).

    ``python`` is the interpreter the command runs with (its folders are mounted read-only);
    ``workspace`` is the conversation's working directory: the script's cwd, mounted
    read-write, unless the operator turned workspaces off (``sandbox.workspace = false``).
    ``extra_ro`` are more folders mounted read-only (the bundles a workspace tool sees);
    ``extra_env`` is set over the scrubbed environment (``PYTHONPATH``, ``PATH``).
    """
    if sandbox is None:
        sandbox = get_settings().sandbox
    max_output = int(sandbox.max_output_bytes)
    skill_dir = os.path.realpath(skill_dir)
    if workspace is not None and not getattr(sandbox, "workspace", True):
        workspace = None
    if workspace is not None:
        workspace = os.path.realpath(workspace)
        os.makedirs(workspace, exist_ok=True)
    added = dict(extra_env or {})
    if grant.core:
        return _run_limited(command, env=dict(os.environ) | added, cwd=workspace or os.getcwd(), grant=grant,
                            sandbox=sandbox, max_output=max_output, confined=False, label=label,
                            workspace=workspace)
    if sandbox.enabled:
        usable, reason = bwrap_status()
    else:
        usable, reason = False, "sandboxing is disabled (settings.sandbox.enabled = false)"
    if usable:
        cwd = workspace or choose_cwd(grant, skill_dir)
        extra = python_roots(python) if python is not None else []
        inner = [*rlimit_prefix(Limits.from_sandbox(sandbox), nproc=True), *command]
        filter_fd = seccomp.program_fd()
        try:
            argv = bwrap_argv(inner, grant, skill_dir=skill_dir, cwd=cwd, extra_ro=[*extra, *extra_ro],
                              extra_rw=[workspace] if workspace else [], seccomp_fd=filter_fd,
                              tmp_bytes=int(getattr(sandbox, "tmp_max_bytes", 0) or 0))
            return _run_limited(argv, env=script_env(grant) | added, cwd=skill_dir, grant=grant, sandbox=sandbox,
                                max_output=max_output, confined=True, label=label,
                                workspace=workspace, pass_fds=(filter_fd,))
        finally:
            os.close(filter_fd)
    if sandbox.when_unavailable != "unconfined":
        log.warning("sandbox.refused", script=label, reason=reason)
        return Outcome(
            f"Error (sandbox unavailable): {reason}; the script was not run. "
            "Set sandbox.when_unavailable to 'unconfined' to run skill scripts without confinement.",
            None, False, False, "refused", 0.0,
        )
    if reason not in _warned:
        _warned.add(reason)
        log.warning("sandbox.unconfined", reason=reason, script=label,
                    note="skill scripts run WITHOUT confinement (sandbox.when_unavailable = unconfined)")
    home = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
    return _run_limited(command, env=script_env(grant, home=home) | {"TMPDIR": home} | added,
                        cwd=workspace or choose_cwd(grant, skill_dir), grant=grant, sandbox=sandbox,
                        max_output=max_output, confined=False, label=label, workspace=workspace)


def _run_limited(argv: Sequence[str], *, env: dict[str, str], cwd: str, grant: Capabilities, sandbox: Any,
                 max_output: int, confined: bool, label: str = "", workspace: str | None = None,
                 pass_fds: Sequence[int] = ()) -> Outcome:
    """:func:`execute` inside the call's pids cgroup (where one can be made) with its memory
    rlimit; an unconfined call also carries a reaper token, so that every process it
    started is killed at the end (bwrap's pid namespace does that for a confined one)."""
    limits = Limits.from_sandbox(sandbox)
    cgroup = CallCgroup.create(sandbox, limits)
    prefix = cgroup.join_prefix() if cgroup is not None else []
    token = None
    since = reaper.now_ticks() - 100  # a second of slack for clock rounding
    quota = Quota.of(workspace, sandbox)
    if not confined:
        token = reaper.new_token()
        env = env | {reaper.TOKEN_NAME: token}
        prefix += rlimit_prefix(limits, nproc=False)

    def reap() -> None:
        # the cgroup holds every process of the call: exact, and no /proc scan needed
        if cgroup is not None:
            cgroup.kill_all()
        elif token is not None:
            reaper.kill_call(token, since)

    try:
        outcome = execute([*prefix, *argv], env=env, cwd=cwd, timeout=grant.timeout, max_output=max_output,
                          mode="bwrap" if confined else "unconfined", reap=reap,
                          watch=quota.over if quota is not None else None, pass_fds=pass_fds)
        note = outcome.note or " ".join(n for n in (_limit_note(outcome, limits, cgroup),
                                                    _tmp_note(outcome, sandbox, confined),
                                                    network_note(outcome, grant, label)) if n)
    finally:
        if cgroup is not None:
            cgroup.remove()
    trimmed = quota.trim() if quota is not None else []
    if trimmed:
        note = f"{note}\n" if note else ""
        more = f" and {len(trimmed) - 10} more" if len(trimmed) > 10 else ""
        note += f"[removed to bring the working directory back under its quota: {', '.join(trimmed[:10])}{more}]"
    return replace(outcome, note=note) if note else outcome


def _tmp_note(outcome: Outcome, sandbox: Any, confined: bool) -> str:
    """Said when a confined call that ran out of space may have filled its bounded /tmp."""
    size = int(getattr(sandbox, "tmp_max_bytes", 0) or 0)
    if not confined or not size or "no space left on device" not in outcome.output.lower():
        return ""
    return f"[the sandbox's /tmp holds at most {size} bytes (sandbox.tmp_max_bytes)]"


def require_bwrap() -> str:
    """The bwrap path, or SandboxError saying why it cannot be used (for callers who insist)."""
    usable, reason = bwrap_status()
    if not usable:
        raise SandboxError(reason)
    return bwrap_path() or "bwrap"


__all__ = [
    "Outcome",
    "bwrap_argv",
    "bwrap_status",
    "execute",
    "require_bwrap",
    "run_script",
    "script_env",
]
