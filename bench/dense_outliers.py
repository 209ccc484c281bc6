"""The dense reference rows paraplan misses by more than 20%, each beside the rows of its own source
that it contradicts. Prints measured and predicted tokens/s/GPU through `paraplan validate`'s path.

    python bench/dense_outliers.py

Each group names what the rows share and what differs. A row whose siblings differ only in
something that cannot make it slower (more GPUs at the same per-GPU work, a faster GPU of the
same die) shows a measurement the configuration alone does not explain.
"""

from __future__ import annotations

from paraplan.cost_models.collectives import collective_time_s
from paraplan.model_specs.hf_config import load_model
from paraplan.validation.reference import _cluster, load_reference_runs, predict_row

GROUPS = (
    ("mpt_foundry_179", ("mpt_foundry_178", "mpt_foundry_177", "mpt_foundry_180"),
     "MPT-1B, A100 40GB, seq 2048, FSDP, GA 1; 32 GPUs against 64 and 128 at the same mbs 10 (and 16 at mbs 8)"),
    ("mpt_foundry_140", ("mpt_foundry_139",),
     "MPT-70B, A100 40GB, FSDP, GA 1; 64 GPUs at mbs 2 against 128 at mbs 4"),
    ("mpt_foundry_021", ("mpt_foundry_022", "mpt_foundry_025"),
     "MPT-30B, 8 H100, FSDP, full recompute; seq 8192 against 4096 and 2048"),
    ("mpt_foundry_080", ("mpt_foundry_081", "mpt_foundry_082"),
     "MPT-30B, 8 A100 80GB, FSDP, full recompute; seq 8192 against 4096 and 2048"),
    ("nemo_bridge_0261", ("nemo_bridge_0271", "nemo_bridge_0270", "nemo_bridge_0260"),
     "Llama-3.1-405B, 128 GPUs, tp4 pp8 cp2 vpp8, NeMo 25.09, fp8; GB200 against B200 of the same die"),
)


def _fully_serialized_fsdp_bound(run_id: str) -> str:
    """Tokens/s/GPU if the step also waited for every FSDP all-gather and reduce-scatter of the model
    (two gathers and one reduce-scatter of 16-bit weights), the most its traffic can cost."""
    frame = load_reference_runs()
    row = frame[frame["id"] == run_id].iloc[0]
    model, cluster = load_model(row["model"]), _cluster(row)
    weights = model.total_params() * 2.0
    n = int(row["num_gpus"])
    traffic_s = 2 * collective_time_s("all_gather", weights, n, 1, cluster) + collective_time_s(
        "reduce_scatter", weights, n, 1, cluster)
    predicted = predict_row(row).predicted_tokens_per_s_per_gpu
    tokens_per_gpu = int(row["global_batch"]) * int(row["seq_len"]) / n
    step = tokens_per_gpu / predicted + float(traffic_s)
    return f"{tokens_per_gpu / step:,.0f} tokens/s/GPU with all FSDP traffic exposed ({float(traffic_s):.1f} s/step)"


def main() -> None:
    frame = load_reference_runs().set_index("id", drop=False)
    for outlier, siblings, what in GROUPS:
        print(f"== {what}")
        for run_id in (outlier, *siblings):
            p = predict_row(frame.loc[run_id])
            mark = "  <- beyond 20%" if abs(p.error_frac) > 0.20 else ""
            print(f"  {run_id:20s} measured {p.measured_tokens_per_s_per_gpu:9,.0f}  predicted "
                  f"{p.predicted_tokens_per_s_per_gpu:9,.0f}  error {100 * p.error_frac:+6.1f}%{mark}")
        if outlier == "mpt_foundry_140":
            print(f"  bound: {_fully_serialized_fsdp_bound(outlier)}")


if __name__ == "__main__":
    main()
