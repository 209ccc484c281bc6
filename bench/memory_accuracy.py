"""Memory accuracy against ../shared/calibration/memory_runs.csv, per source and metric, in sample and
with the one fitted constant of each torchtitan allocator mode (its fragmentation fraction) refitted
with the source's own rows left out, row by row.

Run: python bench/memory_accuracy.py [PATH]   (PATH defaults to $PARAPLAN_MEMORY_RUNS or ../shared/...)
"""

from __future__ import annotations

import sys

import numpy as np

from paraplan.hardware_profiles.units import BYTES_PER_GIB
from paraplan.validation.memory_runs import (
    confusion,
    leave_one_out_reserved,
    load_memory_runs,
    predict_memory_all,
    summarize_memory,
)


def main() -> None:
    frame = load_memory_runs(sys.argv[1] if len(sys.argv) > 1 else None)
    predictions = predict_memory_all(frame)
    print(f"{'id':12} {'metric':11} {'measured GiB':>12} {'predicted GiB':>13} {'error':>8}")
    for p in predictions:
        if p.out_of_scope:
            continue
        if p.metric in ("fits", "oom"):
            print(f"{p.run_id:12} {p.metric:11} {'':>12} {p.predicted_bytes / BYTES_PER_GIB:13.1f} "
                  f"{'right' if p.label_right else 'WRONG':>8}")
            continue
        print(f"{p.run_id:12} {p.metric:11} {p.measured_bytes / BYTES_PER_GIB:12.2f} "
              f"{p.predicted_bytes / BYTES_PER_GIB:13.2f} {p.error_frac:+8.1%}")
    print("\nper source and metric (in sample):")
    for name, summary in summarize_memory(predictions).items():
        if "labels_right" in summary:
            print(f"  {name}: {summary['labels_right']}/{summary['rows']} labels right")
        else:
            print(f"  {name}: {summary['rows']} rows, median |error| {summary['median_abs_error_frac']:.1%}, "
                  f"max {summary['max_abs_error_frac']:.1%}")
    loo = leave_one_out_reserved(frame)
    if len(loo):
        errors = np.abs(np.array(list(loo.values())))
        print(f"  reserved, fragmentation refitted without the row: {len(errors)} rows, median |error| "
              f"{np.median(errors):.1%}, max {errors.max():.1%}")
    print("\nfit/OOM labels:", confusion(predictions))
    skipped = [p for p in predictions if p.out_of_scope]
    print(f"\nout of scope ({len(skipped)} rows):")
    for p in skipped:
        print(f"  {p.run_id}: {p.out_of_scope}")


if __name__ == "__main__":
    main()
