"""GEMM kernel fractions measured at training shapes, beside the fractions efficiency.yaml prices with.

    python bench/kernel_fractions.py --store STORE [--gpu b200 gb200 ...] [--min-m 8192] [--min-nk 4096]

STORE is a profile store with GEMM tables (``paraplan ingest aiconfigurator WHEEL --hardware GPU --op gemm --store
STORE``, or paraplan's own training suite). For every GPU, 16-bit and fp8 dtype and measured kernel it prints the
share of the datasheet's dense peak (gpus.yaml) that the kernel reaches on training-sized GEMMs (m >= --min-m
tokens, n and k >= --min-nk): the quartiles over those shapes. Beside them: the fraction efficiency.yaml prices the
GPU's Transformer Engine GEMMs with (fitted to published runs, or the default where nothing was fitted) and what it
is against the measured median (fitted / measured: what the published runs kept of the kernel's speed). Nothing is
fitted here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.hardware_profiles.catalog import load_gpu
from paraplan.measurements.kernel_rows import group_rows, kernel_groups
from paraplan.measurements.store import summarize

DTYPES = ("bf16", "fp16", "fp8")


def measured_fractions(store: Path, gpu_name: str, min_m: float, min_nk: float) -> pd.DataFrame:
    """One row per measured GEMM kernel of ``gpu_name``: its dtype, kernel, stack, shapes and quartile fractions."""
    gpu = load_gpu(gpu_name)
    rows = []
    for group in kernel_groups(store, gpu_name, "gemm"):
        if group.dtype not in DTYPES:
            continue
        frame = group_rows(store, group, ("m", "n", "k"), {"pass": "forward"})
        frame = frame[(frame["m"] >= min_m) & (frame["n"] >= min_nk) & (frame["k"] >= min_nk) & (frame["time_s"] > 0)]
        if frame.empty:
            continue
        fraction = 2.0 * frame["m"] * frame["n"] * frame["k"] / frame["time_s"] / gpu.peak(group.dtype)
        q25, q50, q75 = np.quantile(fraction, [0.25, 0.5, 0.75])
        rows.append({"gpu": gpu_name, "dtype": group.dtype, "kernel": group.name[:40], "stack": group.stack[:24],
                     "shapes": len(frame), "p25": q25, "median": q50, "p75": q75})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--gpu", nargs="*", default=None, help="GPUs (default: every GPU with GEMM rows).")
    parser.add_argument("--min-m", type=float, default=8192.0)
    parser.add_argument("--min-nk", type=float, default=4096.0)
    args = parser.parse_args()
    if not args.store.is_file():
        parser.error(f"no profile store at {args.store}")
    summary = summarize(args.store)
    gpus = args.gpu or sorted(set(summary.loc[summary["kind"] == "gemm", "hardware"]))
    frames = [measured_fractions(args.store, g, args.min_m, args.min_nk) for g in gpus]
    table = pd.concat([f for f in frames if not f.empty], ignore_index=True) if frames else pd.DataFrame()
    if table.empty:
        print("no 16-bit or fp8 GEMM rows at those shapes")
        return
    print(f"GEMM share of the dense peak at m >= {args.min_m:g}, n, k >= {args.min_nk:g} (quartiles over the shapes)")
    for (gpu_name, dtype), part in table.groupby(["gpu", "dtype"], sort=True):
        spec = load_gpu(gpu_name).efficiency
        priced = spec.gemm_peak_frac.get(dtype, np.nan)
        origin = spec.gemm_origin(dtype, "transformer_engine")
        best = part["median"].max()
        print(f"{gpu_name} {dtype}: efficiency.yaml {priced:.2f} ({origin}); fastest kernel's median {best:.3f}, "
              f"priced / measured {priced / best:.2f}")
        for r in part.itertuples():
            print(f"    {r.kernel:40s} {r.stack:24s} {r.shapes:5d} shapes  {r.p25:.3f} {r.median:.3f} {r.p75:.3f}")


if __name__ == "__main__":
    main()
