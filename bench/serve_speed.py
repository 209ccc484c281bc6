"""Speed of the full serving search (issue 18's cases; aiconfigurator takes about 26 s for its search here):

- DeepSeek-R1 (its fp8-block checkpoint config from ../shared/data/serving, else the deepseek-v3 preset at fp8)
  on 64 H200 (8 DGX H200 nodes), isl 1024, osl 1024;
- Llama-3.1-70B on 16 H100 SXM, isl 1024, osl 1024.

Each case runs twice: a closed loop (concurrency) and an open loop (Poisson arrivals with p90 targets); every
engine, KV dtype, worker sharding, batch cap, chunk size and worker count, aggregated and disaggregated.

Run: python bench/serve_speed.py [--repeat N]   (prints the deployments priced, the wall and CPU time of each of
N searches in this process and their best, and the wall time of the whole `paraplan serve` command as a process)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from paraplan.hardware_profiles import load_cluster, quick_cluster
from paraplan.model_specs.served import served_model
from paraplan.planner.serving.queueing import poisson
from paraplan.planner.serving.rank import ServingProblem, search_serving
from paraplan.planner.serving.space import ServingChoices, ServingWorkload

R1_CONFIG = Path(__file__).resolve().parents[2] / "shared" / "data" / "serving" / "model_configs" \
    / "deepseek-ai--DeepSeek-R1_config.json"


def _cases() -> list[tuple[str, str, list[str], object, list[ServingWorkload]]]:
    r1, r1_flags = (str(R1_CONFIG), []) if R1_CONFIG.is_file() else ("deepseek-v3", ["--precision", "fp8"])
    return [
        ("DeepSeek-R1 on 64 H200", r1, ["--cluster", "dgx-h200", "--gpus", "64", *r1_flags],
         lambda: load_cluster("dgx-h200", num_gpus=64),
         [ServingWorkload(isl=1024, osl=1024, concurrency=1024, ttft_target_s=2.0, tpot_target_s=0.05),
          ServingWorkload(isl=1024, osl=1024, arrivals=poisson(20.0), ttft_target_s=2.0, tpot_target_s=0.05,
                          percentile=90)]),
        ("Llama-3.1-70B on 16 H100", "llama-3.1-70b", ["--gpu", "h100-sxm", "--gpus", "16"],
         lambda: quick_cluster("h100-sxm", 16),
         [ServingWorkload(isl=1024, osl=1024, concurrency=64, ttft_target_s=1.0, tpot_target_s=0.03),
          ServingWorkload(isl=1024, osl=1024, arrivals=poisson(4.0), ttft_target_s=1.0, tpot_target_s=0.03,
                          percentile=90)]),
    ]


def _precision(flags: list[str]) -> str:
    return flags[flags.index("--precision") + 1] if "--precision" in flags else "auto"


def run_case(title: str, model: str, flags: list[str], cluster_of, workloads, repeat: int) -> None:
    served, cluster = served_model(model), cluster_of()
    for workload in workloads:
        load = f"concurrency {workload.concurrency}" if workload.concurrency else \
            f"Poisson {workload.arrivals.rate_per_s:g} req/s, p{workload.percentile}"
        problem = ServingProblem(model=served.spec, clusters=(cluster,), workload=workload,
                                 choices=ServingChoices(precision=_precision(flags)))
        walls, cpus = [], []
        for _ in range(repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = search_serving(problem)
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - start_cpu)
        best = result.plans[0]
        print(f"== {title}, isl {workload.isl}, osl {workload.osl}, {load}")
        print(f"deployments priced: {result.considered:,}; meeting the targets: {result.feasible:,}")
        print(f"search wall time: best {min(walls):.3f} s, CPU {min(cpus):.3f} s (runs: "
              f"{', '.join(f'{w:.2f}' for w in walls)} s)")
        print(f"best: {best.setup.engine.name} {best.mode} on {best.num_gpus} GPUs, "
              f"{best.estimate['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, TTFT p{workload.percentile} "
              f"{1e3 * best.estimate['ttft_s'][f'p{workload.percentile}']:.0f} ms, TPOT "
              f"{1e3 * best.estimate['tpot_s'][f'p{workload.percentile}']:.1f} ms")
        _as_process(model, flags, workload)


def _as_process(model: str, flags: list[str], workload: ServingWorkload) -> None:
    load = ["--concurrency", str(workload.concurrency)] if workload.concurrency else \
        ["--rate", str(workload.arrivals.rate_per_s), "--percentile", str(workload.percentile)]
    command = [sys.executable, "-m", "paraplan", "serve", model, *flags, "--isl", str(workload.isl), "--osl",
               str(workload.osl), *load, "--ttft-ms", str(1e3 * workload.ttft_target_s), "--tpot-ms",
               str(1e3 * workload.tpot_target_s)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    print(f"`paraplan serve` as a process: {wall:.2f} s ({status})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for case in _cases():
        run_case(*case, repeat=args.repeat)


if __name__ == "__main__":
    main()
