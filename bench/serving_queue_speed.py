"""Time the serving queueing math (planner/serving/queueing.py) on 200,000 deployments at once: the p99 wait
(Erlang C, Allen-Cunneen, the exponential tail) with server counts mixed from 1 to 4096, all at the exact
recursion's limit (the worst case), and all large; best of ``--repeat`` runs.

    .venv/bin/python bench/serving_queue_speed.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from paraplan.planner.serving.queueing import EXACT_MAX_SERVERS, count_quantile, gamma_quantile, wait_quantile_s


def best_s(function, repeat: int) -> float:
    """Fastest of ``repeat`` wall-clock runs of ``function()``, seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    rng = np.random.default_rng(0)
    n = options.entries
    rho, service = rng.uniform(0.05, 0.99, n), rng.uniform(0.01, 1.0, n)
    cases = {
        "mixed c (powers of 2, 1-4096)": 2.0 ** rng.integers(0, 13, n),
        f"all c = {EXACT_MAX_SERVERS} (exact, worst case)": np.full(n, float(EXACT_MAX_SERVERS)),
        "all c = 4096 (approximation)": np.full(n, 4096.0),
    }
    print(f"{n:,} entries, best of {options.repeat}")
    for label, servers in cases.items():
        rate = rho * servers / service
        seconds = best_s(lambda rate=rate, servers=servers: wait_quantile_s(rate, 2.0, service, 0.5, servers, 0.99),
                         options.repeat)
        print(f"  wait_quantile_s, {label:<38} {seconds * 1e3:7.1f} ms")
    mean = rng.uniform(0, 100, n)
    print(f"  count_quantile{'':<40} {best_s(lambda: count_quantile(mean, 1.5, 0.99), options.repeat) * 1e3:7.1f} ms")
    print(f"  gamma_quantile{'':<40} {best_s(lambda: gamma_quantile(mean, 0.8, 0.99), options.repeat) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
