"""Fit each fp8 recipe's GEMM rate factor (cost_models/fp8_recipes.py) to the published same-layout pairs.

A pair is two reference runs of one publication table with the same job and layout, one per-tensor (tensorwise)
and one with the finer recipe. The fitted fractions cancel in the pair's throughput ratio, so the ratio measures
the recipe alone. For each recipe and architecture this prints every pair's measured ratio, the factor that
minimises the median |predicted ratio / measured ratio - 1| over a grid, that error in sample, and, where there
are several pairs, the error of each pair predicted with the factor fitted to the others (leave one pair out).

Run: python bench/fp8_recipes.py
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from paraplan.cost_models import fp8_recipes
from paraplan.hardware_profiles import load_gpu
from paraplan.validation.reference import PUBLISHED_CONFIG_COLUMNS, load_reference_runs, predict_row

GRID = np.round(np.arange(0.60, 1.081, 0.01), 2)
PAIR_KEYS = ["source", "table"] + [c for c in PUBLISHED_CONFIG_COLUMNS if c not in ("precision", "fp8_recipe")]


def pairs(runs: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(tensorwise run, recipe run) of every layout a table published with both."""
    fp8 = runs[runs.precision == "fp8"].copy()
    fp8["fp8_recipe"] = fp8["fp8_recipe"].fillna("tensorwise").replace("", "tensorwise")
    out = []
    for _, group in fp8.groupby([k for k in PAIR_KEYS if k in fp8.columns], dropna=False):
        base = group[group.fp8_recipe == "tensorwise"]
        for _, other in group[group.fp8_recipe != "tensorwise"].iterrows():
            if len(base):
                out.append((base.iloc[0], other))
    return out


def predicted_ratio(base_tokens: float, row: pd.Series, key: tuple[str, str], factor: float) -> float:
    saved = dict(fp8_recipes.GEMM_RATE_FACTOR)
    try:
        fp8_recipes.GEMM_RATE_FACTOR[key] = factor
        return predict_row(row).predicted_tokens_per_s_per_gpu / base_tokens
    finally:
        fp8_recipes.GEMM_RATE_FACTOR.clear()
        fp8_recipes.GEMM_RATE_FACTOR.update(saved)


def main() -> None:
    runs = load_reference_runs()
    groups: dict[tuple[str, str], list] = {}
    for base, other in pairs(runs):
        key = (other.fp8_recipe, load_gpu(other.gpu).architecture)
        groups.setdefault(key, []).append((base, other))
    for key, members in sorted(groups.items()):
        measured = np.array([o.measured_tokens_per_s_per_gpu / b.measured_tokens_per_s_per_gpu for b, o in members])
        bases = [predict_row(b).predicted_tokens_per_s_per_gpu for b, _ in members]
        table = np.array([[predicted_ratio(bt, o, key, f) for f in GRID] for bt, (_, o) in zip(bases, members)])
        errors = np.abs(table / measured[:, None] - 1)
        best = int(np.argmin(np.median(errors, axis=0)))
        print(f"{key[0]} on {key[1]}: {len(members)} pair(s); factor {GRID[best]:.2f} "
              f"(now {fp8_recipes.gemm_rate_factor(*key):.2f}); in-sample median |ratio error| "
              f"{100 * np.median(errors[:, best]):.1f}%")
        for i, (b, o) in enumerate(members):
            line = (f"  {b.id} -> {o.id} ({o.model}, {o.gpu}): measured ratio {measured[i]:.3f}, "
                    f"predicted {table[i, best]:.3f}")
            if len(members) > 1:
                others = np.delete(errors, i, axis=0)
                held = int(np.argmin(np.median(others, axis=0)))
                line += f"; left out: factor {GRID[held]:.2f} from the rest, error {100 * errors[i, held]:.1f}%"
            print(line)
        if len(members) > 1:
            left_out = [errors[i, int(np.argmin(np.median(np.delete(errors, i, axis=0), axis=0)))]
                        for i in range(len(members))]
            print(f"  leave-one-pair-out median |ratio error| {100 * np.median(left_out):.1f}%")


if __name__ == "__main__":
    main()
