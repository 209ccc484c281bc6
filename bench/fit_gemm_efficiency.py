"""Fit the GEMM shape-efficiency curve to vidur's measured forward GEMM timings.

Model: t = 2MNK / (peak · frac · Π_d d/(d + half_dim)) + overhead, max'd with the HBM roofline,
fitted in log time by least squares (scipy, which scikit-learn already requires).
Run: python bench/fit_gemm_efficiency.py [../shared/data/vidur-profiles]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from paraplan.hardware_profiles import load_gpu

OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def gemm_shapes(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (profile row, GEMM op): M, N, K and the measured median seconds."""
    rows = []
    for _, r in frame.iterrows():
        tokens, tp, h, ffn = r.num_tokens, r.num_tensor_parallel_workers, r.n_embd, r.n_expanded_embd
        qkv = (r.n_head + 2 * r.n_kv_head) * (h // r.n_head)
        up = (2 if r.use_gated_mlp else 1) * ffn
        shapes = {"attn_pre_proj": (qkv / tp, h), "attn_post_proj": (h, h / tp),
                  "mlp_up_proj": (up / tp, h), "mlp_down_proj": (h, ffn / tp)}
        for op, (n, k) in shapes.items():
            rows.append((tokens, n, k, r[f"time_stats.{op}.median"] * 1e-3))
    return pd.DataFrame(rows, columns=["M", "N", "K", "s"])


def fit(gpu_name: str, root: Path, vidur_gpu: str) -> None:
    gpu = load_gpu(gpu_name)
    files = sorted((root / "compute" / vidur_gpu).glob("*/*/mlp.csv"))
    data = pd.concat([gemm_shapes(pd.read_csv(f)) for f in files])
    data = data[data.M >= 16]
    flops = 2 * data.M * data.N * data.K
    moved = 2 * (data.M * data.K + data.K * data.N + data.M * data.N)

    def predict(p):
        frac, half, overhead_us = p
        shape = (data.M / (data.M + half)) * (data.N / (data.N + half)) * (data.K / (data.K + half))
        return np.maximum(flops / (gpu.peak("bf16") * frac * shape),
                          moved / (gpu.hbm_bytes_per_s * 0.85)) + overhead_us * 1e-6

    result = least_squares(lambda p: np.log(predict(p)) - np.log(data.s), x0=[0.75, 64, 5],
                           bounds=([0.3, 1, 0], [1, 4096, 100]))
    error = np.abs(predict(result.x) / data.s - 1)
    frac, half, overhead = result.x
    print(f"{gpu_name}: frac {frac:.3f}  half_dim {half:.0f}  overhead {overhead:.1f} us  "
          f"median |err| {np.median(error):.3f}  rows {len(data)}")


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/vidur-profiles")
    if not root.is_dir():
        sys.exit(f"vidur profiles not found at {root}")
    fit("h100-sxm", root, "h100")
    fit("a100-sxm-80gb", root, "a100")


if __name__ == "__main__":
    main()
