"""How stable the serving validation's fitted step overheads are: each engine's rows resampled with replacement
(100 bootstrap draws, seed 0, benchmark waves 3) and the step overhead refitted on each draw, once by the median
|log error| of TPOT (the rule before) and once by its mean (``serving_runs.step_overhead_index``, the rule now).
Prints the 5th, 50th and 95th percentile and the standard deviation of the fitted values per engine.

    python bench/serving_fit_stability.py [FOLDER]   (FOLDER: as for `paraplan validate --serving`)

Rows with attention DP carry the shipped DP sync (``EngineTraits.dp_sync_s``), as the in-sample fit does.
"""

from __future__ import annotations

import argparse

import numpy as np

from paraplan.cost_models.serving import ENGINE_TRAITS
from paraplan.validation import serving_runs as sr

DRAWS = 100
WAVES = 3.0


def _fitted_ms(errors: np.ndarray, rule: str, rng: np.random.Generator) -> np.ndarray:
    """Per draw, the grid value (ms) whose median or mean of ``errors`` ([grid, rows]) over the draw is lowest."""
    score = np.median if rule == "median" else np.mean
    picks = []
    for _ in range(DRAWS):
        draw = rng.integers(0, errors.shape[1], errors.shape[1])
        picks.append(sr.STEP_OVERHEAD_GRID_S[int(np.argmin(score(errors[:, draw], axis=1)))] * 1e3)
    return np.array(picks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=None, help="serving data folder (default: the shipped data)")
    args = parser.parse_args()
    with sr.serving_data(args.folder) as folder:
        grid = sr.overhead_grid(sr.load_measurements(folder), folder)
    rows = grid.rows
    sync = sr.DP_SYNC_GRID_S.index(ENGINE_TRAITS["vllm"].dp_sync_s) if grid.synced else 0
    steady, burst = grid.column("tpot_steady_s", sync), grid.column("tpot_burst_s", sync)
    tpot = steady + (burst - steady) / WAVES
    measured = rows["silicon_tpot_ms"].to_numpy() / 1e3
    print(f"{'engine':7} {'rule':7} {'p5 ms':>6} {'p50 ms':>7} {'p95 ms':>7} {'sd ms':>6}")
    for engine in ENGINE_TRAITS:
        sel = ((rows["backend"] == engine) & (rows["reason"] == "")).to_numpy()
        errors = np.abs(np.log(tpot[:, sel] / measured[sel]))
        for rule in ("median", "mean"):
            ms = _fitted_ms(errors, rule, np.random.default_rng(0))
            p5, p50, p95 = np.percentile(ms, [5, 50, 95])
            print(f"{engine:7} {rule:7} {p5:6.2f} {p50:7.2f} {p95:7.2f} {ms.std():6.2f}")


if __name__ == "__main__":
    main()
