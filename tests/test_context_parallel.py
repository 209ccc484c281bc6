"""Context-parallel variants: hand-derived volumes, exact relations between variants, engine rules,
the search, the CLI and the Megatron flags."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_bad_input, make_table
from typer.testing import CliRunner

from paraplan.choices import CP_COMM_CODES
from paraplan.cli.app import app
from paraplan.cost_models.collectives import all_to_all_time_s, collective_time_s, p2p_time_s
from paraplan.cost_models.compute import analytical_rates
from paraplan.cost_models.context_parallel import cp_comm_s, hierarchical_inner_size, ring_hop_bytes, ulysses_bytes
from paraplan.cost_models.layer import layer_times
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.space import enumerate_space

A2A, P2P, GATHER, HIER = (CP_COMM_CODES[name] for name in ("a2a", "p2p", "allgather", "a2a+p2p"))
runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama-3.1-70b")


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def h100x32():
    return load_cluster("dgx-h100", num_gpus=32)


def test_ulysses_and_ring_volumes_by_hand(llama70b):
    # Llama-3.1-70B: 64 query heads, 8 KV heads of 128; tp = 8 leaves 8 query and 1 KV head per rank.
    tokens = 4096
    before, after = ulysses_bytes(llama70b, tokens, 8)
    assert before == tokens * (8 * 128 + 2 * 1 * 128) * 2 == 10_485_760  # Q, K, V in, 16-bit
    assert after == tokens * 8 * 128 * 2 == 8_388_608  # the attention output back
    assert ring_hop_bytes(llama70b, tokens, 8) == tokens * 2 * 128 * 2 == 2_097_152  # K and V of the chunk


def test_mla_expands_keys_and_values_per_head():
    v3 = load_model("deepseek-v3")  # 128 heads, keys of 128 + 64, values of 128
    assert ring_hop_bytes(v3, 1, 1) == 128 * (192 + 128) * 2
    assert ulysses_bytes(v3, 1, 1) == (128 * (192 + 192 + 128) * 2, 128 * 128 * 2)


def test_ulysses_is_two_unhidden_all_to_alls_each_way(llama70b, h100x32):
    tokens, attention = 4096, 1.0  # however long attention runs, nothing hides Ulysses
    forward, backward = cp_comm_s(llama70b, tokens, 2, 4, A2A, h100x32, attention, 2.5 * attention)
    before, after = ulysses_bytes(llama70b, tokens, 2)
    expected = all_to_all_time_s(before, 4, 2, h100x32) + all_to_all_time_s(after, 4, 2, h100x32)
    assert forward == pytest.approx(expected, rel=1e-12) and backward == pytest.approx(expected, rel=1e-12)


def test_ring_hides_under_attention_and_shows_when_attention_is_short(llama8b, h100x32):
    tokens, cp = 2048, 4
    hop = p2p_time_s(ring_hop_bytes(llama8b, tokens, 1), cp, 1, h100x32)
    long_fwd, long_bwd = cp_comm_s(llama8b, tokens, 1, cp, P2P, h100x32, 1.0, 2.5)
    assert long_fwd == 0.0 and long_bwd == 0.0
    short_fwd, short_bwd = cp_comm_s(llama8b, tokens, 1, cp, P2P, h100x32, 0.0, 0.0)
    assert short_fwd == pytest.approx(3 * hop, rel=1e-12) and short_bwd == pytest.approx(6 * hop, rel=1e-12)


def test_allgather_blocks_in_transformer_engine_and_overlaps_the_local_chunk_in_pytorch(llama8b, h100x32):
    tokens, cp, attention = 2048, 8, 1e-3
    full = ring_hop_bytes(llama8b, tokens, 1) * cp
    gather = collective_time_s("all_gather", full, cp, 1, h100x32)
    scatter = collective_time_s("reduce_scatter", full, cp, 1, h100x32)
    forward, backward = cp_comm_s(llama8b, tokens, 1, cp, GATHER, h100x32, attention, 2.5 * attention)
    assert forward == pytest.approx(gather, rel=1e-12)
    assert backward == pytest.approx(gather + scatter, rel=1e-12)
    overlapped, _ = cp_comm_s(llama8b, tokens, 1, cp, GATHER, h100x32, attention, 2.5 * attention,
                              gather_overlaps_local=True)
    assert overlapped == pytest.approx(max(gather - attention / cp, 0.0), rel=1e-12)


def test_hierarchical_group_sizes(llama8b, llama70b, h100x32):
    # Llama-3.1-8B: 32 query heads, 8 KV heads; an 8-GPU NVLink domain.
    assert list(hierarchical_inner_size(llama8b, [1, 2, 1, 1, 8], [16, 16, 6, 2, 4], 8)) == [8, 4, 2, 2, 1]
    # tp = 8 fills the domain: no room for an all-to-all group; 70B at tp 4 keeps 2 KV heads per rank.
    assert list(hierarchical_inner_size(llama70b, [8, 4], [4, 8], 8)) == [1, 2]


def test_hierarchical_ring_crosses_the_fabric_fewer_times(llama8b, h100x32):
    """cp = 16 over two 8-GPU nodes with nothing to hide behind: the flat ring pays 15 NIC-bound hops, the
    hierarchical one an NVLink all-to-all over 8 ranks plus one hop of the same bytes between the nodes."""
    tokens = 1024
    hop_bytes = ring_hop_bytes(llama8b, tokens, 1)
    flat, _ = cp_comm_s(llama8b, tokens, 1, 16, P2P, h100x32, 0.0, 0.0)
    hierarchical, _ = cp_comm_s(llama8b, tokens, 1, 16, HIER, h100x32, 0.0, 0.0)
    before, after = ulysses_bytes(llama8b, tokens, 1)
    inner = all_to_all_time_s(before, 8, 1, h100x32) + all_to_all_time_s(after, 8, 1, h100x32)
    assert flat == pytest.approx(15 * p2p_time_s(hop_bytes, 16, 1, h100x32), rel=1e-12)
    assert hierarchical == pytest.approx(inner + p2p_time_s(hop_bytes, 2, 8, h100x32), rel=1e-12)
    assert hierarchical < flat


def test_cp1_has_no_traffic_in_any_variant(llama8b, h100x32):
    forward, backward = cp_comm_s(llama8b, 4096, 1, np.ones(4), np.arange(4), h100x32, 0.0, 0.0)
    assert np.all(forward == 0.0) and np.all(backward == 0.0)


def test_variants_move_bytes_not_flops(llama8b, h100x32):
    work = TrainingJob(model=llama8b, seq_len=32768, global_batch=8).workload()
    # cp = 16 over two nodes: the hierarchical variant has a ring between them (a2a alone is refused
    # by the search there, 8 KV heads do not split 16 ways, but its cost is defined).
    times = layer_times(llama8b, work, make_table(cp=16, dp=2, cp_comm=[P2P, A2A, GATHER, HIER]),
                        analytical_rates(h100x32.gpu, "bf16"), h100x32)
    for name in ("forward_compute_s", "backward_compute_s", "recompute_s", "tp_comm_s"):
        assert np.all(getattr(times, name) == getattr(times, name)[0])
    assert len(set(times.cp_comm_s.tolist())) == 4


def test_selective_recompute_replays_the_forward_traffic(llama8b, h100x32):
    work = TrainingJob(model=llama8b, seq_len=32768, global_batch=8).workload()
    rates = analytical_rates(h100x32.gpu, "bf16")
    plain = layer_times(llama8b, work, make_table(cp=8, dp=4, cp_comm=A2A), rates, h100x32).cp_comm_s
    replayed = layer_times(llama8b, work, make_table(cp=8, dp=4, cp_comm=A2A, recompute=1), rates, h100x32).cp_comm_s
    # Ulysses costs the same each way: one forward, one backward, one replayed forward.
    assert replayed == pytest.approx(1.5 * plain, rel=1e-12)


def test_search_offers_each_engine_its_own_variants(h100x32):
    qwen = load_model("qwen3-30b-a3b")  # 4 KV heads: Ulysses stops at cp = 4 with tp = 1
    job = TrainingJob(model=qwen, seq_len=32768, global_batch=32)
    space = enumerate_space(job, h100x32, engine_rules("megatron"), {"tp": [1], "pp": [1], "ep": [1], "etp": [1]})
    t = space.table
    assert set(t.cp_comm[t.cp > 1].tolist()) == {P2P, A2A, GATHER, HIER}
    assert np.all(t.cp_comm[t.cp == 1] == P2P)
    assert set(t.cp[t.cp_comm == A2A].tolist()) == {2, 4}
    assert "a2a context parallel needs each TP rank's heads and KV heads divisible by cp" in space.rejected
    titan = enumerate_space(TrainingJob(model=qwen, seq_len=32768, global_batch=32, engine="torchtitan"), h100x32,
                            engine_rules("torchtitan"), {"tp": [1], "pp": [1], "ep": [1], "etp": [1]})
    assert set(titan.table.cp_comm[titan.table.cp > 1].tolist()) == {GATHER}


def test_cli_evaluates_and_plans_a_variant():
    args = ["llama-3.1-8b", "--seq-len", "16384", "--global-batch", "64", "--gpu", "h100-sxm", "--gpus", "32"]
    result = runner.invoke(app, ["evaluate", *args, "--tp", "1", "--pp", "1", "--cp", "16", "--cp-comm", "a2a+p2p",
                                 "--zero", "1"])
    assert result.exit_code == 0, result.output
    assert "cp_comm=a2a+p2p" in result.output
    planned = runner.invoke(app, ["plan", *args, "--cp", "16", "--tp", "1", "--cp-comm", "p2p,a2a+p2p", "--top", "2"])
    assert planned.exit_code == 0, planned.output
    # Across two nodes with 16k tokens the flat ring cannot hide its NIC hops; the hierarchical one wins.
    assert "16 a2a+p2p" in planned.output


def test_cli_refuses_an_unknown_variant():
    result = runner.invoke(app, ["evaluate", "llama-3.1-8b", "--seq-len", "8192", "--global-batch", "8", "--gpu",
                                 "h100-sxm", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "8", "--cp-comm", "ring"])
    assert_bad_input(result, "--cp-comm expects p2p, a2a, allgather, a2a+p2p")


def test_search_picks_each_layouts_fastest_variant_exactly(llama8b, h100x32):
    """The search evaluates one row per layout with its fastest CP variant; estimating every variant
    row of the uncollapsed space gives the same best step time, and the counts still add up."""
    from paraplan.cost_models.estimate import estimate
    from paraplan.planner.search import DOMINATED_CP_REASON, search

    job = TrainingJob(model=llama8b, seq_len=16384, global_batch=64)
    fixed = {"tp": [1, 2], "pp": [1], "zero": [1], "recompute": [0, 1], "offload": [0]}
    result = search(job, h100x32, fixed)
    full = enumerate_space(job, h100x32, engine_rules("megatron"), fixed)
    est = estimate(llama8b, h100x32, job.workload(), full.table)
    fits = est.memory.peak_bytes <= h100x32.gpu.hbm_bytes
    best = float(result.estimates.step_time_s[result.ranked[0]])
    assert best == pytest.approx(float(est.step_time_s[fits].min()), rel=1e-12)
    t = result.table  # 16k tokens with cp = 16 over two nodes: the flat ring cannot hide its NIC hops
    assert np.all(t.cp_comm[(t.cp == 16) & (t.tp == 1)] == HIER)
    assert result.considered == full.considered
    evaluated_or_counted = len(result.table) + sum(result.rejected.values()) - result.rejected.get(
        "does not fit in GPU memory", 0)
    assert evaluated_or_counted == full.considered
    assert result.rejected[DOMINATED_CP_REASON] == len(full.table) - len(result.table)


def test_all_gather_rows_that_do_not_fit_fall_back_to_the_next_fastest_variant(llama8b, h100x32):
    """All-gather holds one layer's whole-sequence K, V and dK, dV in backward (2·cp local K, V). With
    the capacity set between a layout's p2p and all-gather peaks, the search must keep that layout
    with p2p rather than reject it; per layout, it matches the best fitting row of the full space."""
    from paraplan.cost_models.device_memory import usable_capacity_bytes
    from paraplan.cost_models.estimate import estimate
    from paraplan.planner.search import search

    fixed = {"tp": [1], "pp": [1], "zero": [1], "recompute": [1], "offload": [0], "cp": [16], "cp_comm": [P2P, GATHER]}
    job = TrainingJob(model=llama8b, seq_len=16384, global_batch=64)
    full = enumerate_space(job, h100x32, engine_rules("megatron"), fixed)
    est = estimate(llama8b, h100x32, job.workload(), full.table)
    t = full.table
    tokens = t.mbs * job.seq_len / t.cp
    extra = est.memory.peak_bytes[t.cp_comm == GATHER] - est.memory.peak_bytes[t.cp_comm == P2P]
    kv = 2 * 16 * tokens[t.cp_comm == GATHER] * (8 * 128 + 8 * 128) * 2  # 2·cp local K, V of 8 KV heads of 128
    # The transient sits in the peak, plus the allocator's fragmentation reserve on top of it.
    assert np.all(extra >= kv) and np.all(extra <= kv * 1.1)
    assert np.all(est.step_time_s[t.cp_comm == GATHER] < est.step_time_s[t.cp_comm == P2P])  # NIC-bound ring
    mbs4 = (t.mbs == 4)
    required = est.memory.required_bytes  # what must fit in capacity
    capacity = 0.5 * (required[mbs4 & (t.cp_comm == P2P)] + required[mbs4 & (t.cp_comm == GATHER)])
    squeezed = TrainingJob(model=llama8b, seq_len=16384, global_batch=64,
                           memory_headroom_frac=float(1.0 - capacity[0] / usable_capacity_bytes(h100x32.gpu.hbm_bytes)))
    fits = est.memory.required_bytes <= capacity[0]
    result = search(squeezed, h100x32, fixed)
    r = result.table
    best_by_mbs = {int(m): float(est.step_time_s[fits & (t.mbs == m)].min()) for m in np.unique(t.mbs[fits])}
    kept = {int(r.mbs[i]): (int(r.cp_comm[i]), float(result.estimates.step_time_s[i])) for i in result.ranked}
    assert {m: s for m, (_, s) in kept.items()} == pytest.approx(best_by_mbs, rel=1e-12)
    assert kept[4][0] == P2P and kept[2][0] == GATHER  # mbs 4 fell back; mbs 2 still gathers
    # Ranked by memory, a layout's all-gather row holds more than its p2p row: p2p represents it.
    by_memory = search(job, h100x32, fixed, objective="memory")
    assert np.all(by_memory.table.cp_comm == P2P)
    assert by_memory.estimates.memory.peak_bytes[by_memory.ranked[0]] == pytest.approx(
        float(est.memory.peak_bytes.min()))


def test_torchtitan_never_runs_zero_0_with_context_parallelism_and_evaluate_takes_its_defaults():
    """torchtitan applies FSDP2 over dp_shard x cp whenever cp > 1: ZeRO 0 with cp > 1 is not a layout it runs, and
    the library's evaluate defaults to what it does run (ZeRO 3, its all-gather rotate method)."""
    import paraplan
    from paraplan.errors import InputError

    job = dict(gpu="h100-sxm", gpus=16, seq_len=8192, global_batch=64, engine="torchtitan", tp=1, pp=1, cp=2)
    config = paraplan.evaluate("llama-3.1-8b", **job).config
    assert (config.cp, config.cp_comm, config.zero) == (2, "allgather", 3)
    with pytest.raises(InputError, match="torchtitan shards parameters over the context-parallel ranks"):
        paraplan.evaluate("llama-3.1-8b", **job, zero=0)
    free = paraplan.plan("llama-3.1-8b", gpu="h100-sxm", gpus=16, seq_len=32768, global_batch=32, engine="torchtitan",
                         cp=2, top=20)
    assert free.plans and all(p.config.zero in (2, 3) for p in free.plans)
