"""Start-up cost of ``import robot_lab`` and ``robot-lab --help`` beside ``python -c pass``.

Each command runs REPEAT times in a fresh interpreter; the median wall time is printed with
the overhead over the bare interpreter. Target: ``robot-lab --help`` under 0.5 s.

    python bench/startup.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "import robot_lab": [sys.executable, "-c", "import robot_lab"],
    "python -m robot_lab --help": [sys.executable, "-m", "robot_lab", "--help"],
}


def median_seconds(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    commands = dict(COMMANDS)
    script = shutil.which("robot-lab")
    if script:
        commands["robot-lab --help"] = [script, "--help"]
    baseline = median_seconds(commands["python -c pass"], args.repeat)
    print(f"{'command':32} {'median s':>9} {'over python':>12} {'ratio':>7}")
    for name, cmd in commands.items():
        value = median_seconds(cmd, args.repeat)
        print(f"{name:32} {value:9.3f} {value - baseline:+12.3f} {value / baseline:7.2f}x")
    help_time = median_seconds(commands.get("robot-lab --help", commands["python -m robot_lab --help"]), args.repeat)
    verdict = "OK" if help_time < 0.5 else "OVER TARGET"
    print(f"robot-lab --help: {help_time:.3f} s (target < 0.5 s): {verdict}")


if __name__ == "__main__":
    main()
