"""Profiles published by microsoft/vidur (``data/profiling/``): per-op layer times and NCCL timings.

``compute/<gpu>/<org>/<model>/mlp.csv``: one row per (num_tokens, tensor-parallel degree) with
``time_stats.<op>.median`` in milliseconds for the ops of one Llama-style decoder layer's forward
pass. The four projections are GEMMs whose shapes follow from the shape columns (vidur README):
QKV M=tokens, K=hidden, N=(heads + 2·kv_heads)·head_dim/tp; output M=tokens, K=hidden/tp, N=hidden;
up M=tokens, K=hidden, N=(2 if gated else 1)·ffn/tp; down M=tokens, K=ffn/tp, N=hidden. The rest
are element-wise kernels. ``network/<gpu>_<setup>/{all_reduce,send_recv}.csv``: one row per
(group size, bytes) with ``time_stats.<collective>.median`` in milliseconds.

vidur runs its kernels in fp16 (its device configs rate A100 and H100 by ``fp16_tflops``).
"""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.hardware_profiles.units import SECONDS_PER_MS
from paraplan.measurements.ingest.csv_rows import as_dicts, header_and_rows
from paraplan.measurements.ingest.records import Measurement, Parsed, bad_line, positive_number

# vidur's folder names for its GPUs; its A100 is the 80 GB SXM part (vidur/config/device_sku_config.py:
# A100DeviceSKUConfig total_memory_gb = 80), its H100 the SXM5 80 GB.
VIDUR_GPUS = {"h100": "h100-sxm", "a100": "a100-sxm-80gb"}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
NETWORK_COLUMNS = ("num_workers", "size", "collective", "devices_per_node")
SOFTWARE = "vidur profiling (microsoft/vidur data/profiling, commit 7d47513); CUDA and NCCL versions not recorded"


def vidur_hardware(path: Path) -> str | None:
    """The catalog GPU named by a vidur path (``compute/h100/...`` or ``network/a100_dgx/...``)."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part in ("compute", "network"):
            gpu = re.split(r"_", parts[i + 1])[0]
            return VIDUR_GPUS.get(gpu)
    return None


def _gemm_shapes(path: Path, line: int, row: dict[str, str]) -> dict[str, tuple[float, float, float]]:
    heads, kv_heads, hidden, ffn, tokens, tp = (positive_number(path, line, c, row[c]) for c in
                                                ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens",
                                                 "num_tensor_parallel_workers"))
    if row["use_gated_mlp"] not in ("True", "False"):
        raise bad_line(path, line, f"use_gated_mlp must be True or False, got {row['use_gated_mlp'][:20]!r}")
    up = (2.0 if row["use_gated_mlp"] == "True" else 1.0) * ffn
    head_dim = hidden / heads
    return {"attn_pre_proj": (tokens, (heads + 2 * kv_heads) * head_dim / tp, hidden),
            "attn_post_proj": (tokens, hidden, hidden / tp),
            "mlp_up_proj": (tokens, up / tp, hidden),
            "mlp_down_proj": (tokens, hidden, ffn / tp)}


def parse_vidur_compute(path: Path, text: str) -> list[Measurement]:
    """GEMM and element-wise measurements from a vidur ``mlp.csv``."""
    medians = tuple(f"time_stats.{op}.median" for op in GEMM_OPS)
    header, rows = header_and_rows(path, text, SHAPE_COLUMNS + medians)
    model = "/".join(Path(path).parts[-3:-1])
    out = []
    for line, row in as_dicts(header, rows):
        for op, (m, n, k) in _gemm_shapes(path, line, row).items():
            time_s = positive_number(path, line, f"time_stats.{op}.median", row[f"time_stats.{op}.median"])
            out.append(Measurement(kind="gemm", name=op, model=model, line=line, time_s=time_s * SECONDS_PER_MS,
                                   params={"m": m, "n": n, "k": k, "dtype": "fp16"}))
        shape = {"tokens": float(row["num_tokens"]), "hidden": float(row["n_embd"]),
                 "ffn": float(row["n_expanded_embd"]), "tp": float(row["num_tensor_parallel_workers"])}
        for op in ELEMENTWISE_OPS:
            cell = row.get(f"time_stats.{op}.median", "")
            if cell:
                out.append(Measurement(kind="elementwise", name=op, model=model, line=line, params=dict(shape),
                                       time_s=positive_number(path, line, f"time_stats.{op}.median", cell)
                                       * SECONDS_PER_MS))
    return out


def parse_vidur_network(path: Path, text: str) -> list[Measurement]:
    """Collective measurements from a vidur ``all_reduce.csv`` or ``send_recv.csv``."""
    header, rows = header_and_rows(path, text, NETWORK_COLUMNS)
    timing = [c for c in header if re.fullmatch(r"time_stats\.[a-z_]+\.median", c)]
    if len(timing) != 1:
        raise bad_line(path, 1, "expected exactly one time_stats.<collective>.median column")
    setup = Path(path).parent.name.split("_", 1)[-1]
    out = []
    for line, row in as_dicts(header, rows):
        group = positive_number(path, line, "num_workers", row["num_workers"])
        per_node = positive_number(path, line, "devices_per_node", row["devices_per_node"])
        if not re.fullmatch(r"[a-z_]+", row["collective"]):
            raise bad_line(path, line, f"collective must be a name like all_reduce, got {row['collective'][:20]!r}")
        out.append(Measurement(
            kind="collective", name=row["collective"], line=line,
            time_s=positive_number(path, line, timing[0], row[timing[0]]) * SECONDS_PER_MS,
            params={"size_bytes": positive_number(path, line, "size", row["size"]), "group_size": group,
                    "domain": "intra" if per_node >= group else "inter", "devices_per_node": per_node,
                    "setup": setup}))
    return out


def parse_vidur(path: Path, text: str) -> Parsed:
    """Either kind of vidur CSV, told apart by its header; the GPU comes from the folder name."""
    first = text.split("\n", 1)[0]
    hardware = vidur_hardware(path)
    parse = parse_vidur_network if "num_workers" in first else parse_vidur_compute
    return Parsed(measurements=parse(path, text), hardware=hardware, software=SOFTWARE)
