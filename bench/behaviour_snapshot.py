"""Write what paraplan's commands produce for a fixed set of requests, so two trees can be compared byte for byte.

A refactor that moves code must not move a number. This runs, as processes (the command line is the one interface
that stays put while modules move):

- ``plan`` on bench/search_speed.py's three cases and the README's quickstart, with ``--json`` and ``--export all``;
- ``evaluate`` of published layouts (Megatron-LM's GPT-3 175B and Llama-3.1-70B's), with ``--json``;
- ``serve`` on bench/serve_speed.py's four cases, with ``--json`` and ``--export all``;
- ``validate --json`` (every reference run's published layout predicted, and the memory runs) and
  ``validate --serving --json`` where ../shared holds the measured data.

Run: python bench/behaviour_snapshot.py OUT_DIR, before and after a change, then ``diff -r BEFORE AFTER``
(each command runs in OUT_DIR and writes there by relative paths, so two folders' files compare as they are).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
R1_CONFIG = SHARED / "data" / "serving" / "model_configs" / "deepseek-ai--DeepSeek-R1_config.json"

PLANS = {
    "llama405b-16k": ["llama-3.1-405b", "--gpu", "h100-sxm", "--gpus", "16384", "--seq-len", "8192",
                      "--global-batch", "2048"],
    "deepseek-v3-2k": ["deepseek-v3", "--gpu", "h800-sxm", "--gpus", "2048", "--seq-len", "4096",
                       "--global-batch", "15360", "--precision", "fp8"],
    "llama405b-long": ["llama-3.1-405b", "--gpu", "h100-sxm", "--gpus", "16384", "--seq-len", "131072",
                       "--global-batch", "64"],
    "quickstart": ["llama-3.1-70b", "--cluster", "dgx-h100", "--nodes", "8", "--seq-len", "8192",
                   "--global-batch", "256", "--precision", "fp8"],
    "llama8b-torchtitan": ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "4096",
                           "--global-batch", "512", "--engine", "torchtitan", "--tokens", "1e11",
                           "--price-per-gpu-hour", "2.5"],
    "llama8b-deepspeed": ["llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--gpus", "32", "--seq-len", "4096",
                          "--global-batch", "256", "--engine", "deepspeed"],
}
EVALUATIONS = {
    "gpt3-175b": ["gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "1024", "--seq-len", "2048",
                  "--global-batch", "1536", "--tp", "8", "--pp", "8", "--vpp", "3", "--sp", "on",
                  "--recompute", "selective"],
    "llama70b": ["llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "8192", "--global-batch", "128",
                 "--tp", "4", "--pp", "4", "--vpp", "5", "--sp", "on", "--zero", "1", "--tokens", "1e12"],
}


def _serves() -> dict[str, list[str]]:
    r1 = [str(R1_CONFIG)] if R1_CONFIG.is_file() else ["deepseek-v3", "--precision", "fp8"]
    r1 += ["--cluster", "dgx-h200", "--gpus", "64", "--isl", "1024", "--osl", "1024", "--ttft-ms", "2000",
           "--tpot-ms", "50"]
    llama = ["llama-3.1-70b", "--gpu", "h100-sxm", "--gpus", "16", "--isl", "1024", "--osl", "1024", "--ttft-ms",
             "1000", "--tpot-ms", "30"]
    return {"r1-closed": [*r1, "--concurrency", "1024"], "r1-poisson": [*r1, "--rate", "20", "--percentile", "90"],
            "llama70b-closed": [*llama, "--concurrency", "64"],
            "llama70b-poisson": [*llama, "--rate", "4", "--percentile", "90"]}


def _run(out: Path, name: str, argv: list[str]) -> None:
    """One command as a process; its stdout, stderr and exit code kept beside its files."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "paraplan", *argv], capture_output=True, text=True, check=False,
                          cwd=out, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(out.resolve())})
    (out / f"{name}.stdout").write_text(done.stdout)
    (out / f"{name}.stderr").write_text(done.stderr)
    (out / f"{name}.rc").write_text(f"{done.returncode}\n")
    print(f"{name}: exit {done.returncode} in {time.perf_counter() - start:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path, help="a new folder to write every command's outputs into")
    out = parser.parse_args().out_dir
    out.mkdir(parents=True, exist_ok=False)
    for name, argv in PLANS.items():
        _run(out, f"plan-{name}", ["plan", *argv, "--json", f"plan-{name}.json", "--export", "all",
                                   "-o", f"plan-{name}-export"])
    for name, argv in EVALUATIONS.items():
        _run(out, f"evaluate-{name}", ["evaluate", *argv, "--json", f"evaluate-{name}.json"])
    for name, argv in _serves().items():
        _run(out, f"serve-{name}", ["serve", *argv, "--json", f"serve-{name}.json", "--export", "all",
                                    "-o", f"serve-{name}-export"])
    memory = ["--memory-runs", str(SHARED / "calibration" / "memory_runs.csv")] if SHARED.is_dir() else []
    _run(out, "validate", ["validate", *memory, "--json", "validate.json"])
    if SHARED.is_dir():
        _run(out, "validate-serving", ["validate", "--serving", "--serving-data", str(SHARED / "data" / "serving"),
                                       "--json", "validate-serving.json"])


if __name__ == "__main__":
    main()
