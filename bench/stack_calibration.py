"""How many of a user's own runs a stack profile needs: calibrating NeMo containers from 1, 2, 3 or 5 runs.

Run: python bench/stack_calibration.py [--moe-only]
For each NeMo / Megatron-Bridge container release in data/reference_runs.csv, every way (or 500 random ways)
to pick n of its runs fits the stack-profile factor (validation/stack_profile.py, what `paraplan calibrate` fits)
and the container's other runs are predicted with it. Prints, per container and n, the median over those picks
of the other runs' median |error| (and how often it is <= 10%), MoE and dense rows apart. About 15 s.
"""

from __future__ import annotations

import numpy as np

from paraplan.model_specs.hf_config import load_model
from paraplan.validation import stack_profile as sp
from paraplan.validation.reference import load_reference_runs, predict_all

RUNS = (1, 2, 3, 5)


def container_ratios(moe: bool) -> dict[str, np.ndarray]:
    """Measured / predicted step of each NeMo row, per container release."""
    runs = load_reference_runs()
    runs = runs[runs.source.str.contains("NeMo") & np.array([load_model(m).is_moe == moe for m in runs.model])]
    ratios = np.array([p.predicted_tokens_per_s_per_gpu / p.measured_tokens_per_s_per_gpu for p in predict_all(runs)])
    release = runs.table.str.extract(r"(\d\d\.\d\d(?:\.\d\d)?) NeMo")[0].to_numpy()
    keep = np.isfinite(ratios)
    return {r: ratios[keep & (release == r)] for r in sorted(set(release[keep]))}


def main() -> None:
    for moe in (True, False):
        print(f"{'MoE' if moe else 'dense'} rows: median over picks of the other runs' median |error| "
              "(share of picks <= 10%)")
        print(f"{'container':<10} {'rows':>4} {'uncalibrated':>12} " + " ".join(f"{f'{n} run(s)':>16}" for n in RUNS))
        for release, ratios in container_ratios(moe).items():
            cells = []
            for n in RUNS:
                curve = sp.runs_needed_curve(ratios, n)
                cells.append(f"{100 * np.median(curve):5.1f}% ({100 * np.mean(curve <= 0.10):3.0f}%)" if len(curve)
                             else "-")
            print(f"{release:<10} {len(ratios):>4} {100 * np.median(np.abs(ratios - 1)):11.1f}% "
                  + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
