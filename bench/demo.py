"""Wall time of ``robot-lab demo`` (embedded, scripted model, no delay) as shipped, beside the
same demo in an interpreter that has imported litellm first -- what the demo cost when its
warm-up loaded the model gateway for an all-scripted network.

Each variant runs REPEAT times in a fresh interpreter (no REDIS_URL); the median is printed
with the ratio.

    python bench/demo.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

DEMO = "from robot_lab.cli import main; main(['demo', '--plain', '--delay-ms', '0'])"
VARIANTS = {
    "robot-lab demo": DEMO,
    "demo with litellm loaded": "import litellm; " + DEMO,
}


def median_seconds(code: str, repeat: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = {name: median_seconds(code, args.repeat) for name, code in VARIANTS.items()}
    ours = results["robot-lab demo"]
    for name, value in results.items():
        print(f"{name:28} {value:7.2f} s  {value / ours:5.2f}x")


if __name__ == "__main__":
    main()
