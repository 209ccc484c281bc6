"""Leave-one-source-out accuracy of the step-time model: in-sample beside left-out error per source.

Run: python bench/cross_source.py [--weights 0,0.01,0.02,0.05]
Refits every efficiency fraction fitted to data/reference_runs.csv with each publication (and each table of
one) left out and predicts it with constants it did not influence (validation/cross_source.py; the same figures
as `paraplan validate --cross-source`). With --weights, repeats the folds at other prior weights to show how
much the left-out figures depend on that choice. Takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse

from paraplan.validation import cross_source as cs
from paraplan.validation.reference import load_reference_runs


def _line(label: str, errors) -> str:
    s = cs.summary(errors)
    return (f"{label:<58} {s['rows']:>4}  median {100 * s['median_abs_error_frac']:5.1f}%  "
            f"max {100 * s['max_abs_error_frac']:6.1f}%  bias {100 * s['bias_frac']:+5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="", help="comma list of PRIOR_WEIGHT values to compare")
    args = parser.parse_args()
    grid = cs.row_grid(cs.dense_rows(load_reference_runs()))
    result = cs.folds_of(grid)
    print(f"prior weight {cs.PRIOR_WEIGHT}")
    print(_line("all dense rows, shipped constants (in sample)", result.in_sample_errors))
    print(_line("all dense rows, refitted here on every row (in sample)", result.refit_errors))
    for level, errors in result.left_out_errors.items():
        print(_line(f"all dense rows, each with its {level} left out", errors))
    for fold in result.folds:
        if fold.level == "source":
            print(_line(f"  in sample:  {cs.short_label('source', fold.name)}", fold.in_sample_errors))
            print(_line(f"  left out:   {cs.short_label('source', fold.name)}", fold.left_out_errors))
    for constant, value in sorted(result.all_rows_refit.items()):
        print(f"  {constant.label:<34} shipped {cs.shipped_value(constant):.2f}  refitted on all rows {value:.2f}")
    for weight in (float(w) for w in args.weights.split(",") if w):
        cs.PRIOR_WEIGHT = weight
        other = cs.folds_of(grid)
        print(f"prior weight {weight}: " + "; ".join(
            f"left out by {level}: median {100 * cs.summary(e)['median_abs_error_frac']:.1f}%"
            for level, e in other.left_out_errors.items()))


if __name__ == "__main__":
    main()
