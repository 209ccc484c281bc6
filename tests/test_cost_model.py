"""The cost model: Korthikanti activations, metamorphic relations of the estimate, the batch/row
identity, collectives and GEMM timing. Numbers that depend on calibration constants are derived
from the constants the code exposes, never hard-coded."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from conftest import make_model, make_table

from paraplan.cost_models import collectives
from paraplan.cost_models.collectives import collective_time_s, members_per_domain, p2p_time_s
from paraplan.cost_models.compute import (
    BYTES_PER_ELEMENT,
    analytical_rates,
    gemm_time_s,
    memory_bound_time_s,
)
from paraplan.cost_models.estimate import EstimateTable, estimate, interleaved_p2p_exposed_s
from paraplan.cost_models.memory import (
    MemoryBreakdown,
    attention_scores_bytes_per_token,
    in_flight_chunks_at,
    layer_activation_bytes_per_token,
    stored_layer_bytes,
)
from paraplan.cost_models.recipes import DEEPSPEED_MIXED, FSDP2_MIXED, MEGATRON_MIXED
from paraplan.cost_models.stages import stage_layout
from paraplan.cost_models.table import Workload
from paraplan.hardware_profiles import load_cluster
from paraplan.hardware_profiles.catalog import with_nic
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import enumerate_space

SEQ = 2048
GPT3 = {"num_layers": 96, "hidden_size": 12288, "num_heads": 96, "vocab_size": 50257, "dropout": True}


def work(global_batch: int = 32, seq_len: int = SEQ, precision: str = "bf16", recipe=MEGATRON_MIXED) -> Workload:
    return Workload(seq_len=seq_len, global_batch=global_batch, precision=precision, recipe=recipe)


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("dgx-h100", num_nodes=4)


@pytest.fixture(scope="module")
def gpt():
    return make_model()


# -- Korthikanti et al. 2022 activations ----------------------------------------------------------
def _act(model, tp=1, sp=0, recompute=0):
    return float(layer_activation_bytes_per_token(model, tp=tp, sp=sp, recompute=recompute))


def test_korthikanti_34h_for_gpt3_shapes():
    m = make_model(**GPT3)
    h, a = m.hidden_size, m.num_heads
    assert _act(m) == 34 * h  # flash attention: no s² term
    assert _act(m, recompute=1) == 34 * h  # selective recompute drops only the (absent) scores
    for s in (1024, 2048, 4096):
        total = _act(m) + float(attention_scores_bytes_per_token(m, s, 1))
        assert total == 34 * h + 5 * a * s  # s·b·h·(34 + 5as/h) per token


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_tensor_and_sequence_parallel(t):
    m = make_model(**GPT3)
    h, a = m.hidden_size, m.num_heads
    assert _act(m, tp=t, sp=0) == pytest.approx(10 * h + 24 * h / t, rel=1e-15)
    assert _act(m, tp=t, sp=1) == pytest.approx(34 * h / t, rel=1e-15)
    assert _act(m, tp=t, sp=0, recompute=2) == 2 * h
    assert _act(m, tp=t, sp=1, recompute=2) == pytest.approx(2 * h / t, rel=1e-15)
    assert float(attention_scores_bytes_per_token(m, 2048, t)) == pytest.approx(5 * a * 2048 / t, rel=1e-15)


def test_korthikanti_without_dropout_drops_the_two_masks():
    m = make_model(**{**GPT3, "dropout": False})
    assert _act(m) == 32 * m.hidden_size


def test_activations_generalised_to_gqa_and_gated_mlp():
    m = load_model("llama-3.1-8b")
    h, q, kv, f = m.hidden_size, m.q_width, m.kv_width, m.ffn_size
    replicated = 2 * h + 2 * h + 2 * h + 2 * h  # two norm inputs, QKV input, MLP input (16-bit)
    sharded = 2 * (q + 2 * kv) + 2 * q + 2 * (2 * f) + 2 * f  # Q K V, out-proj input, gate+up outputs, down input
    assert _act(m) == replicated + sharded
    assert _act(m, tp=4) == pytest.approx(replicated + sharded / 4, rel=1e-15)


def test_activation_columns_are_vectorized():
    m = make_model(**GPT3)
    tp = np.array([1, 2, 4, 8, 8])
    sp = np.array([0, 0, 1, 1, 0])
    rc = np.array([0, 2, 0, 2, 1])
    batch = layer_activation_bytes_per_token(m, tp, sp, rc)
    single = [_act(m, int(a), int(b), int(c)) for a, b, c in zip(tp, sp, rc)]
    np.testing.assert_array_equal(batch, single)


# -- helpers for estimate tests -------------------------------------------------------------------
def run(model, cluster, table, **kw) -> EstimateTable:
    return estimate(model, cluster, work(**kw), table)


# -- metamorphic relations ----------------------------------------------------------------------
def test_doubling_tp_halves_per_gpu_weights(gpt, cluster):
    tps = [1, 2, 4, 8]
    est = run(gpt, cluster, make_table(tp=tps))
    weights = est.memory.weights_bytes
    np.testing.assert_allclose(weights * np.array(tps), weights[0], rtol=1e-12, atol=0)
    np.testing.assert_allclose(weights[:-1] / weights[1:], 2.0, rtol=1e-12, atol=0)
    # pp = 1 holds the whole model: bf16 weights, MEGATRON_MIXED.weight_bytes each.
    assert weights[0] == pytest.approx(gpt.total_params() * MEGATRON_MIXED.weight_bytes, rel=1e-12)


@pytest.mark.parametrize("pp, vpp", [(1, 1), (2, 1), (4, 1), (4, 2), (8, 3)])
def test_stage_params_times_tp_is_constant(gpt, pp, vpp):
    base = stage_layout(gpt, 1, pp, vpp)
    for tp in (2, 4, 8):
        layout = stage_layout(gpt, tp, pp, vpp)
        assert float(layout.first_params) * tp == pytest.approx(float(base.first_params), rel=1e-12)
        assert float(layout.last_params) * tp == pytest.approx(float(base.last_params), rel=1e-12)


def test_stage_params_add_up(gpt):
    # pp = 1: the whole model; pp = 2: both halves plus the last stage's copy of the tied embedding.
    assert float(stage_layout(gpt, 1, 1, 1).first_params) == gpt.total_params()
    two = stage_layout(gpt, 1, 2, 1)
    tied_copy = gpt.vocab_size * gpt.hidden_size
    assert float(two.first_params + two.last_params) == gpt.total_params() + tied_copy
    assert int(two.first_layers) + int(two.last_layers) == gpt.num_layers
    # Uneven: 24 layers over pp = 13 does not divide, (24 + 2) / 13 = 2 per stage, one fewer at the edges.
    odd = stage_layout(gpt, 1, 13, 1)
    assert (int(odd.first_layers), int(odd.middle_layers), int(odd.last_layers)) == (1, 2, 1)
    assert int(odd.first_layers) + 11 * int(odd.middle_layers) + int(odd.last_layers) == gpt.num_layers


def test_tp1_has_no_tp_traffic(gpt, cluster):
    est = run(gpt, cluster, make_table(tp=[1, 1, 2, 8], dp=[1, 8, 1, 1], recompute=[0, 2, 0, 2]))
    assert est.tp_comm_s[0] == 0.0 and est.tp_comm_s[1] == 0.0
    assert np.all(est.tp_comm_s[2:] > 0)


def test_pp1_has_no_bubble_and_no_p2p(gpt, cluster):
    est = run(gpt, cluster, make_table(pp=[1, 1, 2, 4], tp=[1, 4, 1, 2], dp=[4, 2, 1, 1]))
    assert np.all(est.bubble_s[:2] == 0.0) and np.all(est.pp_comm_s[:2] == 0.0)
    assert np.all(est.bubble_s[2:] > 0) and np.all(est.pp_comm_s[2:] > 0)


def test_interleaved_sends_wait_only_beyond_one_chunk_of_compute():
    # Hand values: a 2 ms hop; a stage of 4 ms forward and 8 ms backward over 4 chunks gives 1 ms and 2 ms
    # per chunk, so each forward send waits 1 ms and each backward send 0: 4 x (1 + 0) = 4 ms per micro-batch.
    assert interleaved_p2p_exposed_s(2e-3, 4, 4e-3, 8e-3) == pytest.approx(4e-3)
    # A hop shorter than every chunk hides completely; twice the chunks, twice the sends.
    assert interleaved_p2p_exposed_s(0.5e-3, 4, 4e-3, 8e-3) == 0.0
    assert interleaved_p2p_exposed_s(5e-3, 4, 4e-3, 8e-3) == pytest.approx(4 * (4e-3 + 3e-3))
    assert interleaved_p2p_exposed_s(5e-3, 8, 4e-3, 8e-3) == pytest.approx(8 * (4.5e-3 + 4e-3))


def test_interleaving_thin_chunks_over_a_slow_link_pays_for_its_sends(gpt, cluster):
    # pp = 4 over 4 nodes (dp = 8 inside each): every pipeline hop crosses the network. On the cluster's own
    # NICs a chunk's compute hides its sends, so the pipeline's p2p is the fill alone, whatever vpp is.
    table = make_table(pp=4, dp=8, vpp=[2, 3, 6])
    fast = run(gpt, cluster, table)
    assert fast.pp_comm_s[0] == pytest.approx(fast.pp_comm_s[1]) == pytest.approx(fast.pp_comm_s[2])
    # At 0.1 GB/s per GPU the hop outlasts even a 4-layer chunk: the steady sends add up, more with more chunks.
    slow = run(gpt, with_nic(cluster, 0.1e9), table)
    assert slow.pp_comm_s[0] > fast.pp_comm_s[0]
    assert slow.pp_comm_s[0] < slow.pp_comm_s[1] < slow.pp_comm_s[2]


def test_cp1_has_no_cp_traffic(gpt, cluster):
    est = run(gpt, cluster, make_table(cp=[1, 1, 2], tp=[1, 8, 2], sp=[0, 1, 1]))
    assert est.cp_comm_s[0] == 0.0 and est.cp_comm_s[1] == 0.0
    assert est.cp_comm_s[2] >= 0.0


def test_dp1_has_no_dp_traffic(gpt, cluster):
    # Gradients reduce over the dp·cp group (CP ranks share weights): dp = cp = 1 means no traffic.
    est = run(
        gpt,
        cluster,
        make_table(dp=[1, 1, 1, 2, 8, 1], tp=[1, 8, 2, 1, 1, 2], cp=[1, 1, 1, 1, 1, 2], zero=[0, 0, 0, 0, 1, 1]),
    )
    assert np.all(est.dp_comm_s[:3] == 0.0)
    assert np.all(est.dp_comm_s[3:] > 0)


def test_more_microbatches_shrink_the_bubble_share(gpt, cluster):
    batches = [4, 8, 16, 32, 64, 128]
    shares, bubbles = [], []
    for gbs in batches:
        est = run(gpt, cluster, make_table(pp=4, tp=2), global_batch=gbs)
        assert float(est.num_microbatches[0]) == gbs
        shares.append(float(est.bubble_s[0] / est.step_time_s[0]))
        bubbles.append(float(est.bubble_s[0]))
    assert all(a > b for a, b in itertools.pairwise(shares))
    # 1F1B: the fill/drain time (p − 1)·(t_f + t_b) does not depend on the micro-batch count.
    np.testing.assert_allclose(bubbles, bubbles[0], rtol=1e-12, atol=0)


def test_interleaving_divides_the_bubble_by_v(gpt, cluster):
    est = run(gpt, cluster, make_table(pp=4, tp=2, vpp=[1, 2, 3]), global_batch=32)
    assert est.bubble_s[1] < est.bubble_s[0]
    # 24 layers split evenly over 4 x 2 and 4 x 3 chunks: same stages, bubble / v (Narayanan et al. 2021).
    assert est.bubble_s[1] == pytest.approx(est.bubble_s[0] / 2, rel=1e-12)
    assert est.bubble_s[2] == pytest.approx(est.bubble_s[0] / 3, rel=1e-12)


def test_full_recompute_costs_time_and_saves_activations(gpt, cluster):
    est = run(gpt, cluster, make_table(tp=2, pp=2, dp=2, recompute=[0, 1, 2]), global_batch=16)
    assert est.step_time_s[2] > est.step_time_s[0]
    assert est.step_time_s[1] >= est.step_time_s[0]
    assert est.memory.activations_bytes[2] < est.memory.activations_bytes[0]
    assert est.memory.peak_bytes[2] < est.memory.peak_bytes[0]
    assert est.compute_s[2] > est.compute_s[0]


def test_zero1_shards_the_optimizer_over_dp(gpt, cluster):
    est = run(gpt, cluster, make_table(dp=8, zero=[0, 1]))
    params = float(stage_layout(gpt, 1, 1, 1).first_params)
    optimizer = est.memory.optimizer_bytes
    assert optimizer[0] == pytest.approx(8 * optimizer[1], rel=1e-12)
    # Megatron bf16: fp32 master + Adam m, v = 12 B/param; distributed optimizer over dp = 8: 1.5.
    assert optimizer[0] / params == pytest.approx(12.0, rel=1e-12)
    assert optimizer[1] / params == pytest.approx(1.5, rel=1e-12)
    assert est.memory.weights_bytes[0] == est.memory.weights_bytes[1]
    assert est.memory.grads_bytes[0] == est.memory.grads_bytes[1]


def test_recipe_bytes_per_param_follow_the_zero_paper():
    dp = 8
    # Megatron bf16: 18 B/param; distributed optimizer 6 + 12/dp (DESIGN section 4).
    assert float(MEGATRON_MIXED.state_bytes_per_param(0, dp)) == 18.0
    assert float(MEGATRON_MIXED.state_bytes_per_param(1, dp)) == 6 + 12 / dp
    # Rajbhandari et al. 2020 with K = 12: (2 + 2 + K), 4 + K/N, 2 + (2 + K)/N, (2 + 2 + K)/N.
    assert float(DEEPSPEED_MIXED.state_bytes_per_param(0, dp)) == 16.0
    assert float(DEEPSPEED_MIXED.state_bytes_per_param(1, dp)) == 4 + 12 / dp
    assert float(DEEPSPEED_MIXED.state_bytes_per_param(2, dp)) == 2 + 14 / dp
    assert float(DEEPSPEED_MIXED.state_bytes_per_param(3, dp)) == 16 / dp
    # FSDP2 shards everything from stage 2 (reshard-after-forward off) on.
    assert float(FSDP2_MIXED.state_bytes_per_param(2, dp)) == 16 / dp
    np.testing.assert_array_equal(MEGATRON_MIXED.state_bytes_per_param(np.array([0, 1]), np.array([4, 4])), [18.0, 9.0])


def test_busiest_middle_rank_can_be_the_peak(cluster):
    # 46 layers on pp 8: Megatron's edge-accounted split gives 5 layers to the first and last stage and 6 to
    # each middle one. Under 1F1B rank 1 holds 7 micro-batches of 6 layers (42 layer-micro-batches), rank 0
    # holds 8 of 5 (40) plus the embedding output: with a small vocabulary the middle rank peaks.
    model = make_model(num_layers=46, vocab_size=1024)
    table = make_table(pp=8, tp=1, dp=1, mbs=1, recompute=0)
    est = run(model, cluster, table, global_batch=64)
    mem = est.memory
    assert int(mem.worst_stage[0]) == 2
    per_layer = float(stored_layer_bytes(model, work(global_batch=64), table)[0])
    assert float(mem.activations_bytes[0]) == pytest.approx(6 * 7 * per_layer, rel=1e-12)
    assert float(mem.allocated_bytes[0]) > float(mem.first_allocated_bytes[0])
    assert float(in_flight_chunks_at(8, 1, 64, 1)) == 7
    assert float(in_flight_chunks_at(8, 3, 64, 1)) == (8 - 1 - 1) * 2 + (3 - 1) * 8 + 1


def test_first_stage_holds_min_p_m_microbatches(gpt, cluster):
    # 1F1B: the first stage keeps min(p, m) micro-batches in flight;
    # interleaving multiplies that by 1 + (p−1)/(p·v).
    est = run(gpt, cluster, make_table(pp=4, tp=8), global_batch=2)
    few = est.memory
    est = run(gpt, cluster, make_table(pp=4, tp=8, vpp=[1, 2]), global_batch=64)
    many = est.memory
    assert np.all(few.worst_stage == 0) and np.all(many.worst_stage == 0)
    assert many.activations_bytes[0] == pytest.approx(2 * few.activations_bytes[0], rel=1e-12)
    assert many.activations_bytes[1] == pytest.approx(many.activations_bytes[0] * (1 + 3 / 8), rel=1e-12)


VARIED = {
    "tp": [1, 2, 4, 8, 2, 1, 4, 8, 1, 2],
    "pp": [1, 2, 1, 2, 4, 8, 2, 1, 2, 1],
    "dp": [8, 2, 4, 1, 2, 2, 1, 2, 4, 4],
    "cp": [1, 1, 2, 1, 1, 1, 2, 2, 2, 2],
    "vpp": [1, 2, 1, 3, 2, 1, 1, 1, 1, 1],
    "mbs": [1, 2, 1, 1, 2, 1, 4, 1, 2, 1],
    "zero": [1, 0, 1, 0, 1, 0, 0, 3, 1, 3],
    "recompute": [0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
    "sp": [0, 1, 1, 0, 1, 0, 1, 1, 0, 1],
}


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_breakdown_sums_to_step_time(gpt, cluster, precision):
    est = run(gpt, cluster, make_table(**VARIED), global_batch=64, precision=precision)
    parts = (
        est.compute_s + est.tp_comm_s + est.cp_comm_s + est.pp_comm_s + est.bubble_s + est.dp_comm_s + est.optimizer_s
    )
    np.testing.assert_allclose(parts, est.step_time_s, rtol=1e-9, atol=0)
    for name in ("compute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "optimizer_s"):
        assert np.all(getattr(est, name) >= 0), name
    assert np.all(est.step_time_s > 0)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_throughput_and_mfu_definitions(gpt, cluster, precision):
    gbs = 64
    table = make_table(**VARIED)
    est = run(gpt, cluster, table, global_batch=gbs, precision=precision)
    num_gpus = table.tp * table.pp * table.dp * table.cp
    np.testing.assert_allclose(est.tokens_per_s, gbs * SEQ / est.step_time_s, rtol=1e-12, atol=0)
    np.testing.assert_allclose(est.tokens_per_s_per_gpu, est.tokens_per_s / num_gpus, rtol=1e-12, atol=0)
    peak = cluster.gpu.peak(precision)
    flops = gpt.model_flops_per_token(SEQ, "full")
    np.testing.assert_allclose(est.mfu, flops * est.tokens_per_s / (num_gpus * peak), rtol=1e-12, atol=0)
    np.testing.assert_allclose(est.model_flops_per_s_per_gpu, est.mfu * peak, rtol=1e-12, atol=0)
    assert np.all((est.mfu > 0) & (est.mfu < 1))
    assert np.all(est.hfu >= est.mfu)
    np.testing.assert_allclose(est.num_microbatches, gbs / (table.dp * table.mbs), rtol=0, atol=0)


def test_memory_breakdown_sums_to_peak(gpt, cluster):
    est = run(gpt, cluster, make_table(**VARIED), global_batch=64)
    mem = est.memory
    parts = (
        mem.weights_bytes
        + mem.grads_bytes
        + mem.optimizer_bytes
        + mem.activations_bytes
        + mem.logits_bytes
        + mem.transient_bytes
        + mem.reserve_bytes
    )
    np.testing.assert_allclose(parts, mem.peak_bytes, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(est.fits, mem.peak_bytes <= cluster.gpu.hbm_bytes)


# -- batch answer == one-at-a-time answer ---------------------------------------------------------
def _varied_rows(engine: str, model, cluster, count=50):
    job = TrainingJob(model=model, seq_len=SEQ, global_batch=64, engine=engine)
    table = enumerate_space(job, cluster, engine_rules(engine)).table
    rng = np.random.default_rng(7)
    index = np.sort(rng.choice(len(table), size=min(count, len(table)), replace=False))
    return job, table.take(index)


def _assert_rows_equal(batch, single, row):
    for field in dataclasses.fields(EstimateTable):
        if field.name == "memory":
            for mem_field in dataclasses.fields(MemoryBreakdown):
                b = np.broadcast_to(getattr(batch.memory, mem_field.name), batch.step_time_s.shape)[row]
                s = np.broadcast_to(getattr(single.memory, mem_field.name), single.step_time_s.shape)[0]
                np.testing.assert_allclose(s, b, rtol=1e-12, atol=0, err_msg=f"memory.{mem_field.name}")
        elif field.name == "cost_model":
            assert batch.cost_model == single.cost_model
        else:
            b = np.broadcast_to(getattr(batch, field.name), batch.step_time_s.shape)[row]
            s = np.broadcast_to(getattr(single, field.name), single.step_time_s.shape)[0]
            np.testing.assert_allclose(s, b, rtol=1e-12, atol=0, err_msg=field.name)


@pytest.mark.parametrize("engine, precision", [("megatron", "bf16"), ("deepspeed", "bf16"), ("torchtitan", "fp8")])
def test_batch_equals_one_at_a_time(engine, precision, cluster):
    model = load_model("llama-3.1-8b")
    job, table = _varied_rows(engine, model, cluster)
    assert len(table) == 50
    for axis in ("tp", "pp", "mbs", "recompute"):
        assert len(set(getattr(table, axis).tolist())) > 1, axis
    w = dataclasses.replace(job, precision=precision).workload()
    batch = estimate(model, cluster, w, table)
    for row in range(len(table)):
        single = estimate(model, cluster, w, table.take(np.array([row])))
        _assert_rows_equal(batch, single, row)


# -- collectives ----------------------------------------------------------------------------------
SIZE = 256 * 2**20  # 256 MiB


def _nvlink(cluster):
    return cluster.gpu.nvlink_bytes_per_s * cluster.gpu.efficiency.nvlink_frac


def _nic(cluster):
    return cluster.nic_bytes_per_s_per_gpu * cluster.gpu.efficiency.nic_frac / cluster.oversubscription


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_inside_one_domain(cluster, n):
    # Ring all-reduce: 2(n−1)/n · S over the NVLink bus bandwidth; the code's α term is
    # 2 · α_intra · log2(n) (bus factor 2 times a log-depth latency), no inter-node term.
    expected = 2 * (n - 1) / n * SIZE / _nvlink(cluster) + 2 * cluster.intra_domain_latency_s * np.log2(n)
    got = float(collective_time_s("all_reduce", SIZE, n, 1, cluster))
    assert got == pytest.approx(expected, rel=1e-12)


def test_hierarchical_all_reduce_across_nodes(cluster):
    # 32 ranks, TP-innermost stride 1: 8 per NVLink domain, 4 domains exchanging S/8 each over the NICs.
    k, domains = 8, 4
    expected = (
        2 * (k - 1) / k * SIZE / _nvlink(cluster)
        + 2 * (domains - 1) / domains * (SIZE / k) / _nic(cluster)
        + 2 * (cluster.intra_domain_latency_s * np.log2(k) + cluster.inter_node_latency_s * np.log2(domains))
    )
    assert float(collective_time_s("all_reduce", SIZE, 32, 1, cluster)) == pytest.approx(expected, rel=1e-12)
    # Stride 8 (a DP group over TP = 8): one member per domain, everything over the NICs.
    expected = 2 * 3 / 4 * SIZE / _nic(cluster) + 2 * cluster.inter_node_latency_s * np.log2(4)
    assert float(collective_time_s("all_reduce", SIZE, 4, 8, cluster)) == pytest.approx(expected, rel=1e-12)


def test_members_per_domain(cluster):
    assert float(members_per_domain(8, 1, cluster)) == 8
    assert float(members_per_domain(4, 1, cluster)) == 4
    assert float(members_per_domain(8, 2, cluster)) == 4
    assert float(members_per_domain(4, 8, cluster)) == 1
    assert float(members_per_domain(32, 1, cluster)) == 8


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_group_of_one_costs_nothing(cluster, kind):
    assert float(collective_time_s(kind, SIZE, 1, 1, cluster)) == 0.0
    assert float(collective_time_s(kind, SIZE, 1, 8, cluster)) == 0.0
    assert float(p2p_time_s(SIZE, 1, 8, cluster)) == 0.0


def test_spanning_two_domains_is_slower(cluster):
    inside = float(collective_time_s("all_reduce", SIZE, 8, 1, cluster))
    spanning = float(collective_time_s("all_reduce", SIZE, 8, 2, cluster))  # ranks 0, 2, ..., 14
    assert spanning > inside
    assert float(p2p_time_s(SIZE, 2, 8, cluster)) > float(p2p_time_s(SIZE, 2, 4, cluster))


def test_p2p_times(cluster):
    assert float(p2p_time_s(SIZE, 2, 4, cluster)) == pytest.approx(
        SIZE / _nvlink(cluster) + cluster.intra_domain_latency_s, rel=1e-12
    )
    assert float(p2p_time_s(SIZE, 4, 8, cluster)) == pytest.approx(
        SIZE / _nic(cluster) + cluster.inter_node_latency_s, rel=1e-12
    )


@pytest.mark.parametrize("n, stride", [(2, 1), (8, 1), (16, 1), (4, 8), (8, 2)])
def test_all_gather_is_half_an_all_reduce(cluster, n, stride):
    def bandwidth_term(kind):
        # Time is affine in size: the difference of two sizes isolates the bandwidth term.
        return float(
            collective_time_s(kind, 2 * SIZE, n, stride, cluster) - collective_time_s(kind, SIZE, n, stride, cluster)
        )

    all_reduce = bandwidth_term("all_reduce")
    assert bandwidth_term("all_gather") == pytest.approx(all_reduce / 2, rel=1e-12)
    assert bandwidth_term("reduce_scatter") == pytest.approx(all_reduce / 2, rel=1e-12)
    assert all_reduce > 0


def test_oversubscription_slows_only_the_nic_part(cluster):
    slow = dataclasses.replace(cluster, oversubscription=2.0)
    inside = float(collective_time_s("all_reduce", SIZE, 8, 1, cluster))
    assert float(collective_time_s("all_reduce", SIZE, 8, 1, slow)) == inside
    inter = 2 * (3 / 4) * SIZE / _nic(cluster)  # 4 domains, one member each
    delta = float(
        collective_time_s("all_reduce", SIZE, 4, 8, slow) - collective_time_s("all_reduce", SIZE, 4, 8, cluster)
    )
    assert delta == pytest.approx(inter, rel=1e-12)


def test_collectives_are_vectorized(cluster):
    sizes = np.array([1e3, 1e6, 1e9, 1e9, 5e8])
    groups = np.array([1, 2, 8, 16, 4])
    strides = np.array([1, 1, 1, 1, 8])
    batch = collective_time_s("all_reduce", sizes, groups, strides, cluster)
    single = [float(collective_time_s("all_reduce", s, g, st, cluster)) for s, g, st in zip(sizes, groups, strides)]
    np.testing.assert_array_equal(batch, single)
    assert collectives._BUS_FACTOR["all_reduce"] == 2 * collectives._BUS_FACTOR["all_gather"]


# -- compute ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rates():
    return analytical_rates(load_cluster("dgx-h100", num_nodes=1).gpu, "bf16")


def test_analytical_rates_follow_the_catalog():
    gpu = load_cluster("dgx-h100", num_nodes=1).gpu
    eff = gpu.efficiency
    bf16 = analytical_rates(gpu, "bf16")
    fp8 = analytical_rates(gpu, "fp8")
    assert bf16.gemm_flops_per_s == gpu.peak("bf16") * eff.gemm_peak_frac["bf16"]
    assert fp8.gemm_flops_per_s == gpu.peak("fp8") * eff.gemm_peak_frac["fp8"]
    assert fp8.gemm_element_bytes == BYTES_PER_ELEMENT["fp8"] == 1.0
    assert bf16.memory_bytes_per_s == gpu.hbm_bytes_per_s * eff.hbm_frac
    fused_rate = gpu.peak("bf16") * eff.attention_peak_frac["fused"]
    assert bf16.attention_flops_per_s == fp8.attention_flops_per_s == fused_rate
    flash = analytical_rates(gpu, "bf16", "flash")
    assert flash.attention_flops_per_s == gpu.peak("bf16") * eff.attention_peak_frac["flash"]
    unfused = analytical_rates(gpu, "bf16", "unfused")
    assert unfused.attention_flops_per_s == bf16.gemm_flops_per_s  # batched GEMMs at the bf16 GEMM rate
    pytorch_fp8 = analytical_rates(gpu, "fp8", kernel_stack="pytorch")
    assert pytorch_fp8.gemm_flops_per_s == gpu.peak("fp8") * eff.stack_gemm_peak_frac["pytorch"]["fp8"]
    assert analytical_rates(gpu, "bf16", kernel_stack="pytorch").gemm_flops_per_s == bf16.gemm_flops_per_s
    assert bf16.kernel_overhead_s == eff.kernel_overhead_s


def test_huge_gemm_approaches_peak(rates):
    n = 65536
    ideal = 2.0 * n**3 / rates.gemm_flops_per_s
    got = float(gemm_time_s(n, n, n, rates))
    assert ideal < got < 1.01 * ideal
    bigger = 4 * n
    assert float(gemm_time_s(bigger, bigger, bigger, rates)) / (2.0 * bigger**3 / rates.gemm_flops_per_s) < got / ideal


def test_tiny_gemm_is_kernel_overhead(rates):
    got = float(gemm_time_s(8, 8, 8, rates))
    assert got >= rates.kernel_overhead_s
    assert got - rates.kernel_overhead_s < 0.1 * rates.kernel_overhead_s


def test_gemm_saturation_formula(rates):
    m, n, k = 4096, 8192, 2048
    sat = np.prod([d / (d + rates.gemm_half_dim) for d in (m, n, k)])
    compute = 2.0 * m * n * k / (rates.gemm_flops_per_s * sat)
    memory = (rates.gemm_element_bytes * (m * k + k * n) + 2.0 * m * n) / rates.memory_bytes_per_s
    assert compute > memory  # compute-bound shape
    assert float(gemm_time_s(m, n, k, rates)) == pytest.approx(compute + rates.kernel_overhead_s, rel=1e-12)


def test_skinny_gemm_is_slower_per_flop(rates):
    square = float(gemm_time_s(4096, 4096, 4096, rates)) / (2.0 * 4096**3)
    skinny = float(gemm_time_s(16, 4096, 4096 * 256, rates)) / (2.0 * 16 * 4096 * 4096 * 256)
    assert skinny > square


def test_memory_bound_time(rates):
    got = float(memory_bound_time_s(1e9, 3, rates))
    assert got == pytest.approx(1e9 / rates.memory_bytes_per_s + 3 * rates.kernel_overhead_s, rel=1e-12)
