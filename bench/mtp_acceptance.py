"""Fit the MTP acceptance of the serving rows whose published deployment drafted tokens (``MTP_ACCEPTANCE``).

InferenceX's disaggregated DeepSeek-R1 sweeps on TensorRT-LLM ran MTP with 1, 2 or 3 draft tokens (``data/serving/
inferencex_deployments.csv``); how often a draft is accepted depends on the benchmark's prompts and the model's
outputs, which no row states. Each row is priced at each acceptance of the grid with the engines' shipped constants,
and per grid point this prints the median |error| and signed median of TPOT by draft count; the fit is the lowest
median |log error| over the disaggregated MTP rows, and, as checks that one acceptance explains what it should, the
fit on the 3-draft rows alone with the error it leaves on the others, and the aggregated MTP rows (single-node
DeepSeek-R1 on TensorRT-LLM and SGLang, Qwen3.5 on SGLang: not fitted to) at the fitted value.

    python bench/mtp_acceptance.py
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from paraplan.cost_models.serving import BENCHMARK_WAVES, wave_mean
from paraplan.validation import serving_runs as sr

GRID = tuple(round(0.5 + 0.05 * k, 2) for k in range(8))


def tpot_errors(grid: tuple[float, ...] = GRID, mode: str = "disagg") -> tuple[pd.DataFrame, dict[float, np.ndarray]]:
    """(the MTP rows of ``mode``, per acceptance the relative TPOT error of each)."""
    with sr.serving_data() as folder:
        rows = sr.load_measurements(folder)
        rows = rows[sr.speculating(rows) & (rows["mode"] == mode).to_numpy()]
        errors = {}
        for acceptance in grid:
            out = sr.predict_rows(rows, folder, mtp_acceptance=acceptance)
            waves = sr._row_waves(rows, BENCHMARK_WAVES)
            tpot_s = wave_mean(out["tpot_steady_s"].to_numpy(), out["tpot_burst_s"].to_numpy(), waves)
            errors[acceptance] = tpot_s * 1e3 / rows["silicon_tpot_ms"].to_numpy() - 1.0
    return rows, errors


def best(errors: dict[float, np.ndarray], mask: np.ndarray) -> float:
    """The acceptance with the lowest median |log error| over ``mask``."""
    return min(errors, key=lambda a: float(np.median(np.abs(np.log1p(errors[a][mask])))))


def main() -> None:
    rows, errors = tpot_errors()
    drafts = rows[sr.SPECULATIVE_TOKENS].to_numpy()
    print(f"{len(rows)} rows with MTP: " + ", ".join(f"{int(n)} drafts {int((drafts == n).sum())}"
                                                     for n in np.unique(drafts)))
    print("acceptance  " + "  ".join(f"{int(n)} drafts |err| (signed)" for n in np.unique(drafts)))
    for a, err in errors.items():
        cells = [f"{np.median(np.abs(err[drafts == n])):8.1%} ({np.median(err[drafts == n]):+.1%})"
                 for n in np.unique(drafts)]
        print(f"{a:10.2f}  " + "  ".join(cells))
    every = np.ones(len(rows), dtype=bool)
    fit_all, fit_three = best(errors, every), best(errors, drafts == 3)
    others = drafts != 3
    print(f"fit on the disaggregated MTP rows: {fit_all:.2f} (shipped MTP_ACCEPTANCE {sr.MTP_ACCEPTANCE:.2f}); "
          f"median |TPOT error| {np.median(np.abs(errors[fit_all])):.1%}")
    left = errors[fit_three][others]
    print(f"fit on the 3-draft rows alone: {fit_three:.2f}; the {int(others.sum())} rows with 1-2 drafts at it: "
          f"median |error| {np.median(np.abs(left)):.1%}, signed {np.median(left):+.1%}")
    agg, agg_errors = tpot_errors((sr.MTP_ACCEPTANCE,), mode="agg")
    at = agg_errors[sr.MTP_ACCEPTANCE]
    print(f"aggregated MTP rows at {sr.MTP_ACCEPTANCE:.2f} (not fitted to): {len(agg)} rows, median |error| "
          f"{np.median(np.abs(at)):.1%}, signed {np.median(at):+.1%}")
    for model, index in agg.groupby(["model_path", "backend"]).indices.items():
        print(f"  {model}: {len(index)} rows, {np.median(np.abs(at[index])):.1%} ({np.median(at[index]):+.1%})")


if __name__ == "__main__":
    main()
