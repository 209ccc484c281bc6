"""Measure torchtitan's training memory on one GPU: allocated, reserved and device-level peaks.

Runs on a CUDA machine with PyTorch and torchtitan 0.2.2 (and its `tyro` dependency). It uses
torchtitan's own pieces, in the order its `parallelize_llama` applies them: the Llama 3 model,
`apply_ac` with torchtitan's op-level save list, per-block `torch.compile`, and `apply_fsdp`
(FSDP2, bf16 parameters, fp32 reduction) on a one-rank mesh, so the memory behaves as one FSDP
rank of a larger job with dp_shard = 1. The loss is torchtitan's `cross_entropy_loss` (logits cast
to fp32) and the optimizer torchtitan's default, fused AdamW. Only the trainer loop is ours:
random tokens instead of a data loader, which holds no GPU memory; with compile on, the loss is
compiled too, as torchtitan's default `compile.components` does.

Each configuration runs in its own process (clean allocator and peak statistics), three steps;
the peaks are read over steps 2 and 3, after the optimizer states exist. `step_s` is the faster of
steps 2 and 3 (wall clock), and `fwd_s`, `bwd_s`, `clip_s`, `opt_s` split that step by CUDA events
around the forward (with the loss), the backward, gradient clipping and `optimizer.step()`: rows
measured before these columns existed (the shipped CSV) leave them out. `device` is the
driver's view (total − free from `cudaMemGetInfo`), which adds the CUDA context and NCCL's
buffers to what PyTorch reserved.

    python bench/gpu_memory_probe.py --out rows.csv            # the whole grid
    python bench/gpu_memory_probe.py --one '{"dim": 2048, ...}'  # one configuration (internal)

Compare paraplan's predictions with the rows shipped in data/measured/torchtitan_memory_h100.csv (or a
fresh `--out` file): `python bench/gpu_memory_probe.py --compare [rows.csv]` (no GPU needed).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import subprocess
import sys
import time

GIB = 1024**3

# Model shapes: Llama 3.2 1B and 3B as torchtitan builds them (untied output projection: torchtitan's
# Llama 3 model has no weight tying), an 8-layer slice of Llama 3.1 8B (same per-layer shapes), and a
# tiny shape for checking the probe itself on CPU (`--one` with "device": "cpu").
SHAPES = {
    "tiny": {"dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim_multiplier": 1.0},
    "llama3-1b": {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.5},
    "llama3-3b": {"dim": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8, "ffn_dim_multiplier": 1.0},
    "llama3-8b-8l": {"dim": 4096, "n_layers": 8, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3},
}

GRID = [
    # shape, seq_len, local batch, AC mode ("none", "op" = torchtitan's op-level SAC, "full"), compile.
    # The grid that produced data/measured/torchtitan_memory_h100.csv (2026-11-24).
    *[("llama3-1b", 8192, b, ac, False) for b in (1, 2, 4) for ac in ("none", "op", "full")],
    *[("llama3-1b", 2048, 8, ac, False) for ac in ("none", "op", "full")],
    ("llama3-1b", 8192, 2, "op", True),
    ("llama3-1b", 8192, 4, "full", True),
    ("llama3-3b", 8192, 1, "op", False),
    ("llama3-3b", 4096, 4, "full", False),
    ("llama3-8b-8l", 8192, 2, "op", False),
    ("llama3-8b-8l", 8192, 4, "full", False),
]


def _stub_datasets() -> None:
    """torchtitan's model registry imports Hugging Face `datasets` for its data loaders, which this
    probe does not use; where the package is absent, an empty stand-in lets the import succeed."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        import types

        stub = types.ModuleType("datasets")
        stub.Dataset = stub.IterableDataset = object
        stub.load_dataset = stub.interleave_datasets = None
        sys.modules["datasets"] = stub
        dist = types.ModuleType("datasets.distributed")
        dist.split_dataset_by_node = None
        sys.modules["datasets.distributed"] = dist


def run_one(cfg: dict) -> dict:
    """One configuration, in this process; returns the measured peaks."""
    _stub_datasets()
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config.job_config import ActivationCheckpoint, Compile
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import (
        _op_sac_save_list,
        apply_compile,
        apply_fsdp,
    )
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    cpu = cfg.get("device") == "cpu"  # a logic check of the probe itself on a machine without GPU
    dev = "cpu" if cpu else "cuda"
    if not dist.is_initialized():
        dist.init_process_group("gloo" if cpu else "nccl", rank=0, world_size=1)
        if not cpu:
            torch.cuda.set_device(0)
    mesh = init_device_mesh(dev, (1,), mesh_dim_names=("fsdp",))
    if not cpu:  # the allocator starts empty: nothing of an earlier configuration is cached
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        reserved_at_start = torch.cuda.memory_reserved()

    shape = SHAPES[cfg["shape"]]
    args = TransformerModelArgs(
        **shape, vocab_size=128256, multiple_of=1024, rope_theta=500000, max_seq_len=cfg["seq"]
    )
    with torch.device("meta"):
        model = Transformer(args)
    if cfg["ac"] != "none":
        ac = ActivationCheckpoint(mode="full" if cfg["ac"] == "full" else "selective")
        if cfg["ac"] == "op":
            ac.selective_ac_option = "op"
        apply_ac(model, ac, model_compile_enabled=cfg["compile"], op_sac_save_list=_op_sac_save_list)
    if cfg["compile"]:
        apply_compile(model, Compile(enable=True))
    apply_fsdp(model, mesh, torch.bfloat16, torch.float32, pp_enabled=False)
    model.to_empty(device=dev)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device(dev))
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, eps=1e-8, weight_decay=0.1, fused=not cpu)

    loss_fn = torch.compile(cross_entropy_loss) if cfg["compile"] else cross_entropy_loss
    tokens = torch.randint(0, 128256, (cfg["batch"], cfg["seq"]), device=dev)
    labels = torch.randint(0, 128256, (cfg["batch"], cfg["seq"]), device=dev)
    times, splits = [], []
    for step in range(3):
        if cpu:
            pass
        elif step == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        # CUDA events (none on CPU) at: forward start, loss computed, backward done, optimizer.step start and end.
        events = [] if cpu else [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        mark = (lambda i: events[i].record()) if events else (lambda i: None)
        opt.zero_grad()
        mark(0)
        pred = model(tokens)
        loss = loss_fn(pred, labels)
        mark(1)
        del pred
        loss.backward()
        mark(2)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        mark(3)
        opt.step()
        mark(4)
        if cpu:
            continue
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        splits.append(step_split(events))
        if step >= 1:
            free, total = torch.cuda.mem_get_info()
            device_used = total - free
    if cpu:
        return {**cfg, "params": params, "loss": float(loss)}
    fastest = min(range(1, len(times)), key=lambda i: times[i])  # the step step_s reports, split into its parts
    stats = torch.cuda.memory_stats()
    return {
        **cfg,
        "params": params,
        "max_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
        "max_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
        "device_used_gib": round(device_used / GIB, 3),
        "non_torch_gib": round((device_used - stats["reserved_bytes.all.current"]) / GIB, 3),
        "total_gib": round(total / GIB, 3),
        "step_s": round(min(times[1:]), 4),
        **splits[fastest],
        "reserved_at_start_gib": round(reserved_at_start / GIB, 3),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


def step_split(events: list) -> dict:
    """Seconds of one step's parts from its five recorded CUDA events (synchronised): the forward with the loss
    (fwd_s), the backward (bwd_s), gradient clipping (clip_s) and optimizer.step (opt_s). With FSDP2 the forward
    holds the parameter all-gathers and the backward the gradient reduce-scatters (trivial on one rank)."""
    seconds = [events[i].elapsed_time(events[i + 1]) * 1e-3 for i in range(4)]  # elapsed_time is in ms
    return {name: round(value, 4) for name, value in zip(("fwd_s", "bwd_s", "clip_s", "opt_s"), seconds)}


def context_probe() -> list[dict]:
    """Device memory outside PyTorch's allocator, step by step: CUDA context, then cuBLAS, the flash
    attention kernel, NCCL (a one-rank communicator: no peer buffers), and a Triton kernel."""
    import torch
    import torch.nn.functional as F

    def used(what: str) -> dict:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return {"context_step": what, "device_used_gib": round((total - free) / GIB, 3),
                "reserved_gib": round(torch.cuda.memory_reserved() / GIB, 3)}

    steps = []
    x = torch.zeros(1, device="cuda")
    steps.append(used("cuda_init"))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    steps.append(used("cublas_bf16_gemm"))
    q = torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().item()
    steps.append(used("sdpa_flash"))
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    dist.init_process_group("nccl", rank=0, world_size=1)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    steps.append(used("nccl_world1_allreduce"))
    torch.compile(lambda v: torch.nn.functional.silu(v) * v)(a).sum().item()
    steps.append(used("triton_compiled_kernel"))
    del x
    dist.destroy_process_group()
    return steps


def run_grid(out: str) -> None:
    """The grid in this process (torch's import costs ~15 s a process on the device machine); the
    allocator is emptied between configurations, and the first configuration runs again in a fresh
    process at the end to show the in-process figures equal a clean start's."""
    import torch

    rows = []
    for shape, seq, batch, ac, compile_ in GRID:
        cfg = {"shape": shape, "seq": seq, "batch": batch, "ac": ac, "compile": compile_}
        try:
            row = run_one(cfg)
        except torch.OutOfMemoryError:
            row = {**cfg, "error": "oom"}
        except Exception as exc:  # noqa: BLE001 - a probe records the failure and goes on
            row = {**cfg, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    proc = subprocess.run([sys.executable, __file__, "--context"], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            print(line, flush=True)
            rows.append(json.loads(line))
    first = dict(zip(("shape", "seq", "batch", "ac", "compile"), GRID[0]))
    proc = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(first)], capture_output=True, text=True, check=False,
        env={**os.environ, "MASTER_PORT": "29512"},
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    fresh = json.loads(line[-1]) if line else {**first, "error": proc.stderr[-300:]}
    fresh["fresh_process"] = True
    print(json.dumps(fresh), flush=True)
    rows.append(fresh)
    keys = sorted({k for r in rows for k in r})
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def compare(path: str | None) -> None:
    """paraplan's prediction of every row beside the measurement (GiB)."""
    import numpy as np
    import pandas as pd

    from paraplan.validation.memory_probe import load_probe_rows, predict_probe_all

    frame = load_probe_rows() if path is None else pd.read_csv(path, keep_default_na=False)
    predictions = predict_probe_all(frame)
    print(f"{'configuration':42s} {'allocated':>9s} {'pred':>7s} {'err':>7s}  {'reserved':>8s} {'pred':>7s} "
          f"{'err':>7s}  fit")
    for p in predictions:
        if p.measured_oom:
            print(f"{p.label:42s} {'OOM':>9s} {p.predicted_allocated_gib:7.2f} {'':7s}  {'':8s} "
                  f"{p.predicted_reserved_gib:7.2f} {'':7s}  {'right' if not p.predicted_fits else 'WRONG'}")
            continue
        ea = p.predicted_allocated_gib / p.allocated_gib - 1
        er = p.predicted_reserved_gib / p.reserved_gib - 1
        print(f"{p.label:42s} {p.allocated_gib:9.2f} {p.predicted_allocated_gib:7.2f} {ea:+7.1%}  "
              f"{p.reserved_gib:8.2f} {p.predicted_reserved_gib:7.2f} {er:+7.1%}  "
              f"{'right' if p.predicted_fits else 'WRONG'}")
    measured = [p for p in predictions if not p.measured_oom]
    for name, rows in (("eager", [p for p in measured if not p.compiled]),
                       ("compiled", [p for p in measured if p.compiled])):
        alloc = [abs(p.predicted_allocated_gib / p.allocated_gib - 1) for p in rows]
        res = [abs(p.predicted_reserved_gib / p.reserved_gib - 1) for p in rows]
        print(f"{name}: {len(rows)} rows; allocated median |error| {np.median(alloc):.1%}, max {max(alloc):.1%}; "
              f"reserved median {np.median(res):.1%}, max {max(res):.1%}")
    right = sum(p.predicted_fits is not p.measured_oom for p in predictions)
    print(f"fit / OOM: {right} of {len(predictions)} right "
          f"({sum(not p.measured_oom for p in predictions)} ran, {sum(p.measured_oom for p in predictions)} OOM)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_memory_rows.csv")
    ap.add_argument("--one")
    ap.add_argument("--context", action="store_true")
    ap.add_argument("--compare", nargs="?", const="", default=None, metavar="ROWS_CSV")
    a = ap.parse_args()
    if a.compare is not None:
        compare(a.compare or None)
    elif a.context:
        for step in context_probe():
            print(json.dumps(step), flush=True)
    elif a.one:
        print(json.dumps(run_one(json.loads(a.one))), flush=True)
    else:
        run_grid(a.out)


if __name__ == "__main__":
    main()
