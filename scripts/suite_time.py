"""Time the test suite (the README's command, ``pytest``) twice: on the machine as it is, then
with CPU-bound hogs beside it; print both times, the summary lines and the load averages.

    .venv/bin/python scripts/suite_time.py                  # both runs, 2 hogs in the second
    .venv/bin/python scripts/suite_time.py --only loaded    # only the run beside the hogs
    .venv/bin/python scripts/suite_time.py -- -n 0          # extra pytest arguments after --

The README states the suite's time on 2 idle cores and under load; this is where those
figures come from. "Idle" is only as idle as the machine is: the load average printed before
each run says what else was running (a shared machine's neighbours count too). The hogs are
``python -c 'while True: pass'`` processes, one busy core each, stopped when the run ends.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOG = "while True: pass"
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*) in [\d.]+s.*$")


@dataclass
class Timing:
    """One run of the suite: its label, wall time, pytest's summary and the load around it."""

    label: str
    seconds: float
    summary: str
    exit_code: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    def line(self) -> str:
        minutes, seconds = divmod(round(self.seconds), 60)
        before = " ".join(f"{x:.1f}" for x in self.load_before)
        after = " ".join(f"{x:.1f}" for x in self.load_after)
        return (f"{self.label:<18} {minutes}:{seconds:02d}  {self.summary or f'exit {self.exit_code}'}"
                f"  (load before {before}, after {after})")


def run_suite(label: str, hogs: int, pytest_args: list[str]) -> Timing:
    """The suite once, in this checkout, with ``hogs`` busy processes beside it."""
    started_hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        load_before = os.getloadavg()
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                              cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - start
        load_after = os.getloadavg()
    finally:
        for hog in started_hogs:
            hog.kill()
            hog.wait()
    lines = [m.group(1) for m in map(SUMMARY.match, proc.stdout.splitlines()) if m]
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if failed:
        print("\n".join(failed), file=sys.stderr)
    return Timing(label, seconds, lines[-1] if lines else "", proc.returncode, load_before, load_after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("idle", "loaded"), help="one of the two runs")
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs beside the loaded run (default 2)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    if os.environ.get("ROBOT_LAB_TEST_REDIS_URL"):
        print("note: ROBOT_LAB_TEST_REDIS_URL is set: the suite uses that server", file=sys.stderr)
    print(f"{os.cpu_count()} CPUs; pytest {' '.join(args.pytest_args) or '(pyproject.toml options)'}")
    timings = []
    if args.only in (None, "idle"):
        timings.append(run_suite("as it is", 0, args.pytest_args))
        print(timings[-1].line(), flush=True)
    if args.only in (None, "loaded"):
        timings.append(run_suite(f"beside {args.hogs} hogs", args.hogs, args.pytest_args))
        print(timings[-1].line(), flush=True)
    return max(t.exit_code for t in timings)


if __name__ == "__main__":
    sys.exit(main())
