"""Prove that a change to the search or the cost model left every prediction where it was.

``dump PATH`` runs the search on a fixed set of diverse cases (the three of bench/search_speed.py, dense and MoE
models on 8-64 GPUs, every engine, several precisions, the memory objective, fixed axes) and writes to PATH, per
case: the funnel counts (considered, evaluated, fitting), the rejection counts per reason, the smallest memory
need, the top 50 ranked configurations with every number of their estimates, a fingerprint of the whole ranked
order, and, over every evaluated row, a sample of rows keyed by configuration and order-independent sums of
each estimate field. ``compare PATH`` runs the same cases and fails (exit 1) unless the configurations and
their order are identical and every number is equal within ``--rel`` (default 1e-12) relative.

Run: python bench/search_equivalence.py dump /tmp/search_baseline.json        (before a change)
     python bench/search_equivalence.py compare /tmp/search_baseline.json     (after it)
     add --cases NAME,NAME to run a subset
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time

import numpy as np

from paraplan.hardware_profiles import load_cluster, quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search
from paraplan.planner.space import AXES

TOP = 50
SAMPLE = 400
CASES = {
    # name: (model, cluster (gpu, num_gpus) or (cluster type, nodes), job options, fixed axes, objective)
    "llama405b-16k": ("llama-3.1-405b", ("h100-sxm", 16_384), {"seq_len": 8192, "global_batch": 2048}, None,
                      "throughput"),
    "deepseek-v3-2k": ("deepseek-v3", ("h800-sxm", 2048),
                       {"seq_len": 4096, "global_batch": 15_360, "precision": "fp8"}, None, "throughput"),
    "llama405b-long": ("llama-3.1-405b", ("h100-sxm", 16_384), {"seq_len": 131_072, "global_batch": 64}, None,
                       "throughput"),
    "llama8b-tt-8": ("llama-3.1-8b", ("h100-sxm", 8),
                     {"seq_len": 8192, "global_batch": 128, "engine": "torchtitan", "compiled": True,
                      "async_tp": True}, None, "throughput"),
    "llama70b-ds-64": ("llama-3.1-70b", ("a100-sxm-80gb", 64),
                       {"seq_len": 4096, "global_batch": 512, "engine": "deepspeed"}, None, "throughput"),
    "llama70b-mem-32": ("llama-3.1-70b", ("h100-sxm", 32),
                        {"seq_len": 16_384, "global_batch": 64, "precision": "fp8", "memory_headroom_frac": 0.1},
                        None, "memory"),
    "mixtral-fp8-64": ("mixtral-8x7b", ("h100-sxm", 64),
                       {"seq_len": 4096, "global_batch": 256, "precision": "fp8", "fp8_recipe": "blockwise",
                        "dispatcher": "deepep"}, None, "throughput"),
    "qwen3-30b-tt-32": ("qwen3-30b-a3b", ("h200-sxm", 32),
                        {"seq_len": 4096, "global_batch": 256, "engine": "torchtitan"}, None, "throughput"),
    "qwen3-30b-nvl72": ("qwen3-30b-a3b", ("gb200-nvl72", 1),
                        {"seq_len": 8192, "global_batch": 288, "precision": "fp8", "expert_imbalance": 1.0}, None,
                        "throughput"),
    "llama8b-fixed-32": ("llama-3.1-8b", ("h100-sxm", 32), {"seq_len": 16_384, "global_batch": 64},
                         {"tp": [1, 2], "pp": [1], "zero": [1], "recompute": [0, 1], "offload": [0]}, "throughput"),
}


def _cluster(spec):
    name, size = spec
    return load_cluster(name, num_nodes=size) if name.startswith(("dgx", "gb200-nvl", "gb300-nvl")) \
        else quick_cluster(name, size)


def _fields(est) -> dict[str, np.ndarray]:
    """Every per-row array of an EstimateTable, memory fields prefixed."""
    arrays = {}
    for field in dataclasses.fields(est):
        value = getattr(est, field.name)
        if isinstance(value, np.ndarray):
            arrays[field.name] = value
        elif dataclasses.is_dataclass(value):
            arrays.update({f"memory.{k}": v for k, v in _fields(value).items()})
    return arrays


def _config(table, row: int) -> list[int]:
    return [int(getattr(table, axis)[row]) for axis in AXES]


def _row_numbers(arrays: dict[str, np.ndarray], size: int, row: int) -> dict[str, float]:
    return {name: float(np.broadcast_to(value, (size,))[row]) for name, value in arrays.items()}


def run_case(name: str) -> dict:
    model, cluster_spec, options, fixed, objective = CASES[name]
    job = TrainingJob(model=load_model(model), **options)
    start = time.perf_counter()
    result = search(job, _cluster(cluster_spec), fixed, objective)
    wall_s = time.perf_counter() - start
    table, size = result.table, len(result.table)
    arrays = _fields(result.estimates)
    configs = np.stack([getattr(table, axis) for axis in AXES], axis=1).astype(np.int64)
    ranked_order = hashlib.sha256(np.ascontiguousarray(configs[result.ranked]).tobytes()).hexdigest()
    by_config = np.lexsort(configs.T[::-1])  # rows in configuration order, whatever order the table has
    sample = by_config[:: max(1, size // SAMPLE)] if size else by_config
    return {
        "considered": int(result.considered),
        "evaluated": size,
        "fitting": len(result.ranked),
        "rejected": dict(result.rejected),
        "smallest_memory_bytes": float(result.smallest_memory_bytes),
        "cost_model": result.estimates.cost_model,
        "ranked_order_sha256": ranked_order,
        "top": [{"config": _config(table, int(row)), **_row_numbers(arrays, size, int(row))}
                for row in result.ranked[:TOP]],
        "sample": [{"config": _config(table, int(row)), **_row_numbers(arrays, size, int(row))} for row in sample],
        "sums": {key: float(np.sort(np.broadcast_to(value, (size,)).astype(float)).sum())
                 for key, value in arrays.items()},
        "wall_s": wall_s,
    }


def _close(a, b, rel: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def _diff(path: str, base, new, rel: float, out: list[str]) -> None:
    if isinstance(base, dict) and isinstance(new, dict):
        for key in sorted(set(base) | set(new)):
            if key == "wall_s":
                continue
            if key not in base or key not in new:
                out.append(f"{path}.{key}: only in {'baseline' if key in base else 'new run'}")
            else:
                _diff(f"{path}.{key}", base[key], new[key], rel, out)
    elif isinstance(base, list) and isinstance(new, list):
        if len(base) != len(new):
            out.append(f"{path}: length {len(base)} != {len(new)}")
        for index, (a, b) in enumerate(zip(base, new)):
            _diff(f"{path}[{index}]", a, b, rel, out)
    elif not _close(base, new, rel):
        out.append(f"{path}: {base!r} != {new!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("dump", "compare"))
    parser.add_argument("path")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--rel", type=float, default=1e-12, help="relative tolerance of compare")
    args = parser.parse_args()
    names = args.cases.split(",")
    results = {}
    for name in names:
        results[name] = run_case(name)
        print(f"{name}: {results[name]['evaluated']:,} evaluated, {results[name]['fitting']:,} fit, "
              f"search {results[name]['wall_s']:.3f} s", file=sys.stderr)
    if args.mode == "dump":
        with open(args.path, "w") as handle:
            json.dump(results, handle, indent=1)
        return 0
    with open(args.path) as handle:
        baseline = json.load(handle)
    problems: list[str] = []
    for name in names:
        if name not in baseline:
            problems.append(f"{name}: not in the baseline")
            continue
        _diff(name, baseline[name], json.loads(json.dumps(results[name])), args.rel, problems)
    for line in problems[:40]:
        print(line)
    print(f"{len(names)} cases: {'identical' if not problems else f'{len(problems)} differences'} "
          f"(configurations, order, counts; numbers within {args.rel:g} relative)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
