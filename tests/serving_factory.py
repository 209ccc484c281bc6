"""Hand-built serving-plan documents and a runner that captures the commands serve.sh starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from paraplan.exporters.program import OutputFile

LLAMA = {"name": "llama-3.1-70b", "hf_repo": "meta-llama/Llama-3.1-70B", "path": None}
DSR1 = {"name": "deepseek-r1", "hf_repo": "deepseek-ai/DeepSeek-R1", "path": None}
SHIMS = ("vllm", "python", "trtllm-serve", "mpirun")


def pool(role: str, workers: int, tp: int, *, pp: int = 1, dp: int = 1, ep: int = 1, batch: int = 256,
         tokens: int = 8192, frac: float = 0.9, max_len: int = 2048, gpu: str = "h200-sxm") -> dict[str, Any]:
    """A pool entry; moe_tp is what tp*dp leaves after moe_ep."""
    return {"role": role, "gpu": gpu, "workers": workers, "gpus_per_worker": tp * dp * pp, "tp": tp, "pp": pp,
            "dp_attention": dp, "moe_ep": ep, "moe_tp": tp * dp // ep, "max_batch": batch,
            "max_batched_tokens": tokens, "memory_frac": frac, "max_model_len": max_len}


def document(engine: str, mode: str, pools: list[dict[str, Any]], model: dict[str, Any], *,
             kv_transfer: dict[str, str] | None = None, quant: tuple[str, str, str] = ("bf16", "bf16", "bf16"),
             ) -> dict[str, Any]:
    """A one-deployment serving-plan document."""
    return {"schema_version": 1, "kind": "serving", "model": model,
            "workload": {"isl": 1024, "osl": 1024, "concurrency": None, "rate_per_s": 10.0},
            "plans": [{"rank": 1, "engine": engine, "mode": mode,
                       "quantization": {"weights": quant[0], "experts": quant[1], "kv_cache_dtype": quant[2]},
                       "num_gpus": sum(p["workers"] * p["gpus_per_worker"] for p in pools), "pools": pools,
                       "kv_transfer": kv_transfer,
                       "estimate": {"ttft_s": 0.25, "tpot_s": 0.02, "output_tokens_per_s": 5120.0},
                       "meets_targets": True}]}


def llama_agg(engine: str) -> dict[str, Any]:
    """Llama 3.1 70B, aggregated, 2 workers of tp 4 on one 8-GPU node."""
    return document(engine, "agg", [pool("aggregated", 2, 4)], LLAMA)


def deepseek_disagg(engine: str) -> dict[str, Any]:
    """DeepSeek-R1 disaggregated: prefill tp 8 / moe_ep 8 on node 0, decode tp 1 x dp_attention 16 / moe_ep 16 over
    nodes 1 and 2; FP8 KV cache, NIXL."""
    pools = [pool("prefill", 1, 8, ep=8, tokens=16384), pool("decode", 1, 1, dp=16, ep=16, batch=1024)]
    return document(engine, "disagg", pools, DSR1, kv_transfer={"backend": "nixl", "link": "rdma"},
                    quant=("fp8_block", "fp8_block", "fp8"))


def dense_pp(engine: str) -> dict[str, Any]:
    """A dense model with pp 2: one worker of tp 8 x pp 2 over two nodes."""
    return document(engine, "agg", [pool("aggregated", 1, 8, pp=2)], LLAMA)


def write(folder: Path, files: list[OutputFile]) -> Path:
    """The files written plainly into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        (folder / f.name).write_text(f.text)
    return folder


def captured(folder: Path, node: int, hosts: str) -> list[list[str]]:
    """The argv of every command serve.sh starts on ``node`` (engine commands shimmed on PATH), sorted."""
    bin_dir, log = folder / "bin", folder / f"capture-{node}"
    bin_dir.mkdir(exist_ok=True)
    log.mkdir()
    for name in SHIMS:
        shim = bin_dir / name
        shim.write_text('#!/usr/bin/env bash\nf=$(mktemp "$CAPTURE/cmd.XXXXXX")\n'
                        'printf \'%s\\0\' "$(basename "$0")" "$@" > "$f"\n')
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CAPTURE": str(log), "NODE_RANK": str(node),
           "NODE_HOSTS": hosts, "LOG_DIR": str(folder / "logs")}
    subprocess.run(["bash", str(folder / "serve.sh")], env=env, check=True, timeout=60, capture_output=True)
    return sorted(path.read_bytes().decode().split("\0")[:-1] for path in log.iterdir())
