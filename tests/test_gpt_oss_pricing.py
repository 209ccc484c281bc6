"""GPT-OSS's expert MLP outside a fused grouped MLP (issue 32, item 5): Megatron's eager clamp of the GLU inputs and
its per-expert down-projection bias (cost_models/moe_eager.py).

Hand-derived byte counts and launches, exact metamorphic relations (the fused path and a model without biases or a
clamp cost nothing extra; the eager ops land in the experts' node of the overlap schedule), the reference rows
that say which path their recipe ran, and the memory the eager clamp keeps for backward.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_table
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cost_models.compute import ComputeRates, analytical_rates
from paraplan.cost_models.layer import layer_times
from paraplan.cost_models.memory import layer_activation_bytes_per_token, stored_layer_bytes
from paraplan.cost_models.moe import moe_activation_bytes_per_token, moe_block_times
from paraplan.cost_models.moe_eager import (
    BIAS_BACKWARD_BYTES,
    BIAS_FORWARD_BYTES,
    CLAMP_BACKWARD_BYTES,
    CLAMP_FORWARD_BYTES,
    CLAMP_SAVED_BYTES,
    eager_clamp_saved_bytes_per_copy,
    eager_expert_ops_s,
)
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.job import TrainingJob
from paraplan.validation.reference import load_reference_runs, reference_job

GPT_OSS = load_model("gpt-oss-120b")
QWEN3_30B = load_model("qwen3-30b-a3b")
SEQ = 4096


def _rates() -> ComputeRates:
    """Round numbers: 1 TB/s of HBM, 5 µs a launch."""
    return ComputeRates(gemm_flops_per_s=1e15, gemm_half_dim=100.0, gemm_element_bytes=2.0,
                        attention_kernel="flash", attention_flops_per_s=1e15,
                        memory_bytes_per_s=1e12, kernel_overhead_s=5e-6, source="test")


def test_the_byte_counts_are_the_ops_megatron_runs():
    # Clamp: two clamps over f (2 B read + 2 B write each) and a cat of 2f (2 + 2 B): 4 + 4 + 8 = 16 B per f.
    assert CLAMP_FORWARD_BYTES == 2 * (2 + 2) + 2 * (2 + 2)
    # Backward: two masked gradients (read grad and input, write grad: 6 B) and the cat of their gradients (8 B).
    assert CLAMP_BACKWARD_BYTES == 2 * 6 + 8
    # Bias: fp32 b*p written (4), t + b*p (2 + 4 read, 4 written), cat (4 + 4), cast (4 read, 2 written).
    assert BIAS_FORWARD_BYTES == 4 + (2 + 4 + 4) + (4 + 4) + (4 + 2)
    # Backward: cast back (2 + 4), the add's 16-bit gradient (4 + 2), two products (4 + 4) each summed (4).
    assert BIAS_BACKWARD_BYTES == (2 + 4) + (4 + 2) + 2 * (4 + 4 + 4)


def test_gpt_oss_reads_its_clamp_and_biases_and_qwen3_has_neither():
    assert GPT_OSS.expert_bias and GPT_OSS.expert_glu_clamp
    assert not QWEN3_30B.expert_bias and not QWEN3_30B.expert_glu_clamp


def test_eager_ops_by_hand():
    """1,000 copies on 4 local experts of GPT-OSS (h = f = 2,880) at 1 TB/s and 5 µs a launch."""
    copies, h = 1000.0, 2880.0
    times = eager_expert_ops_s(GPT_OSS, np.array([copies]), np.array([4.0]), np.array([h]), False, _rates())
    clamp_fwd = copies * h * 16 / 1e12 + 3 * 5e-6
    bias_fwd = copies * h * 28 / 1e12 + (2 * 4 + 2) * 5e-6
    clamp_bwd = copies * h * 20 / 1e12 + 3 * 5e-6
    bias_bwd = copies * h * 36 / 1e12 + (5 * 4 + 1) * 5e-6
    assert float(times.forward_s[0]) == pytest.approx(clamp_fwd + bias_fwd, rel=1e-12)
    assert float(times.backward_s[0]) == pytest.approx(clamp_bwd + bias_bwd, rel=1e-12)
    assert float(times.clamp_forward_s[0]) == pytest.approx(clamp_fwd, rel=1e-12)


def test_a_fused_grouped_mlp_or_a_plain_expert_costs_nothing_extra():
    for model, fused in ((GPT_OSS, True), (QWEN3_30B, False), (QWEN3_30B, True)):
        times = eager_expert_ops_s(model, np.array([5e4]), np.array([8.0]), np.array([768.0]), fused, _rates())
        assert float(times.forward_s[0]) == float(times.backward_s[0]) == float(times.clamp_forward_s[0]) == 0.0


def _moe(model, fused: bool):
    cluster = load_cluster("dgx-h100", num_gpus=8)
    job = TrainingJob(model=model, seq_len=SEQ, global_batch=64, expert_imbalance=1.0, fused_expert_mlp=fused)
    table = make_table(ep=8, dp=8, mbs=1)
    rates = analytical_rates(cluster.gpu, "bf16")
    return job, table, rates, cluster, moe_block_times(model, job.workload(), table, rates, cluster)


def test_the_eager_ops_run_in_the_experts_node_between_dispatch_and_combine():
    """GPT-OSS, ep 8, one 4,096-token sequence: 4 x 4,096 copies on 16 local experts. The eager path adds exactly
    moe_eager's times to the block's passes and to the ``mlp`` node the overlap schedule pairs; nothing else."""
    _, table, rates, _, fused = _moe(GPT_OSS, True)
    _, _, _, _, eager = _moe(GPT_OSS, False)
    extra = eager_expert_ops_s(GPT_OSS, np.array([4.0 * SEQ]), np.array([16.0]), np.array([2880.0]), False, rates)
    for part, added in (("forward_compute_s", extra.forward_s), ("mlp_forward_s", extra.forward_s),
                        ("backward_compute_s", extra.backward_s), ("mlp_input_grad_s", extra.backward_s)):
        assert float(getattr(eager, part)[0] - getattr(fused, part)[0]) == pytest.approx(float(added[0]), rel=1e-9)
    for part in ("gemm_s", "mlp_weight_grad_s", "expert_comm_s"):
        assert float(getattr(eager, part)[0]) == float(getattr(fused, part)[0])


def test_qwen3_is_priced_alike_on_either_path():
    _, _, _, _, fused = _moe(QWEN3_30B, True)
    _, _, _, _, eager = _moe(QWEN3_30B, False)
    assert float(fused.forward_compute_s[0]) == float(eager.forward_compute_s[0])
    assert float(fused.backward_compute_s[0]) == float(eager.backward_compute_s[0])


def test_recomputing_the_activation_reruns_the_eager_clamp():
    """Megatron's ``moe_act`` recompute checkpoints the bias-activation function, the clamp before the fused kernel
    included: the modules recompute of the eager path exceeds the fused one's by the clamp's forward."""
    job_f, _, rates, cluster, _ = _moe(GPT_OSS, True)
    job_e = TrainingJob(model=GPT_OSS, seq_len=SEQ, global_batch=64, expert_imbalance=1.0)
    table = make_table(ep=8, dp=8, mbs=1, recompute=3)
    fused = layer_times(GPT_OSS, job_f.workload(), table, rates, cluster).recompute_s
    eager = layer_times(GPT_OSS, job_e.workload(), table, rates, cluster).recompute_s
    clamp = eager_expert_ops_s(GPT_OSS, np.array([4.0 * SEQ]), np.array([16.0]), np.array([2880.0]), False, rates)
    assert float(eager[0] - fused[0]) == pytest.approx(float(clamp.clamp_forward_s[0]), rel=1e-9)


def test_reference_rows_state_the_fused_grouped_mlp_where_their_recipe_ran_it():
    """Megatron-Bridge 26.06+ (v0.5.0 scripts/performance/configs/gpt_oss: GB200/GB300 FP8_MX_V2 set
    cutedsl_fused_grouped_mlp, i.e. use_transformer_engine_op_fuser); B300 and every bf16 recipe do not."""
    runs = load_reference_runs().set_index("id", drop=False)
    fused = {i for i in runs.index if reference_job(runs.loc[i]).fused_expert_mlp}
    assert fused == {"nemo_bridge_0005", "nemo_bridge_0006", "nemo_bridge_0021", "nemo_bridge_0022",
                     "nemo_bridge_0044", "nemo_bridge_0045"}


def _cli_estimate(*extra: str) -> dict:
    """``paraplan evaluate`` of GPT-OSS-120B as NeMo's GB300 bf16 recipe lays it out (ep 64, mbs 4): its estimate."""
    args = ["evaluate", "gpt-oss-120b", "--seq-len", "4096", "--global-batch", "1280", "--cluster", "gb300-nvl72",
            "--gpus", "64", "--tp", "1", "--pp", "1", "--ep", "64", "--mbs", "4", "--expert-imbalance", "1",
            "--json", "-", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plans"][0]["estimate"]


def _cli_step_s(*extra: str) -> float:
    """The step in s of :func:`_cli_estimate`."""
    return float(_cli_estimate(*extra)["step_time_s"])


def test_the_command_line_says_when_the_experts_run_fused():
    """The eager path costs 0.55 s of a 2.7 s step here (+20%): 64 x 4,096 x 4 / 64 = 65,536 copies per GPU and micro-
    batch, 100 B x 2,880 each at GB300's HBM rate, over 36 layers and 5 micro-batches."""
    eager, fused = _cli_step_s(), _cli_step_s("--fused-expert-mlp")
    assert 0.15 < eager / fused - 1 < 0.25


# -- memory: what the eager clamp keeps for backward ------------------------------------------------------------


def test_the_eager_clamp_keeps_a_second_copy_of_the_up_output():
    """``x_glu.clamp`` and ``x_linear.clamp`` save their inputs (clamp_backward reads ``self``): views of the up
    projection's 16-bit output, 2 x f elements. The fused activation saves the concatenated clamped halves, another
    2 x f. So a copy of 2 x f x 2 B = 4 B per element of f is kept beyond what a fused or unclamped block keeps."""
    assert CLAMP_SAVED_BYTES == 2 * 2
    assert eager_clamp_saved_bytes_per_copy(GPT_OSS, 2880.0, False) == 4 * 2880
    assert eager_clamp_saved_bytes_per_copy(GPT_OSS, 2880.0, True) == 0.0
    assert eager_clamp_saved_bytes_per_copy(QWEN3_30B, 768.0, False) == 0.0


@pytest.mark.parametrize("tp, etp, expected", [
    # k = 4 copies per token, each 4 B x f_e = 2,880: 46,080 B; tp shares the routed tokens, etp cancels (etp copies
    # each f_e / etp wide).
    (1, 1, 4 * 4 * 2880), (2, 1, 4 * 4 * 2880 / 2), (1, 2, 4 * 4 * 2880), (4, 2, 4 * 4 * 2880 / 4)])
def test_the_moe_block_stores_the_clamps_copy_per_token_on_the_eager_path(tp, etp, expected):
    for gemm_input_bytes in (2.0, 1.0):  # the up output is a 16-bit GEMM output in fp8 training too
        eager = moe_activation_bytes_per_token(GPT_OSS, tp, etp, gemm_input_bytes)
        fused = moe_activation_bytes_per_token(GPT_OSS, tp, etp, gemm_input_bytes, fused_expert_mlp=True)
        assert float(eager - fused) == expected
    assert float(moe_activation_bytes_per_token(QWEN3_30B, tp, etp, 2.0)) == \
        float(moe_activation_bytes_per_token(QWEN3_30B, tp, etp, 2.0, fused_expert_mlp=True))


def test_recompute_that_reruns_the_activation_drops_the_clamps_copy():
    """All 36 GPT-OSS layers are MoE. No recompute and selective (attention core) keep the copy: 46,080 B per token
    at tp 1; full recompute keeps the layer input only, and ``modules`` (moe_act) checkpoints the whole activation,
    the clamp included (experts.py: ``activation_checkpoint.checkpoint(bias_act_func, fc1_output, ...)``)."""
    recompute = np.array([0, 1, 2, 3])
    eager = layer_activation_bytes_per_token(GPT_OSS, 1, 0, recompute)
    fused = layer_activation_bytes_per_token(GPT_OSS, 1, 0, recompute, fused_expert_mlp=True)
    assert (eager - fused).tolist() == [46080.0, 46080.0, 0.0, 0.0]


def test_a_layer_stores_the_clamps_copy_per_micro_batch():
    """GPT-OSS, ep 8 on 8 GPUs, mbs 2 x 4,096 tokens: 8,192 x 46,080 B = 377,487,360 B more per layer and micro-batch
    on the eager path (what ``offload`` would copy, and what 1F1B keeps per micro-batch in flight)."""
    table = make_table(ep=8, dp=8, mbs=2)
    eager = TrainingJob(model=GPT_OSS, seq_len=SEQ, global_batch=64).workload()
    fused = TrainingJob(model=GPT_OSS, seq_len=SEQ, global_batch=64, fused_expert_mlp=True).workload()
    added = stored_layer_bytes(GPT_OSS, eager, table) - stored_layer_bytes(GPT_OSS, fused, table)
    assert float(added[0]) == 2 * SEQ * 4 * 4 * 2880 == 377_487_360


def test_the_eager_path_peaks_higher_by_its_layers_copies():
    """``evaluate`` of the GB300 layout above: pp 1, so one micro-batch's 36 layers are in flight at the peak:
    4 x 4,096 tokens x 46,080 B x 36 layers = 27.18 GB more live tensors than the fused grouped MLP."""
    eager, fused = _cli_estimate(), _cli_estimate("--fused-expert-mlp")
    added = eager["memory_breakdown_bytes"]["activations_bytes"] - fused["memory_breakdown_bytes"]["activations_bytes"]
    assert added == pytest.approx(4 * SEQ * 46080 * 36, rel=1e-9)


def test_the_fused_expert_mlp_keeps_expert_tensor_parallelism_at_one():
    """TEGroupedMLP._is_fused_impl_supported refuses an expert tensor-parallel group larger than one, so the search
    never prices (and export never writes) a fused expert MLP at etp > 1."""
    job = ["qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]
    layout = ["--tp", "2", "--pp", "1", "--ep", "4", "--etp", "2", "--sp", "on"]
    assert CliRunner().invoke(app, ["evaluate", *job, *layout]).exit_code == 0
    refused = CliRunner().invoke(app, ["evaluate", *job, *layout, "--fused-expert-mlp"])
    assert refused.exit_code != 0 and "the fused expert MLP runs expert tensor parallelism 1 only" in refused.output
    planned = CliRunner().invoke(app, ["plan", *job, "--tp", "2", "--sp", "on", "--fused-expert-mlp", "--top", "5",
                                       "--json", "-"])
    assert planned.exit_code == 0, planned.output
    assert {plan["config"]["etp"] for plan in json.loads(planned.stdout)["plans"]} == {1}
