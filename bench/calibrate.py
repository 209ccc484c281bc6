"""Grid-search the per-GPU efficiency constants against the reference runs of one GPU.

This is how the sustained-training fractions in hardware_profiles/efficiency.yaml were chosen.
Run: python bench/calibrate.py GPU 'PARAM=v1,v2 ...' [--exclude REGEX]
  PARAM is gemm_<dtype> (e.g. gemm_fp8), pytorch_gemm_<dtype> (the PyTorch-native stack's override),
  attention_<kernel> (attention_fused, attention_flash) or
  another EfficiencySpec field (gemm_half_dim, hbm_frac, ...).
Example: python bench/calibrate.py gb200 'gemm_fp8=0.5,0.55,0.6 attention_fused=0.3,0.4'
Prints the six best settings by median |error| (+ a quarter of the max), with max error and bias.
The automated refit of every fitted fraction, with sources left out, is validation/cross_source.py
(paraplan validate --cross-source).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import numpy as np

from paraplan.hardware_profiles import catalog
from paraplan.validation import cross_source as cs
from paraplan.validation.reference import load_reference_runs, predict_all


def _parse_grid(text: str) -> dict[str, list[float]]:
    grid = {}
    for item in text.split():
        name, values = item.split("=")
        grid[name] = [float(v) for v in values.split(",")]
    return grid


def _with_constants(entry: str, constants: dict[str, float]):
    """The efficiency spec of efficiency.yaml entry ``entry`` with the grid point ``constants`` in place."""
    spec = catalog.efficiency_of(entry)[0]
    fractions, fields = {}, {}
    for name, value in constants.items():
        if name.startswith("pytorch_gemm_"):
            fractions[cs.Constant(entry, cs.STACK_FIELD, name.removeprefix("pytorch_gemm_"), "pytorch")] = value
        elif name.startswith("gemm_") and name != "gemm_half_dim":
            fractions[cs.Constant(entry, cs.GEMM_FIELD, name.removeprefix("gemm_"))] = value
        elif name.startswith("attention_"):
            fractions[cs.Constant(entry, cs.ATTENTION_FIELD, name.removeprefix("attention_"))] = value
        else:
            fields[name] = value
    return dataclasses.replace(cs.with_constants(spec, fractions), **fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu")
    parser.add_argument("grid")
    parser.add_argument("--exclude", default=None, help="regex of reference-run ids to leave out")
    parser.add_argument("--only", default=None, help="regex of reference-run ids to keep")
    args = parser.parse_args()
    runs = load_reference_runs()
    runs = runs[runs.gpu == args.gpu]
    if args.only:
        runs = runs[runs.id.str.contains(args.only)]
    if args.exclude:
        runs = runs[~runs.id.str.contains(args.exclude)]
    entry = cs.chip_entry(args.gpu)
    grid = _parse_grid(args.grid)
    results = []
    for values in itertools.product(*grid.values()):
        constants = dict(zip(grid, values))
        with cs.catalog_efficiency({entry: _with_constants(entry, constants)}):
            errors = np.array([p.error_frac for p in predict_all(runs)])
        errors = errors[np.isfinite(errors)]
        results.append((float(cs.criterion(errors)), np.median(np.abs(errors)), np.abs(errors).max(),
                        np.median(errors), constants))
    print(f"{args.gpu}: {len(runs)} reference runs (constants of efficiency.yaml entry {entry})")
    for _, median, worst, bias, constants in sorted(results, key=lambda r: r[0])[:6]:
        print(f"median |err| {median:.3f}  max {worst:.3f}  bias {bias:+.3f}  {constants}")


if __name__ == "__main__":
    main()
