"""Serving accuracy against aiconfigurator's 5,221 measured deployments (../shared/data/serving): per engine,
GPU and mode the rows, coverage and median / p90 |error| of TPOT and TTFT, in sample (constants fitted on
every covered row) and held out (constants refitted with each model, or each GPU, left out).

Run: python bench/serving_accuracy.py [FOLDER]   (FOLDER defaults to $PARAPLAN_SERVING_DATA or ../shared/...)
"""

from __future__ import annotations

import sys
import time

from paraplan.validation.serving_runs import validate_serving


def main() -> None:
    started = time.perf_counter()
    report = validate_serving(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"{'engine':7} {'GPU':9} {'mode':7} {'rows':>5} {'covered':>8} {'TPOT med':>9} {'TPOT p90':>9} "
          f"{'TTFT med':>9} {'TTFT p90':>9}")
    for row in report.table.itertuples():
        print(f"{row.backend:7} {row.system:9} {row.mode:7} {row.rows:5d} {row.covered_frac:8.1%} "
              f"{row.tpot_median_err:9.1%} {row.tpot_p90_err:9.1%} {row.ttft_median_err:9.1%} {row.ttft_p90_err:9.1%}")
    print("\nheld out (median |error| over all covered rows, each predicted with constants fitted without it):")
    for label, (tpot, ttft) in report.held_out.items():
        print(f"  {label}: TPOT {tpot:.1%}, TTFT {ttft:.1%}")
    c = report.constants
    print(f"\nfitted on {c.fitted_rows} rows: step overhead (ms) "
          + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in c.step_overhead_s.items())
          + "; request overhead (ms) " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in c.request_overhead_s.items())
          + "; first-token steps " + ", ".join(f"{k} {v:g}" for k, v in c.first_token_steps.items())
          + f"; attention-DP sync (ms a step) {c.dp_sync_s * 1e3:.2f}; benchmark waves {c.waves:g}")
    print("\nnot covered:")
    for reason, count in report.uncovered.items():
        print(f"  {count:5d}  {reason}")
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
