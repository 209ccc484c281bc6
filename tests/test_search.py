"""Search space and search: every row obeys the rules, the space equals a brute-force enumeration,
the ranking is optimal, deterministic and respects fixed axes and engine capabilities."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from paraplan.choices import RECOMPUTE_CODES
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.planner.engines import engine_rules
from paraplan.planner.job import TrainingJob
from paraplan.planner.search import MEMORY_REASON, explain_no_fit, search
from paraplan.planner.space import AXES, MAX_FREE_MICROBATCH_TOKENS, divisors, enumerate_space

SEQ, GBS = 4096, 64


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama-3.1-8b")


def _job(model, engine="megatron", seq_len=SEQ, global_batch=GBS, **kw):
    return TrainingJob(model=model, seq_len=seq_len, global_batch=global_batch, engine=engine, **kw)


def _rows(table):
    return {tuple(int(getattr(table, axis)[i]) for axis in AXES) for i in range(len(table))}


# -- hand-written rules ---------------------------------------------------------------------------
# Engine capabilities as DESIGN.md section 5 states them: Megatron counts embedding and loss as
# layers when splitting stages and needs m % pp == 0 to interleave; the DeepSpeed pipeline has
# ZeRO-1 only, no CP, no interleaving, no SP; torchtitan always shards norms with TP (SP on).
HAND_RULES = {
    "megatron": {
        "edge": "megatron",
        "cp": True,
        "cp_comm": {"p2p": 0, "a2a": 1, "allgather": 2, "a2a+p2p": 3},
        "interleaved": True,
        "m_multiple_of_pp": True,
        "sp_with_tp": {0, 1},
        "max_zero_pp": 1,
        "schedules": {0},  # 1F1B / interleaved only
    },
    "deepspeed": {
        "edge": "uniform",  # partition_uniform over [embedding, layers, head]: ⌊(L + 2) / pp⌋ ≥ 1
        "cp": False,
        "cp_comm": {"p2p": 0},
        "interleaved": False,
        "m_multiple_of_pp": False,
        "sp_with_tp": {0},
        "max_zero_pp": 1,
        "schedules": {0},
    },
    "torchtitan": {
        "edge": "weighted",  # embedding and output weigh 0 (even split) or 1 layer
        "cp": True,
        "cp_comm": {"allgather": 2},
        "interleaved": True,
        "m_multiple_of_pp": False,
        "sp_with_tp": {1},
        "max_zero_pp": 3,
        "schedules": {0, 1},  # 1F1B / interleaved, DualPipeV
    },
}


def _experts_valid_by_hand(tp, dp, cp, ep, etp, sp, job) -> bool:
    model = job.model
    if not model.is_moe:
        return ep == etp == 1
    if model.num_experts % ep or (tp > 1 and sp == 0):
        return False
    if job.engine == "megatron":  # parallel folding: etp from tp, expert groups from tp·dp·cp
        return tp % etp == 0 and (tp * dp * cp) % (ep * etp) == 0
    if job.engine == "torchtitan":  # ep borrowed from dp_shard·cp, etp is 1 or tp
        return etp in (1, tp) and (dp * cp) % ep == 0
    return etp == 1 and dp % ep == 0  # DeepSpeed-MoE: expert groups inside data parallel


def _cp_comm_valid_by_hand(tp, cp, cp_comm, job, cluster, rules) -> bool:
    """Ulysses splits each TP rank's heads and KV heads over cp; the hierarchical variant needs an
    all-to-all group of a ranks (a divides cp, 1 < a < cp) in one NVLink domain that splits them."""
    if cp == 1:
        return cp_comm == 0
    if cp_comm not in rules["cp_comm"].values():
        return False
    heads, kv = job.model.num_heads // tp, job.model.num_kv_heads // tp
    if cp_comm == 1:
        return heads % cp == 0 and kv % cp == 0
    if cp_comm == 3:
        inner = max((a for a in range(1, cp + 1)
                     if cp % a == 0 and tp * a <= cluster.domain_gpus and heads % a == 0 and kv % a == 0), default=1)
        return 1 < inner < cp
    return True


def _valid_by_hand(row, job, cluster, rules) -> bool:
    tp, pp, dp, cp, cp_comm, ep, etp, vpp, mbs, zero, recompute, sp, ep_overlap, offload, schedule, tp_overlap = row
    if not _cp_comm_valid_by_hand(tp, cp, cp_comm, job, cluster, rules):
        return False
    if not _experts_valid_by_hand(tp, dp, cp, ep, etp, sp, job):
        return False
    mtp = job.model.mtp_layers
    if ep_overlap and not (job.engine == "megatron" and ep > 1 and recompute != 2 and (pp == 1 or vpp > 1)
                           and (mtp == 0 or (mtp == 1 and pp > 1))):
        return False
    model, n, layers = job.model, cluster.num_gpus, job.model.num_layers

    def splits(chunks):
        if rules["edge"] == "uniform":
            return (layers + 2) // chunks >= 1
        if rules["edge"] == "weighted":
            weight = 0 if layers % chunks == 0 else 1
            effective = layers + 2 * weight
            per_stage = -(-effective // chunks)  # layers_per_stage must give back exactly `chunks` stages
            return effective // chunks >= max(1, weight) and (chunks <= 2 * pp or -(-effective // per_stage) == chunks)
        return layers % chunks == 0 or ((layers + 2) % chunks == 0 and (layers + 2) // chunks > 1)

    def explicit_edges(stages, chunks_per_stage=1):  # Megatron first/last-stage flags or layout string
        chunks = stages * chunks_per_stage
        middle = -(-(layers + 2) // chunks)
        remainder = layers - (chunks - 2) * middle
        return rules["edge"] == "megatron" and stages >= 2 and remainder >= (2 if chunks_per_stage == 1 else 0)

    if tp * pp * dp * cp != n or tp > cluster.domain_gpus:
        return False
    if model.num_heads % tp or model.num_kv_heads % tp or not (splits(pp) or explicit_edges(pp)):
        return False
    if cp > 1 and (job.seq_len % (2 * cp) or not rules["cp"]):
        return False
    if job.global_batch % (dp * mbs):
        return False
    micro = job.global_batch // (dp * mbs)
    if vpp > 1 and (pp == 1 or not rules["interleaved"] or not (splits(pp * vpp) or explicit_edges(pp, vpp))):
        return False
    if vpp > 1 and rules["m_multiple_of_pp"] and micro % pp:
        return False
    # DualPipeV (1): two chunks per rank; DualPipe (2): even pp, one chunk; both at least 2·pp micro-batches.
    if schedule not in rules["schedules"] or (schedule and (pp == 1 or micro < 2 * pp)):
        return False
    if (schedule == 1 and vpp != 2) or (schedule == 2 and (vpp != 1 or pp % 2 or micro % 2)):
        return False
    if sp == 1 and tp == 1:
        return False
    if tp_overlap and (job.engine != "megatron" or tp == 1 or sp == 0):  # --tp-comm-overlap needs SP
        return False
    if not tp_overlap and job.engine == "megatron" and tp > 1 and sp == 1 and rules.get("free_tp_overlap", True):
        return False  # a free search keeps the overlapped variant, which is never slower
    if tp > 1 and sp not in rules["sp_with_tp"]:
        return False
    if zero > 0 and dp * cp == 1:  # states shard over the dp·cp group; nothing to shard over
        return False
    if zero == 0 and cp > 1 and job.engine == "torchtitan":  # FSDP2 over dp_shard x cp whenever cp > 1
        return False
    if offload and (job.engine != "megatron" or pp > 1 or recompute or offload >= layers):
        return False
    return not (zero > rules["max_zero_pp"] and pp > 1)


def _brute_force(job, cluster):
    engine = engine_rules(job.engine)
    n, layers = cluster.num_gpus, job.model.num_layers
    vpps = sorted(set(divisors(layers)) | set(divisors(layers + 2)) | set(range(2, 9)))
    mbss = [d for d in divisors(job.global_batch) if d * job.seq_len <= MAX_FREE_MICROBATCH_TOKENS] or [1]
    zeros = list(engine.zero_stages)
    recomputes = [RECOMPUTE_CODES[mode] for mode in engine.recompute_modes]
    # Megatron offloads every ceil(layers/16)-th layer count below the depth; the others never offload.
    offloads = [0] + (list(range(-(-layers // 16), layers, -(-layers // 16))) if job.engine == "megatron" else [])
    considered, valid = 0, set()
    schedules = sorted(HAND_RULES[job.engine]["schedules"])
    tp_overlaps = (0, 1) if job.engine == "megatron" else (0,)
    for tp, pp, cp, cp_comm, vpp, mbs, zero, recompute, sp, offload, schedule, tp_overlap in product(
        divisors(n), divisors(n), divisors(n), (0, 1, 2, 3), vpps, mbss, zeros, recomputes, (0, 1), offloads, schedules,
        tp_overlaps
    ):
        if cp == 1 and cp_comm > 0:  # the communication type exists only with context parallelism
            continue
        considered += offload == 0 and (cp == 1 or cp_comm in HAND_RULES[job.engine]["cp_comm"].values())
        if n % (tp * pp * cp):
            continue
        row = (tp, pp, n // (tp * pp * cp), cp, cp_comm, 1, 1, vpp, mbs, zero, recompute, sp, 0, offload, schedule,
               tp_overlap)
        if _valid_by_hand(row, job, cluster, HAND_RULES[job.engine]):
            valid.add(row)
    return considered, valid


CASES = [
    ("dgx-h100", 2, "megatron", "llama-3.1-8b"),
    ("gb200-nvl72", 4, "megatron", "llama-3.1-8b"),  # 16-GPU NVLink domain: tp = 16 meets the KV-head rule
    ("dgx-h100", 2, "deepspeed", "llama-3.1-8b"),
    ("dgx-h100", 2, "torchtitan", "llama-3.1-8b"),
    ("dgx-h100", 3, "megatron", "megatron-gpt-1.7b"),  # 24 GPUs, 24 layers: uneven edge-accounted stages
    ("dgx-h100", 2, "megatron", "megatron-gpt-76.1b"),  # 60 layers: pp = 8 and 16 need explicit edge stages
]


@pytest.mark.slow  # brute force over the whole space of each case (CI runs it: `pytest -m slow`)
@pytest.mark.parametrize("cluster_name, nodes, engine, model_name", CASES)
def test_space_equals_brute_force(cluster_name, nodes, engine, model_name):
    cluster = load_cluster(cluster_name, num_nodes=nodes)
    job = _job(load_model(model_name), engine=engine, seq_len=2048 if "gpt" in model_name else SEQ)
    space = enumerate_space(job, cluster, engine_rules(engine))
    considered, valid = _brute_force(job, cluster)
    assert len(valid) > 0
    assert _rows(space.table) == valid
    assert len(space.table) == len(valid)  # no duplicates
    # Offload variants are considered only where pp = 1 and recompute is off, on top of the grid.
    offloading = int(np.sum(space.table.offload > 0))
    assert (offloading > 0) == (engine == "megatron")
    assert considered + offloading <= space.considered <= considered * (1 + 15)
    assert space.considered == len(space.table) + sum(space.rejected.values())
    assert all(count > 0 for count in space.rejected.values())


MOE_FIXED = {"cp_comm": [0], "vpp": [1], "mbs": [1], "zero": [0], "recompute": [0], "ep_overlap": [0], "offload": [0],
             "pp_schedule": [0], "tp_overlap": [0]}


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "deepspeed"])
def test_expert_axes_equal_brute_force(engine, h100x16):
    """tp, pp, cp, ep, etp and sp free for Mixtral (8 experts) on 16 GPUs; other axes fixed to keep
    the brute force small."""
    job = _job(load_model("mixtral-8x7b"), engine=engine)
    space = enumerate_space(job, h100x16, engine_rules(engine), MOE_FIXED)
    n, rules, valid = 16, {**HAND_RULES[engine], "free_tp_overlap": False}, set()  # MOE_FIXED fixes it off
    for tp, pp, cp, ep, etp, sp in product(divisors(n), divisors(n), divisors(n), divisors(8), divisors(8), (0, 1)):
        if n % (tp * pp * cp) == 0:
            row = (tp, pp, n // (tp * pp * cp), cp, 0, ep, etp, 1, 1, 0, 0, sp, 0, 0, 0, 0)
            if _valid_by_hand(row, job, h100x16, rules):
                valid.add(row)
    assert len(valid) > 0 and _rows(space.table) == valid
    assert np.any(space.table.ep > 1)
    assert np.all(space.table.etp[space.table.ep * space.table.etp > 1] >= 1)


def test_dense_models_keep_ep_and_etp_at_one(llama8b, h100x16):
    space = enumerate_space(_job(llama8b), h100x16, engine_rules("megatron"), {"ep": [1, 2]})
    assert np.all(space.table.ep == 1) and np.all(space.table.etp == 1)
    assert "ep and etp apply to MoE models only" in space.rejected


def test_every_row_obeys_the_rules(llama8b, h100x16):
    job = _job(llama8b)
    space = enumerate_space(job, h100x16, engine_rules("megatron"))
    t = space.table
    assert len(t) > 0
    assert np.all(t.tp * t.pp * t.dp * t.cp == 16)
    assert np.all(llama8b.num_heads % t.tp == 0) and np.all(llama8b.num_kv_heads % t.tp == 0)
    assert np.all(GBS % (t.dp * t.mbs) == 0)
    assert np.all((t.vpp == 1) | (t.pp > 1))
    assert np.all((t.sp == 0) | (t.tp > 1))
    assert np.all((t.zero == 0) | (t.dp * t.cp > 1))
    assert np.all(t.tp <= h100x16.domain_gpus)
    assert space.considered == len(t) + sum(space.rejected.values())
    for axis in AXES:
        assert getattr(t, axis).dtype == np.int64


def test_rejection_reasons_are_sentences(llama8b, h100x16):
    space = enumerate_space(_job(llama8b), h100x16, engine_rules("megatron"))
    assert "tp·pp·cp does not divide the GPU count" in space.rejected
    assert "vpp > 1 needs pp > 1" in space.rejected
    assert "sequence parallel needs tp > 1" in space.rejected


def test_fixed_axes_restrict_the_table(llama8b, h100x16):
    engine = engine_rules("megatron")
    space = enumerate_space(_job(llama8b), h100x16, engine, {"tp": [2]})
    assert len(space.table) > 0 and np.all(space.table.tp == 2)
    full = enumerate_space(_job(llama8b), h100x16, engine)
    assert _rows(space.table) == {row for row in _rows(full.table) if row[0] == 2}
    assert space.considered == len(space.table) + sum(space.rejected.values())

    space = enumerate_space(_job(llama8b), h100x16, engine, {"dp": [4], "recompute": [2], "mbs": [1]})
    assert len(space.table) > 0
    assert np.all(space.table.dp == 4) and np.all(space.table.recompute == 2) and np.all(space.table.mbs == 1)
    assert "dp differs from the requested values" in space.rejected
    assert space.considered == len(space.table) + sum(space.rejected.values())


def test_impossible_fixed_axis_gives_an_empty_space(llama8b, h100x16):
    result = search(_job(llama8b), h100x16, {"tp": [3]})
    assert len(result.table) == 0 and len(result.ranked) == 0
    assert result.rejected == {"tp·pp·cp does not divide the GPU count": result.considered}
    assert "tp·pp·cp does not divide" in explain_no_fit(result, h100x16)


# -- search -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def result(llama8b, h100x16):
    return search(_job(llama8b), h100x16)


def test_ranked_rows_fit_and_cover_every_fitting_row(result, h100x16):
    from paraplan.cost_models.device_memory import usable_capacity_bytes
    capacity = usable_capacity_bytes(h100x16.gpu.hbm_bytes)  # nominal HBM less the driver's share
    peak = result.estimates.memory.required_bytes  # what must fit (the allocator may trim its cache)
    fits = peak <= capacity
    assert len(result.ranked) > 0
    assert np.all(peak[result.ranked] <= capacity)
    assert sorted(result.ranked.tolist()) == np.flatnonzero(fits).tolist()
    assert result.rejected.get(MEMORY_REASON, 0) == int((~fits).sum())
    assert result.smallest_memory_bytes == pytest.approx(float(peak.min()))


def test_first_ranked_row_is_the_fastest_that_fits(result, h100x16):
    step = result.estimates.step_time_s
    fits = result.estimates.memory.required_bytes <= h100x16.gpu.hbm_bytes
    best = float(step[fits].min())
    assert float(step[result.ranked[0]]) <= best + 1e-12
    ranked_steps = step[result.ranked]
    assert np.all(np.diff(ranked_steps) >= -1e-12)


def test_memory_objective_ranks_by_peak_memory(llama8b, h100x16):
    result = search(_job(llama8b), h100x16, objective="memory")
    peaks = result.estimates.memory.peak_bytes[result.ranked]
    assert np.all(np.diff(peaks) >= -1e-3)
    assert float(peaks[0]) == pytest.approx(float(result.estimates.memory.peak_bytes.min()))


def test_search_is_deterministic(llama8b, h100x16, result):
    again = search(_job(llama8b), h100x16)
    np.testing.assert_array_equal(again.ranked, result.ranked)
    for axis in AXES:
        np.testing.assert_array_equal(getattr(again.table, axis), getattr(result.table, axis))
    assert again.rejected == result.rejected


def test_search_respects_fixed_tp(llama8b, h100x16):
    result = search(_job(llama8b), h100x16, {"tp": [2]})
    assert len(result.ranked) > 0
    assert np.all(result.table.tp == 2)


def test_memory_headroom_is_honoured(llama8b, h100x16, result):
    tight = search(_job(llama8b, memory_headroom_frac=0.5), h100x16)
    capacity = h100x16.gpu.hbm_bytes * 0.5
    assert np.all(tight.estimates.memory.required_bytes[tight.ranked] <= capacity)
    assert len(tight.ranked) < len(result.ranked)


def test_bad_objectives(llama8b, h100x16):
    with pytest.raises(InputError, match="objective"):
        search(_job(llama8b), h100x16, objective="speed")
    if h100x16.gpu.price_usd_per_gpu_hour is None:
        with pytest.raises(InputError, match="price"):
            search(_job(llama8b), h100x16, objective="cost")


def test_nothing_fits_explains_memory(h100x16):
    model = load_model("llama-3.1-405b")
    result = search(_job(model, global_batch=16), load_cluster("dgx-h100", num_gpus=8), {"mbs": [1]})
    assert len(result.table) > 0 and len(result.ranked) == 0
    assert "GiB" in explain_no_fit(result, h100x16)


# -- engine rules -------------------------------------------------------------------------------------
def test_deepspeed_rules(llama8b, h100x16):
    t = enumerate_space(_job(llama8b, engine="deepspeed"), h100x16, engine_rules("deepspeed")).table
    assert len(t) > 0
    assert np.all(t.vpp == 1)
    assert np.all(t.cp == 1)
    assert not np.any((t.zero > 1) & (t.pp > 1))
    assert np.all(t.sp == 0)
    assert set(t.recompute.tolist()) <= {RECOMPUTE_CODES["none"], RECOMPUTE_CODES["full"]}
    assert np.any((t.zero > 1) & (t.pp == 1))  # ZeRO-2/3 are offered without a pipeline


def test_torchtitan_rules(llama8b, h100x16):
    t = enumerate_space(_job(llama8b, engine="torchtitan"), h100x16, engine_rules("torchtitan")).table
    assert len(t) > 0
    assert not np.any((t.sp == 0) & (t.tp > 1))
    assert not np.any(t.zero == 1)
    assert np.any((t.zero == 3) & (t.pp > 1))  # FSDP composes with pipelining
    assert np.any(t.cp > 1) and np.any(t.vpp > 1)


@pytest.mark.parametrize(
    "engine, fixed",
    [("megatron", {"zero": [2]}), ("torchtitan", {"zero": [1]}), ("deepspeed", {"recompute": [1]})],
    ids=["megatron-zero2", "torchtitan-zero1", "deepspeed-selective"],
)
def test_fixed_axes_cannot_bring_in_unsupported_modes(llama8b, h100x16, engine, fixed):
    # A fixed axis narrows the engine's capability table; it never brings in a mode the engine lacks.
    space = enumerate_space(_job(llama8b, engine=engine), h100x16, engine_rules(engine), fixed)
    assert len(space.table) == 0
    assert space.considered == sum(space.rejected.values())
    assert any(engine in reason for reason in space.rejected)


def test_unknown_engine(llama8b):
    with pytest.raises(InputError, match="megatron"):
        _job(llama8b, engine="colossal")


def test_job_validation(llama8b):
    with pytest.raises(ValueError, match="seq-len"):
        _job(llama8b, seq_len=0)
    with pytest.raises(ValueError, match="precision"):
        TrainingJob(model=llama8b, seq_len=SEQ, global_batch=GBS, precision="fp32")
    with pytest.raises(ValueError, match="headroom"):
        _job(llama8b, memory_headroom_frac=1.0)


def test_equal_predictions_rank_the_simpler_layout_first():
    # Llama 3.1 8B on 8 H100: dp=8 and dp=2 x cp=4 move the same tokens per GPU through the same
    # GEMMs, and the ring hides under attention, so their predictions tie exactly.
    result = search(_job(load_model("llama-3.1-8b"), seq_len=4096, global_batch=256),
                    load_cluster("dgx-h100", num_nodes=1), {"tp": [1], "pp": [1], "zero": [3], "recompute": [0]})
    table, est = result.table, result.estimates
    best = int(result.ranked[0])
    tied = [int(r) for r in result.ranked if est.step_time_s[r] == est.step_time_s[best]]
    assert len(tied) > 1 and {int(table.cp[r]) for r in tied} > {1}
    assert int(table.cp[best]) == 1 and int(table.offload[best]) == 0
    cps = [int(table.cp[r]) for r in tied]
    assert cps == sorted(cps)


def test_explicit_edge_stages_by_hand():
    """DeepSeek-V3's 61 layers: neither 61 nor 63 splits over 4, 8 or 16 stages; middle stages take
    ⌈63/pp⌉ and the edges share the rest, the first the larger half."""
    from paraplan.planner.layout import stage_layers

    assert stage_layers(61, 16, 1) == [3] + [4] * 14 + [2]
    assert stage_layers(61, 8, 1) == [7] + [8] * 6 + [6]
    assert stage_layers(61, 4, 1) == [15, 16, 16, 14]
    assert stage_layers(61, 2, 8) == [3] + [4] * 14 + [2]  # pp 2 x vpp 8: layout string
    assert stage_layers(61, 8, 4) == [1] + [2] * 30 + [0]  # the last chunk holds the loss alone
    assert stage_layers(62, 4, 1) == [15, 16, 16, 15]  # 64 / 4: the edge-accounted split
    with pytest.raises(ValueError):
        stage_layers(61, 32, 1)  # 31 middle stages of 2 leave -1 for the edges
    model = load_model("deepseek-v3")
    cluster = load_cluster("dgx-h100", num_gpus=256)
    space = enumerate_space(_job(model, engine="megatron"), cluster, engine_rules("megatron"),
                            {"pp": [16], "tp": [1], "cp": [1], "ep": [8], "etp": [1], "mbs": [1]})
    assert len(space.table) > 0
    assert set(space.table.vpp) <= {1}  # 61 layers: 16 x 2 chunks leave -1 for the edges
