"""MoE training, part 2: Megatron's combined-1F1B slots for the expert all-to-alls (hand-derived), the split of
dispatch and combine into their four directions, and the per-row breakdown of the reference runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import make_table

from paraplan.cost_models.collectives import all_to_all_time_s, collective_time_s
from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.layer import COMM_SM_FRAC, _paired_expert_comm_s, layer_times, unpaired_microbatches
from paraplan.cost_models.moe import MoETimes, moe_block_times
from paraplan.planner.job import TrainingJob
from paraplan.validation.reference import Prediction, breakdown, container_of, grouped_errors

SEQ = 4096


def _moe(mlp: tuple[float, float, float], a2a: float) -> MoETimes:
    """An MoE block whose mlp node takes (forward, input-gradient, weight-gradient) seconds and whose four
    all-to-alls take ``a2a`` seconds each; the rest of MoETimes does not enter the slots."""
    one = np.array([1.0])
    forward, input_grad, weight_grad = (np.array([v]) for v in mlp)
    comm = np.array([a2a])
    return MoETimes(forward_compute_s=one, backward_compute_s=one, expert_comm_s=4 * comm, gemm_s=one,
                    mlp_forward_s=forward, mlp_input_grad_s=input_grad, mlp_weight_grad_s=weight_grad,
                    dispatch_forward_comm_s=comm, combine_forward_comm_s=comm, dispatch_backward_comm_s=comm,
                    combine_backward_comm_s=comm)


def _paired(moe: MoETimes, attention_fwd: float, attention_bwd: float) -> float:
    return float(_paired_expert_comm_s(moe, np.array([attention_fwd]), np.array([attention_bwd]),
                                       np.array([False]))[0])


def test_all_to_alls_shorter_than_their_slots_cost_only_the_sms_they_hold():
    # Slots: max(0.5, attn_fwd 1) = 1; max(max(1 + 1, 0.5) + 1, max(1, 0.5) + 0.5) = 3; max(0.5, attn_bwd 2) = 2.
    # 6 s, the compute alone: nothing exposed; the 2 s of all-to-all run beside compute holding 20/132 of the SMs.
    assert _paired(_moe((1.0, 1.0, 1.0), 0.5), 1.0, 2.0) == pytest.approx(COMM_SM_FRAC * 2.0, rel=1e-12)


def test_a_short_attention_node_cannot_hide_the_combine_beside_it():
    # The layer's compute (6.6 s) outlasts its all-to-alls (4 s), so hiding them in aggregate would expose nothing;
    # slot by slot: max(1, 0.2) = 1, max(max(4, 1) + 2, max(2, 1) + 1) = 6, max(1, 0.4) = 1: 8 s, 1.4 s exposed, and
    # the other 2.6 s of all-to-all slow the compute beside them.
    exposed = 8.0 - 6.6
    assert _paired(_moe((2.0, 2.0, 2.0), 1.0), 0.2, 0.4) == pytest.approx(exposed + COMM_SM_FRAC * (4.0 - exposed),
                                                                         rel=1e-12)


def test_the_forward_experts_wait_for_their_dispatch():
    # A dispatch longer than the backward mlp: slot 2 = max(max(1 + 1, 5) + 1, max(1, 5) + 5) = 10 against 3 s of
    # compute; slots 1 and 3 hide their 5 s combines under 5 s of attention each. Exposed 7 s.
    assert _paired(_moe((1.0, 1.0, 1.0), 5.0), 5.0, 5.0) == pytest.approx(7.0 + COMM_SM_FRAC * 13.0, rel=1e-12)


def _work(model, **kw):
    return TrainingJob(model=model, seq_len=SEQ, global_batch=64, expert_imbalance=1.0, **kw).workload()


def test_the_four_directions_add_up_to_the_expert_traffic(mixtral, h100x16):
    """etp 2, ep 8: each direction is one all-to-all of the k·T/tp routed copies (16-bit) plus one etp collective of
    the etp-gathered copies: an all-gather before the experts (dispatch forward, combine backward), a reduce-scatter
    after them (combine forward, dispatch backward)."""
    t = make_table(tp=2, ep=8, etp=2, dp=8, sp=1)
    moe = moe_block_times(mixtral, _work(mixtral), t, analytical_rates(h100x16.gpu, "bf16"), h100x16)
    tokens = SEQ / 2
    sent = mixtral.experts_per_token * tokens * mixtral.hidden_size * 2.0
    a2a = all_to_all_time_s(sent, 8, 2, h100x16)
    gather = collective_time_s("all_gather", 2 * sent, 2, 1, h100x16)
    scatter = collective_time_s("reduce_scatter", 2 * sent, 2, 1, h100x16)
    assert moe.dispatch_forward_comm_s[0] == pytest.approx(a2a + gather, rel=1e-12)
    assert moe.combine_forward_comm_s[0] == pytest.approx(a2a + scatter, rel=1e-12)
    assert moe.dispatch_backward_comm_s[0] == pytest.approx(a2a + scatter, rel=1e-12)
    assert moe.combine_backward_comm_s[0] == pytest.approx(a2a + gather, rel=1e-12)
    assert moe.expert_comm_s[0] == pytest.approx(4 * a2a + 2 * (gather + scatter), rel=1e-12)


def test_full_recompute_replays_the_forward_dispatch_and_combine(mixtral, h100x16):
    t = make_table(ep=8, dp=16, recompute=[0, 2])
    lt = layer_times(mixtral, _work(mixtral), t, analytical_rates(h100x16.gpu, "bf16"), h100x16)
    assert lt.ep_comm_s[1] == pytest.approx(1.5 * lt.ep_comm_s[0], rel=1e-12)  # four all-to-alls and two again


def test_the_first_rank_runs_its_warm_up_forwards_and_cool_down_backwards_alone():
    """pp 1: the first forward and the last backward (one micro-batch). pp 4 × vpp 12, m 64: rank 0 runs
    (4 − 1)·2 + 11·4 + 1 = 51 warm-up chunks, 51/12 micro-batches. pp 8 × vpp 2 with m 4: 2·7 + 8 + 1 = 23 exceeds
    the 8 chunks there are, so all 4 micro-batches run alone. Without the overlap nothing is paired to begin with."""
    t = make_table(pp=[1, 4, 8, 4], vpp=[1, 12, 2, 12], ep=8, ep_overlap=[1, 1, 1, 0])
    assert unpaired_microbatches(t, np.array([8.0, 64.0, 4.0, 64.0])).tolist() == pytest.approx([1.0, 51 / 12, 4.0,
                                                                                              0.0], rel=1e-12)


def test_without_a_partner_a_layer_waits_for_all_of_its_expert_traffic(mixtral, h100x16):
    t = make_table(ep=8, dp=16, ep_overlap=[0, 1])
    lt = layer_times(mixtral, _work(mixtral), t, analytical_rates(h100x16.gpu, "bf16"), h100x16)
    assert lt.ep_comm_unpaired_s[1] == pytest.approx(lt.ep_comm_s[0], rel=1e-12)
    assert lt.ep_comm_unpaired_s[0] == pytest.approx(lt.ep_comm_s[0], rel=1e-12)
    assert lt.ep_comm_s[1] < lt.ep_comm_s[0]


def test_the_container_is_read_from_the_table_cell():
    assert container_of("performance-summary-archive.md; 26.06.01 NeMo container; DGX-GB300; pre-training") \
        == "26.06.01"
    assert container_of("Table 1 (weak scaling)") == ""


def test_the_breakdown_groups_rows_by_model_gpu_and_container():
    frame = pd.DataFrame({
        "id": ["a", "b", "c"], "model": ["qwen3-30b-a3b"] * 3, "gpu": ["gb200", "gb200", "gb300"],
        "table": ["x; 26.06 NeMo container; DGX-GB200", "x; 26.06 NeMo container; DGX-GB200",
                  "x; 26.08 NeMo container; DGX-GB300"],
        "tp": [1, 1, 1], "pp": [1, 1, 1], "vpp": [np.nan] * 3, "ep": [8, 8, 8], "mbs": [4, 4, 8],
        "ep_overlap": [1, 1, 1], "precision": ["fp8"] * 3, "fp8_recipe": ["mxfp8"] * 3})
    group = "src (MoE)"
    predictions = [Prediction("a", "src", 100.0, 110.0, "", True), Prediction("b", "src", 100.0, 80.0, "", True),
                   Prediction("c", "src", 100.0, 150.0, "", True), Prediction("d", "other", 1.0, 1.0, "", False)]
    rows = breakdown(frame, predictions, group)
    assert [r.run_id for r in rows] == ["a", "b", "c"]
    assert rows[0].layout == "tp1 pp1 ep8 mbs4 ov1 mxfp8"
    summary = grouped_errors(rows)
    assert summary[("qwen3-30b-a3b", "gb200", "26.06")] == pytest.approx((2, -0.05, 0.2))
    assert summary[("qwen3-30b-a3b", "gb300", "26.08")] == pytest.approx((1, 0.5, 0.5))
