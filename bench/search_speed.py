"""Speed of the full search: Llama-3.1-405B on 16,384 H100 SXM, sequence 8192, global batch 2048.

Run: python bench/search_speed.py   (prints candidates, wall time and candidates per second)
"""

from __future__ import annotations

import time

from paraplan.cost_models.estimate import estimate
from paraplan.cost_models.hf_config import load_model
from paraplan.hardware_profiles import quick_cluster
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search
from paraplan.planner.space import enumerate_space


def main() -> None:
    job = TrainingJob(model=load_model("llama-3.1-405b"), seq_len=8192, global_batch=2048)
    cluster = quick_cluster("h100-sxm", 16_384)
    search(job, cluster)  # warm imports and caches
    start = time.perf_counter()
    result = search(job, cluster)
    total_s = time.perf_counter() - start
    space = enumerate_space(job, cluster, engine_rules("megatron"))
    start = time.perf_counter()
    estimate(job.model, cluster, job.workload(), space.table)
    vector_s = time.perf_counter() - start
    evaluated = len(result.table)
    print(f"candidates considered: {result.considered:,}")
    print(f"candidates evaluated (rule-valid): {evaluated:,}; fitting: {len(result.ranked):,}")
    print(f"full search wall time: {total_s:.3f} s")
    print(f"vectorized cost pass: {vector_s * 1e3:.1f} ms = {evaluated / vector_s:,.0f} candidates/s")


if __name__ == "__main__":
    main()
