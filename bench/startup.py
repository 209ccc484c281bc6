"""Start-up time a user feels: whole commands timed as processes, against importing numpy and pandas.

Issue 17's targets: ``paraplan models list`` and ``paraplan evaluate`` within 1.5x of
``python -c "import numpy, pandas"``. Heavy libraries (scikit-learn, OR-Tools, PuLP) load only where learned
models or solvers run; tests/test_startup.py checks that importing the CLI leaves them out.

Run: python bench/startup.py [--repeats 7]   (prints the median wall time of each command and its ratio)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

EVALUATE = ["evaluate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "64", "--tp", "1", "--pp", "1", "--zero", "1"]


def commands() -> dict[str, list[str]]:
    paraplan = shutil.which("paraplan") or sys.exit("paraplan is not on PATH: pip install . first")
    return {
        'python -c "import numpy, pandas"': [sys.executable, "-c", "import numpy, pandas"],
        "paraplan --version": [paraplan, "--version"],
        "paraplan models list": [paraplan, "models", "list"],
        "paraplan evaluate llama-3.1-8b (8 H100)": [paraplan, *EVALUATE],
        "paraplan plan llama-3.1-8b (64 H100)": [paraplan, "plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64",
                                                 "--seq-len", "8192", "--global-batch", "256"],
    }


def wall_s(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # Every command would compile paraplan's modules from source on every run (no __pycache__ is written), about
        # 0.1-0.25 s more than an installed package costs: 0.523 s against 0.398 s for evaluate on the 2-core machine.
        print("note: PYTHONDONTWRITEBYTECODE is set, so these timings include compiling every module; "
              "rerun with it unset (env -u PYTHONDONTWRITEBYTECODE python bench/startup.py) for what users see")
    timings = {}
    for label, argv in commands().items():
        wall_s(argv)  # warm the file cache
        timings[label] = statistics.median(wall_s(argv) for _ in range(args.repeats))
    baseline = next(iter(timings.values()))
    for label, seconds in timings.items():
        print(f"{label:45s} {seconds:6.3f} s  {seconds / baseline:4.2f}x")


if __name__ == "__main__":
    main()
