"""Speed and memory of the full search on the issue's three cases (2-core machine figures in docs/speed.md):

- Llama-3.1-405B on 16,384 H100 SXM, sequence 8192, global batch 2048 (dense, every axis free);
- DeepSeek-V3 on 2,048 H800 SXM, sequence 4096, global batch 15,360, fp8 (ep, etp, EP overlap free);
- Llama-3.1-405B on 16,384 H100 SXM at sequence 131,072, global batch 64 (long context: cp free).

Run: python bench/search_speed.py [--repeat N] [--keep K] [--threads T] [--no-process]

Per case, in this process: candidates, the wall and CPU time of the best of N searches (default 3; every wall is
shown, the first in a fresh process pays for untouched memory) and the cost pass's candidates per second, for the
full search and for one that keeps its best K rows (``search(keep=K)``, default 5: what a command showing K plans
needs). Memory is the peak resident set (RSS, ``ru_maxrss``) of a fresh child process that imports paraplan and
runs one such search, imports included, beside that of one that only imports. Then, as processes (issue 33): the
command users run, ``paraplan plan deepseek-v3 --gpu h800-sxm --gpus 2048 --seq-len 4096 --global-batch 15360
--precision fp8``, against ``python -c "import numpy, pandas"``: median wall and CPU time of N runs and peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

from paraplan.choices import CP_COMM_NAMES
from paraplan.cost_models.estimate import estimate
from paraplan.hardware_profiles import quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner import search_blocks
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import search
from paraplan.planner.space import enumerate_space

CASES = (
    ("llama-3.1-405b", "h100-sxm", 16_384, 8192, 2048, "bf16"),
    ("deepseek-v3", "h800-sxm", 2048, 4096, 15_360, "fp8"),
    ("llama-3.1-405b", "h100-sxm", 16_384, 131_072, 64, "bf16"),
)
DEEPSEEK_PLAN = ["plan", "deepseek-v3", "--gpu", "h800-sxm", "--gpus", "2048", "--seq-len", "4096",
                 "--global-batch", "15360", "--precision", "fp8"]


def _job(model: str, gpu: str, num_gpus: int, seq_len: int, global_batch: int, precision: str):
    return TrainingJob(model=load_model(model), seq_len=seq_len, global_batch=global_batch,
                       precision=precision), quick_cluster(gpu, num_gpus)


def _timed(job, cluster, repeat: int, keep: int | None):
    walls, cpus, result = [], [], None
    for _ in range(repeat):  # best of several: a shared machine's other work only ever adds time
        result = None  # free the previous search's arrays before the next one allocates its own
        start, start_cpu = time.perf_counter(), time.process_time()
        result = search(job, cluster, keep=keep)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return result, walls, cpus


# Forks and runs a command, then prints its wall and CPU time, peak RSS and wait status. A child's ru_maxrss
# starts from its parent's resident set at the fork (Linux keeps the larger across exec), so the measured command
# is forked from this small interpreter, never from the benchmark holding a search's arrays.
_LAUNCHER = """import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, status)
"""


def child_run(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, user + system CPU s, peak RSS MiB) of one child process; its output is discarded."""
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], check=True, capture_output=True, text=True)
    wall, cpu, max_rss_kib, status = out.stdout.split()
    if int(status) != 0:
        sys.exit(f"{' '.join(argv)} failed (wait status {status})")
    return float(wall), float(cpu), int(max_rss_kib) / 1024  # ru_maxrss is in KiB on Linux


def search_rss_mib(case: int, keep: int | None) -> float:
    """Peak RSS of a fresh process that runs case ``case``'s search once (keep: None = full; -1 = none at all)."""
    return child_run([sys.executable, __file__, "--child", str(case), str(keep)])[2]


def run_case(index: int, repeat: int, keep: int) -> None:
    model, gpu, num_gpus, seq_len, global_batch, precision = CASES[index]
    job, cluster = _job(*CASES[index])
    result, walls, cpus = _timed(job, cluster, repeat, None)
    space = enumerate_space(job, cluster, engine_rules("megatron"), collapse_cp_comm=True)  # as search() runs it
    start = time.perf_counter()
    estimate(job.model, cluster, job.workload(), space.table)
    vector_s = time.perf_counter() - start
    print(f"== {model} on {num_gpus:,} {gpu}, sequence {seq_len:,}, global batch {global_batch:,}, {precision}")
    print(f"candidates considered: {result.considered:,}")
    print(f"candidates evaluated (rule-valid): {result.evaluated:,}; fitting: {result.fitting:,}")
    print(f"full search wall time: {min(walls):.3f} s, CPU time {min(cpus):.3f} s (best of {repeat}: "
          f"{', '.join(f'{w:.2f}' for w in walls)} s wall); peak RSS of a process running it: "
          f"{search_rss_mib(index, None):,.0f} MiB")
    print(f"vectorized cost pass: {vector_s * 1e3:.1f} ms = {len(space.table) / vector_s:,.0f} candidates/s")
    kept, walls, cpus = _timed(job, cluster, repeat, keep)
    print(f"search keeping the best {keep}: wall {min(walls):.3f} s, CPU {min(cpus):.3f} s (best of {repeat}); "
          f"peak RSS of a process running it: {search_rss_mib(index, keep):,.0f} MiB")
    if len(kept.ranked):
        t, best = kept.table, kept.estimates
        print(f"best: tp={t.tp[0]} pp={t.pp[0]} dp={t.dp[0]} cp={t.cp[0]} "
              f"cp_comm={CP_COMM_NAMES[int(t.cp_comm[0])]} ep={t.ep[0]} vpp={t.vpp[0]} "
              f"mbs={t.mbs[0]}: {best.tokens_per_s_per_gpu[0]:,.0f} tokens/s/GPU, MFU {best.mfu[0]:.3f}")


def run_processes(repeat: int) -> None:
    """The DeepSeek-V3 command as a user runs it, against importing numpy and pandas."""
    paraplan = shutil.which("paraplan") or sys.exit("paraplan is not on PATH: pip install . first")
    commands = {'python -c "import numpy, pandas"': [sys.executable, "-c", "import numpy, pandas"],
                "paraplan plan deepseek-v3 (2,048 H800, fp8)": [paraplan, *DEEPSEEK_PLAN]}
    print(f"== as processes (median of {repeat}; peak RSS: the largest ru_maxrss)")
    bare = None
    for label, argv in commands.items():
        child_run(argv)  # warm the file cache
        runs = [child_run(argv) for _ in range(repeat)]
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        bare = bare or (wall, cpu)
        print(f"{label:45s} wall {wall:6.3f} s ({wall / bare[0]:4.1f}x)  CPU {cpu:6.3f} s ({cpu / bare[1]:4.1f}x)  "
              f"peak RSS {max(r[2] for r in runs):6,.0f} MiB")


def child(case: int, keep: str) -> None:
    """One search of ``CASES[case]`` (keep 'None': the full search; '-1': none, the imports alone)."""
    if keep != "-1":
        job, cluster = _job(*CASES[case])
        search(job, cluster, keep=None if keep == "None" else int(keep))


def main() -> None:
    parser = argparse.ArgumentParser(description="Wall and CPU time and peak memory of the search on the issue's "
                                                 "cases, and of the DeepSeek-V3 command as a process.")
    parser.add_argument("--repeat", type=int, default=3, help="searches (and processes) per case; best/median")
    parser.add_argument("--keep", type=int, default=5, help="rows the bounded search keeps")
    parser.add_argument("--no-process", action="store_true", help="skip the whole-command measurement")
    parser.add_argument("--threads", type=int, default=search_blocks.PRICING_THREADS,
                        help="most threads that price blocks (planner.search_blocks.PRICING_THREADS; 1: one thread), "
                             "in this process (the child processes and the paraplan command use the default)")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "KEEP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    search_blocks.PRICING_THREADS = args.threads
    if args.child:
        return child(int(args.child[0]), args.child[1])
    job, cluster = _job("llama-3.1-8b", "h100-sxm", 16, 4096, 64, "bf16")
    search(job, cluster)  # warm imports and caches
    print(f"peak RSS of a process that only imports paraplan's search: {search_rss_mib(0, -1):,.0f} MiB")
    for index in range(len(CASES)):
        run_case(index, args.repeat, args.keep)
    if not args.no_process:
        run_processes(max(args.repeat, 3))


if __name__ == "__main__":
    main()
