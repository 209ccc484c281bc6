"""Accuracy against published measured runs (data/reference_runs.csv).

The guards below assert the accuracy paraplan reaches today, per group of rows, so a change
that makes predictions worse fails. The issue's target (median <= 8%, no row beyond 20% on
all dense rows): the median is met (3.6%), the 20% bound is not yet (7 of 342 rows); ``test_issue_target``
records that gap as a strict xfail and will fail loudly (XPASS) once the model is good
enough, so the marker must then be removed.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from paraplan.model_specs.hf_config import load_model
from paraplan.planner.search import search
from paraplan.validation.reference import (
    _cluster,
    distinct_published,
    load_reference_runs,
    predict_all,
    predict_row,
    published_layout_gap,
    reference_job,
)


@cache
def _predictions():
    runs = load_reference_runs()
    return runs, {p.run_id: p for p in predict_all(runs)}


def _abs_errors(selector) -> np.ndarray:
    runs, predictions = _predictions()
    ids = runs[selector(runs)].id
    return np.array([abs(predictions[i].error_frac) for i in ids])


# (description, row selector, median bound, max bound): today's figures plus a small margin.
def _MOE(r):
    return r.model.map(lambda name: load_model(name).is_moe).astype(bool)


def _NEMO(r):
    return r.source.str.startswith("NVIDIA") & ~_MOE(r)


def _CURRENT(r):
    return r.notes.str.contains("NeMo 26.06|NeMo 26.08", regex=True)


def _MOSAIC(r):
    return r.source.str.startswith("Mosaic")


def _NARAYANAN(r):
    return r.source.str.startswith("Narayanan")


GUARDS = [
    # Max: nemo_bridge_0261 (Llama 3.1 405B on 128 GB200, 25.09, MXFP8, tp 4 pp 8 cp 2) at +27%: its TP collectives
    # are priced pipelined under the GEMMs as NeMo's recipes run them (--tp-comm-overlap); the 25.09 container's
    # other 405B GB200 row (0260, tp 2) is +19% too, where 26.x rows of the model sit within 5%.
    ("NeMo dense, all GPUs", _NEMO, 0.05, 0.28),
    # Max: nemo_bridge_0226 (GB300, 4,520 tokens/s/GPU) against four runs of the same configuration at
    # 5,003-5,248; the prediction (5,466 since the GB300 fp8 fraction was refitted with MXFP8 priced apart,
    # 0.65 -> 0.68) sits 4.3% above their median (5,243).
    # Median 0.037 -> 0.042 when MXFP8 got its own GEMM rate (cost_models/fp8_recipes.py) and the GB200/GB300
    # fp8 fractions were refitted on all their dense rows: these 11 rows moved by 0.5 points, the group's 89 by -0.2.
    ("NeMo Llama 3 70B Megatron-FSDP on GB200/GB300 (activation offload)",
     lambda r: _NEMO(r) & (r.model == "llama-3.1-70b") & (r.zero == 3), 0.045, 0.215),
    ("NeMo B200 fp8", lambda r: _NEMO(r) & (r.gpu == "b200"), 0.03, 0.075),
    # Median 3.4% -> 2.0% once TP overlap was priced and the fp8 fraction refitted (0.70 -> 0.60). Max: 0252 (405B,
    # 25.11) at +11%; the same layout in 26.06 (0039) is within 2%.
    ("NeMo H100 fp8", lambda r: _NEMO(r) & (r.gpu == "h100-sxm"), 0.03, 0.12),
    # Mosaic maxima: three small-batch FSDP rows that their neighbours do not explain (mpt-70b on
    # 64 A100-40GB, mpt-30b at sequence 8192 on 8 A100-80GB and 8 H100); see the README.
    ("MosaicML A100 40GB", lambda r: _MOSAIC(r) & (r.gpu == "a100-sxm-40gb"), 0.04, 0.40),
    ("MosaicML A100 80GB", lambda r: _MOSAIC(r) & (r.gpu == "a100-sxm-80gb"), 0.06, 0.25),
    ("MosaicML H100 (flash attention, PyTorch stack)", lambda r: _MOSAIC(r) & (r.gpu == "h100-sxm"), 0.04, 0.28),
    # Max 0.08 -> 0.11 with issue 15's memory model: the last rank of an interleaved schedule holds
    # (vpp - 1)·pp + 1 chunks (Megatron's warm-up count; Megatron CI's last-rank max_allocated rows agree
    # within 1.2%), not one micro-batch, so the 1T row (Table 1 states no vpp or mbs) no longer fits with
    # vpp 2 and the search runs it at vpp 1: -10.8% instead of -5.3%.
    ("Megatron 2021 PTD-P (unfused attention)", lambda r: _NARAYANAN(r) & (r.engine == "megatron"), 0.045, 0.11),
    ("Megatron 2021 Table 2 DeepSpeed ZeRO-3", lambda r: _NARAYANAN(r) & (r.engine == "deepspeed"), 0.07, 0.13),
    # torchtitan's own benchmarks (H100 96 GB at 500 W), fitted by no constant: eager within 4% only because
    # eager PyTorch's memory-bound kernels are priced (+15-19% without). Max: 8 GPUs, FSDP 4 x CP 2 at 65,536
    # tokens (-24%), where CP 1, 4 and 8 of the same table are within 15%, 2.3% and 0.0%.
    ("torchtitan Llama 3.1 (eager, compiled, Float8)", lambda r: r.source.str.startswith("torchtitan"), 0.04, 0.25),
    # Issue 3's long-context bound: median <= 8% holds (1.7%); "no row beyond 25%" is missed by one row since TP
    # overlap is priced, nemo_bridge_0261 at +27% (see the NeMo dense guard above).
    ("context parallel (cp > 1)", lambda r: r.cp > 1, 0.08, 0.28),
    # MoE (134 feasible NeMo rows): the same layout ran 1.3-3x faster in the 26.06+ containers than in
    # 25.09-26.04; the model predicts current software (README, Accuracy).
    # The 26.06+ rows run MXFP8: pricing it apart (the 8 same-layout pairs, fp8_recipes.py) lowers every MXFP8
    # prediction by about 2-4%, which brings DeepSeek-V3 (+10% -> +6%) and GPT-OSS closer and takes the Qwen3 rows,
    # already under-predicted (-10 to -21%), further below: the median moves from 0.124 to 0.143.
    # Issue 32: 41 rows' expert overlap (and 5 DeepSeek-V3 B300 rows' vpp) corrected from Megatron-Bridge's perf
    # configs at each container's release (the 26.06 configs turn the overlap on for Qwen3 and GPT-OSS), and the
    # combined 1F1B schedule's unpaired warm-up/cool-down steps priced with their all-to-alls exposed: median 28.9% ->
    # 24.8% (all), 14.6% -> 8.8% (26.06+), 13.5% -> 5.2% (DeepSeek-V3 and Qwen3 on GB200/GB300, 26.06+). Max, all
    # containers: nemo_bridge_0218 (Qwen3-30B H100, 26.02, overlap on as its config sets it) at +240%, a row that
    # measures half of the same layout in 26.02.01. Max, 26.06+: GPT-OSS 26.06.01 at +125-135%, the container whose
    # GPT-OSS slowdown the source footnotes (cudnn-frontend issue 256).
    # GPT-OSS's eager expert ops (Megatron's clamp before the GLU kernel and its per-expert fp32 down-projection bias,
    # cost_models/moe_eager.py) priced where the recipe runs no fused grouped MLP: all MoE 22.2% -> 20.8% (GPT-OSS
    # 56.6% -> 40.2%); 26.06+ unchanged at 8.2% (the B300 row +93% -> +50%; the fused GB200/GB300 rows do not move).
    # Qwen3's QK-norms priced (two more norms a layer over q + kv elements, their inputs kept; cost_models/layer.py
    # qk_norm_elements): all MoE 20.8% -> 17.9% (Qwen3-30B-A3B's median +19.4% -> +15.7%), 26.06+ 8.2% -> 5.8%,
    # DeepSeek-V3 and Qwen3 on GB200/GB300 26.06+ 5.2% -> 4.8% (max 11.2% -> 9.2%); no dense row moves.
    # DeepSeek-V3's MTP module priced where Megatron trains it (after the last decoder layer, on the loss's stage:
    # a layer, its projection, a second output pass and loss; tests/test_mtp_training.py): DeepSeek-V3 15.2% ->
    # 8.1% (26.06+ 5.0% -> 1.4%, every row had been predicted fast), all MoE 17.9% -> 16.5% (60 -> 53 rows beyond
    # 25%), 26.06+ 5.8% -> 5.7%, DeepSeek-V3 and Qwen3 on GB200/GB300 26.06+ 4.8% -> 2.9%.
    ("NeMo MoE, all containers", lambda r: _MOE(r) & (r.id != "nemo_bridge_0263"), 0.18, 2.40),
    ("NeMo MoE, containers 26.06 and newer", lambda r: _MOE(r) & _CURRENT(r), 0.07, 1.40),
    ("NeMo MoE DeepSeek-V3 and Qwen3 on GB200/GB300, 26.06 and newer",
     lambda r: _MOE(r) & _CURRENT(r) & (r.model != "gpt-oss-120b") & r.gpu.isin(["gb200", "gb300"]), 0.04, 0.10),
    ("NeMo DeepSeek-V3, all containers (MTP trained)",
     lambda r: (r.model == "deepseek-v3") & (r.id != "nemo_bridge_0263"), 0.10, 0.52),
]


@pytest.mark.parametrize("name, selector, median_bound, max_bound", GUARDS, ids=[g[0] for g in GUARDS])
def test_accuracy_guard(name, selector, median_bound, max_bound):
    errors = _abs_errors(selector)
    assert len(errors) > 0 and np.all(np.isfinite(errors)), f"{name}: infeasible rows"
    assert np.median(errors) <= median_bound, f"{name}: median |error| {np.median(errors):.3f}"
    assert errors.max() <= max_bound, f"{name}: max |error| {errors.max():.3f}"


def test_overall_median():
    errors = _abs_errors(lambda r: ~_MOE(r))
    assert np.median(errors) <= 0.05


@pytest.mark.xfail(strict=True, reason="7 of 342 rows exceed 20%: four MosaicML FSDP rows their own source "
                   "contradicts (+20% to +39%), NeMo 25.09's Llama 3.1 405B MXFP8 on GB200 (+27%), 578 tokens/s/GPU "
                   "where B200 measures 622 (bench/dense_outliers.py), NeMo 26.02.01's Llama 3.1 70B MXFP8 pp 4 on "
                   "GB300 (-23%), and torchtitan's FSDP 4 x CP 2 at 65,536 tokens (-24%)")
def test_issue_target():
    errors = _abs_errors(lambda r: ~_MOE(r))
    assert np.median(errors) <= 0.08 and errors.max() <= 0.20


@pytest.mark.xfail(strict=True, reason="MoE rows: median 16.5% and 53 of 134 beyond 25%. Older NeMo containers ran "
                   "the same layouts 1.3-3x slower; GPT-OSS-120B is predicted 42-44% fast even on 26.06+ with its "
                   "eager expert ops priced (34% median on 25.09-26.04; README, Accuracy)")
def test_issue_3_moe_target():
    errors = _abs_errors(lambda r: _MOE(r) & (r.id != "nemo_bridge_0263"))
    assert np.median(errors) <= 0.10 and errors.max() <= 0.25


@pytest.mark.xfail(strict=True, reason="issues 16 and 32's bound for the current containers' MoE rows (26.06+): "
                   "the median is met (5.7%), the max is not: 7 of 29 rows beyond 25%, all GPT-OSS-120B (+42-44% on "
                   "GB200/GB300 in 26.06 and 26.08, whose fused grouped MLP leaves no eager expert op to price; +50% "
                   "on B300 with Megatron's eager clamp and expert bias priced, +93% before; +125-135% in 26.06.01, "
                   "the container whose GPT-OSS slowdown the source footnotes: cudnn-frontend issue 256)")
def test_issue_16_current_moe_target():
    errors = _abs_errors(lambda r: _MOE(r) & _CURRENT(r))
    assert np.median(errors) <= 0.10 and errors.max() <= 0.25


KNOWN_INFEASIBLE: dict[str, str] = {
    "nemo_bridge_0263": "DeepSeek-V3 on 256 GB200 with pp 8 and ep 64 as published (NeMo 25.09): a pipeline stage has "
                        "256 / 8 = 32 tp·dp·cp ranks, and Megatron-core carves expert groups from them, so ep = 64 "
                        "cannot exist; the row is likely a typo (its twin 0262 has pp 4)",
}


def test_every_published_config_is_feasible():
    _, predictions = _predictions()
    infeasible = {i for i, p in predictions.items() if not np.isfinite(p.predicted_tokens_per_s_per_gpu)}
    assert infeasible == set(KNOWN_INFEASIBLE)


def _sample_ids():
    runs = load_reference_runs()
    nemo_and_megatron = runs[~runs.source.str.startswith("Mosaic")].id.tolist()
    mosaic = runs[runs.source.str.startswith("Mosaic")].id.tolist()[::6]
    return [i for i in nemo_and_megatron + mosaic if i not in KNOWN_INFEASIBLE]


@pytest.mark.slow  # a full search per reference row: minutes (CI runs it: `pytest -m slow`)
@pytest.mark.parametrize("run_id", _sample_ids())
def test_search_finds_plan_at_least_as_fast_as_published(run_id):
    runs = load_reference_runs()
    row = runs[runs.id == run_id].iloc[0]
    published = predict_row(row)
    result = search(reference_job(row), _cluster(row))  # the published job, every knob free
    assert len(result.ranked) > 0
    best = result.estimates.tokens_per_s_per_gpu[result.ranked[0]]
    assert best >= published.predicted_tokens_per_s_per_gpu * (1 - 1e-9)


@cache
def _layout_gaps():
    cache_ = {}
    return [gap for _, row in distinct_published(load_reference_runs()).iterrows()
            if (gap := published_layout_gap(row, cache_)) is not None]


# The Narayanan et al. 2021 Table 2 ZeRO-3 rows are the paper's baseline without model parallelism, shown to
# lose to PTD-P; the search rightly finds tp > 1 faster, so they are not published choices of a layout.
ZERO3_BASELINES = {"megatron2021_t2_01", "megatron2021_t2_02", "megatron2021_t2_03", "megatron2021_t2_04",
                   "megatron2021_t2_05", "megatron2021_t2_06"}


@pytest.mark.slow  # one free search per published configuration (bench/published_layouts.py prints the figures)
def test_published_dense_layouts_rank_near_the_top():
    gaps = [g for g in _layout_gaps() if not g.moe and g.run_id not in ZERO3_BASELINES]
    ratios = np.array([g.ratio for g in gaps])
    assert len(ratios) >= 250
    # Today (bench/published_layouts.py): 274 layouts, median 1.000, 94% within 10% of the best, worst 1.36
    # (torchtitan's Llama 3.1 70B on 256 H100 as FSDP 32 x TP 8: the search prefers FSDP 256 at tp 1, the
    # ZeRO-3 preference issue 16 records: per-layer gathers priced as hidden behind compute they slow), then
    # 1.29 (405B on 256 GB300: tp1 pp32 cp8 vpp4, thin one-layer chunks, over the published tp4 pp8 vpp4).
    assert np.median(ratios) <= 1.005
    assert np.mean(ratios <= 1.10) >= 0.93
    assert ratios.max() <= 1.40


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="MoE at scale is issue 16: the search believes layouts 1.3-3x faster than "
                   "NVIDIA's published MoE recipes exist (24 of 53 beyond 10%), as the MoE step-time errors predict")
def test_published_moe_layouts_rank_near_the_top():
    ratios = np.array([g.ratio for g in _layout_gaps() if g.moe])
    assert np.mean(ratios <= 1.10) >= 0.9
