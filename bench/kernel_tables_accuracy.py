"""Step-time error with measured kernel tables and without, per source: the reference runs and the H100 probe.

    python bench/kernel_tables_accuracy.py --store STORE [--gpu h100-sxm ...]

STORE is a profile store holding kernel tables (``paraplan ingest --kind aiconfigurator WHEEL``, or the training
suite of ``paraplan profile``); paraplan's shipped H100 and H200 tables price what it lacks (a path to no file: only
those). For every reference run on a GPU the store has a 16-bit GEMM table for, and every
row of paraplan's own H100 probe (data/measured/torchtitan_memory_h100.csv), it prints the analytical
prediction's error beside the prediction priced with the tables (``--cost-model measured`` on that store). Nothing is
fitted here: both columns are out of sample for the tables; the analytical column is in sample for the reference
runs its efficiency fractions were fitted to (hardware_profiles/efficiency.yaml).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.cost_models.learned.provider import compute_rates, has_gemm_table
from paraplan.hardware_profiles.run_factor import gpu_at_scale
from paraplan.planner.search import search
from paraplan.validation.memory_probe import load_probe_rows, predict_probe_step_s
from paraplan.validation.reference import (
    _cluster,
    _fixed_knobs,
    load_reference_runs,
    measured_tokens_per_s_per_gpu,
    reference_job,
)


def _reference_error(row: pd.Series, cost_model: str, store: Path) -> float:
    """Signed throughput error of one reference run (+ = predicted faster)."""
    job, cluster = reference_job(row), _cluster(row)
    work = job.workload()
    gpu = gpu_at_scale(cluster.gpu, cluster.num_gpus)
    rates = compute_rates(cost_model, gpu, work.precision, work.attention, work.kernel_stack, store)
    result = search(job, cluster, _fixed_knobs(row), rates=rates)
    if len(result.ranked) == 0:
        return float("nan")
    predicted = float(result.estimates.tokens_per_s_per_gpu[int(result.ranked[0])])
    return predicted / measured_tokens_per_s_per_gpu(row, job.model) - 1.0


def _probe_error(row: pd.Series, cost_model: str, store: Path) -> float:
    """Signed step-time error of one probe row (+ = predicted slower)."""
    return predict_probe_step_s(row, cost_model, store) / float(row["step_s"]) - 1.0


def _report(title: str, frame: pd.DataFrame) -> None:
    print(f"\n{title}")
    for group, rows in frame.groupby("group"):
        a, t = rows["analytical"].abs(), rows["tables"].abs()
        print(f"  {group[:60]:60s} {len(rows):3d} rows  analytical median {a.median():6.1%} max {a.max():6.1%}"
              f"   tables median {t.median():6.1%} max {t.max():6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--gpu", nargs="*", default=None, help="Reference GPUs (default: every GPU with a table).")
    args = parser.parse_args()
    probe = load_probe_rows()
    probe = probe[probe["error"] != "oom"]
    rows = [{"group": f"probe {r['shape']}", "label": f"{r['shape']} s{r['seq']} b{r['batch']} {r['ac']}",
             "analytical": _probe_error(r, "analytical", args.store), "tables": _probe_error(r, "measured", args.store)}
            for _, r in probe.iterrows()]
    frame = pd.DataFrame(rows)
    for _, r in frame.iterrows():
        print(f"  {r['label']:32s} analytical {r['analytical']:+6.1%}   tables {r['tables']:+6.1%}")
    _report("paraplan's H100 probe (step time; + = predicted slower)", frame)
    print(f"  all {len(frame)} rows: analytical median {frame['analytical'].abs().median():.1%} "
          f"max {frame['analytical'].abs().max():.1%}, tables median {frame['tables'].abs().median():.1%} "
          f"max {frame['tables'].abs().max():.1%}")
    runs = load_reference_runs()
    gpus = args.gpu or sorted(g for g in runs["gpu"].unique() if has_gemm_table(args.store, g, "bf16"))
    runs = runs[runs["gpu"].isin(gpus) & runs["precision"].isin(["bf16", "fp16"])]
    ref = pd.DataFrame([{"group": r["source"], "analytical": _reference_error(r, "analytical", args.store),
                         "tables": _reference_error(r, "measured", args.store)} for _, r in runs.iterrows()])
    if len(ref):
        _report(f"reference runs on {', '.join(gpus)}, 16-bit (throughput; + = predicted faster)", ref)
        print(f"  all: analytical median {np.nanmedian(ref['analytical'].abs()):.1%}, "
              f"tables median {np.nanmedian(ref['tables'].abs()):.1%}")


if __name__ == "__main__":
    main()
