"""Engine settings users choose (issue 32, item 4): the memory fraction under each engine's own rule, CUDA graphs
on or off, speculative decoding; priced by hand, validated in one line, carried into the plan document."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_bad_input
from test_serving_cost import BF16, HBM, h100, small_model  # noqa: F401  (h100 is a fixture)
from typer.testing import CliRunner

import paraplan
from paraplan.cli.app import app
from paraplan.cost_models.inference_step import Sharding
from paraplan.cost_models.serving import (
    EAGER_KERNEL_LAUNCH_S,
    ENGINE_TRAITS,
    EngineKnobs,
    Speculation,
    decode_step_s,
    engine_decode_s,
    engine_memory,
    running_capacity,
)
from paraplan.errors import InputError
from paraplan.hardware_profiles.user_file import HARDWARE_ENV
from paraplan.planner.json_schema import schema_errors
from paraplan.planner.serving.plan import serving_schema

GIB = 2.0**30
LLAMA8B = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "ffn_size": 14336,
           "vocab_size": 128256}


def _traits(engine: str, **knobs) -> object:
    return EngineKnobs(**knobs).apply(ENGINE_TRAITS[engine])


# --- the memory fraction, each engine's rule ---------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_kv_pool_at_a_chosen_fraction_by_hand(h100, engine):  # noqa: F811
    llama8b = small_model(**LLAMA8B)
    mem = engine_memory(llama8b, h100, _traits(engine, memory_frac=0.7), BF16, Sharding.of(1), 2048)
    hbm = 80 * GIB * 0.987  # driver-visible HBM of an 80 GiB part
    weights = llama8b.total_params() * 2.0
    activations = 8192 * (3 * 14336 + 6144 + 4 * 4096) * 2 + 256 * 128256 * 4  # max batched tokens 8,192
    fixed = (0.5 + 3 * 0.3 + 1.0) * GIB  # CUDA context, 3 communicators, CUDA-graph pool
    pool = {
        "vllm": 0.7 * hbm - weights - activations - fixed,  # gpu_memory_utilization: of all memory, all inside
        "sglang": 0.7 * hbm - weights,  # mem_fraction_static: weights + KV pool
        "trtllm": 0.7 * (hbm - weights - activations - fixed),  # free_gpu_memory_fraction: of what is free
    }[engine]
    assert mem.kv_pool_bytes == pytest.approx(pool, rel=1e-12)
    assert mem.max_sequences == np.floor(pool / (2048 * 131072))  # 131,072 B of KV per token (32 layers)


def test_fraction_default_is_the_engines_own():
    for name, traits in ENGINE_TRAITS.items():
        assert EngineKnobs().apply(traits) is traits
        assert EngineKnobs(memory_frac=0.5).apply(traits).memory_frac == 0.5, name


def test_a_chosen_fraction_is_never_raised(h100):  # noqa: F811
    # 70B-sized weights on one GPU at 0.3: no pool. The default is priced raised to 0.95; the user's is not.
    big = small_model(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_size=28672,
                      vocab_size=128256)
    shard = Sharding.of(4)
    default, _ = running_capacity(big, h100, replace_frac(ENGINE_TRAITS["vllm"], 0.3), BF16, shard, 2048.0)
    chosen, starts = running_capacity(big, h100, _traits("vllm", memory_frac=0.3), BF16, shard, 2048.0)
    assert default > 0 and chosen == 0 and not starts


def replace_frac(traits, frac: float):
    from dataclasses import replace
    return replace(traits, memory_frac=frac)


VLLM_STEP_S, SGLANG_STEP_S, TRTLLM_STEP_S = 2.5e-3, 4.0e-3, 1.5e-3
"""The engines' fitted per-step overheads (ENGINE_TRAITS: validate --serving's fit on the rows that state their
deployment)."""


def test_the_step_overheads_are_the_fitted_ones():
    assert [ENGINE_TRAITS[e].step_overhead_s for e in ("vllm", "sglang", "trtllm")] == [
        VLLM_STEP_S, SGLANG_STEP_S, TRTLLM_STEP_S]
    assert [ENGINE_TRAITS[e].dp_sync_s for e in ("vllm", "sglang", "trtllm")] == [3e-3] * 3


# --- CUDA graphs off -----------------------------------------------------------------------------------------------

def test_eager_decode_pays_each_kernels_host_launch(h100):  # noqa: F811
    model = small_model()  # 2 layers x 12 kernels: host launches 24 x 22 us = 528 us > the 88.6 us GPU step
    graphs = engine_decode_s(model, h100, ENGINE_TRAITS["vllm"], BF16, Sharding.of(1), 1, 1000)
    eager = engine_decode_s(model, h100, _traits("vllm", cuda_graphs=False), BF16, Sharding.of(1), 1, 1000)
    assert graphs == pytest.approx(88.56e-6 + VLLM_STEP_S, rel=1e-3)
    assert eager == pytest.approx(2 * 12 * 22e-6 + VLLM_STEP_S, rel=1e-12)
    # A step whose GPU work outlasts the launches (4,096 sequences of 100k tokens) costs the same either way.
    big = [engine_decode_s(model, h100, t, BF16, Sharding.of(1), 4096, 100_000)
           for t in (ENGINE_TRAITS["vllm"], _traits("vllm", cuda_graphs=False))]
    assert big[0] == big[1]


def test_eager_floor_of_a_70b_model_matches_the_issue(h100):  # noqa: F811
    # Issue 32: an older engine at TP 2-8 showed a ~25-30 ms per-step floor. 80 layers x 12 kernels x 22 us =
    # 21.1 ms of launches, above the ~6.6 ms GPU step at tp 8, plus vLLM's 2.75 ms step overhead: 23.9 ms.
    llama70b = small_model(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_size=28672,
                           vocab_size=128256)
    eager = engine_decode_s(llama70b, h100, _traits("vllm", cuda_graphs=False), BF16, Sharding.of(8), 1, 2048)
    assert EAGER_KERNEL_LAUNCH_S == 22e-6
    assert eager == pytest.approx(80 * 12 * 22e-6 + VLLM_STEP_S, rel=1e-12)
    assert 20e-3 < float(eager) < 30e-3


# --- speculative decoding -------------------------------------------------------------------------------------

def test_expected_tokens_per_step():
    def spec(n, a):
        return Speculation(method="eagle", num_tokens=n, acceptance_frac=a).expected_tokens
    assert spec(1, 0.5) == pytest.approx(1.5, rel=1e-12)  # 1 + 0.5
    assert spec(3, 0.6) == pytest.approx((1 - 0.6**4) / 0.4, rel=1e-12) == pytest.approx(2.176, rel=1e-12)
    assert spec(4, 0.0) == 1.0  # every draft rejected: the target's own token only


def _by_hand_steps(tokens: int) -> float:
    """The small model's decode step at batch 1, context 1,000, running ``tokens`` tokens per sequence: its GEMMs
    stay weight-bound up to 4 tokens (2W(m + 180)/GEMM < W·2 B/HBM), the KV cache is read once, elementwise
    work scales with the tokens (test_serving_cost.test_decode_step_by_hand gives the one-token step)."""
    attention, mlp, head = 1024 * 3072 + 1024 * 1024, 3 * 1024 * 4096, 32000 * 1024
    weights = 2 * (2 * (attention + mlp)) / HBM + 2 * head / HBM
    return weights + 2 * 1000 * 4096 / HBM + tokens * 2 * 1024 * 24 / HBM + 2 * 12 * 1.5e-6


def test_speculative_tpot_by_hand(h100):  # noqa: F811
    model, shard = small_model(), Sharding.of(1)
    plain = engine_decode_s(model, h100, ENGINE_TRAITS["sglang"], BF16, shard, 1, 1000)
    assert plain == pytest.approx(_by_hand_steps(1) + SGLANG_STEP_S, rel=1e-12)
    spec = Speculation(method="eagle", num_tokens=1, acceptance_frac=0.5, draft_model="head")
    got = engine_decode_s(model, h100, _traits("sglang", speculation=spec), BF16, shard, 1, 1000)
    # verify 2 tokens + one draft token at one layer's share (step / 2 layers) + the step overhead, over 1.5 tokens
    expected = (_by_hand_steps(2) + _by_hand_steps(1) / 2 + SGLANG_STEP_S) / 1.5
    assert got == pytest.approx(expected, rel=1e-12)
    assert got < plain
    assert decode_step_s(model, h100, BF16, shard, 1, 1000, tokens_per_sequence=2.0) == \
        pytest.approx(_by_hand_steps(2), rel=1e-12)


def test_zero_acceptance_costs_the_draft_without_a_speedup(h100):  # noqa: F811
    model, shard = small_model(), Sharding.of(1)
    plain = engine_decode_s(model, h100, ENGINE_TRAITS["vllm"], BF16, shard, 1, 1000)
    spec = Speculation(method="eagle", num_tokens=3, acceptance_frac=0.0)
    got = engine_decode_s(model, h100, _traits("vllm", speculation=spec), BF16, shard, 1, 1000)
    assert got == pytest.approx(_by_hand_steps(4) + 3 * _by_hand_steps(1) / 2 + VLLM_STEP_S, rel=1e-12)
    assert got > plain


def test_a_draft_model_runs_its_own_decode_step_per_token(h100):  # noqa: F811
    target, draft, shard = small_model(num_layers=8), small_model(), Sharding.of(1)
    spec = Speculation(method="draft", num_tokens=2, acceptance_frac=0.8, draft_model="tiny", draft=draft)
    got = engine_decode_s(target, h100, _traits("trtllm", speculation=spec), BF16, shard, 16, 1000)
    verify = decode_step_s(target, h100, BF16, shard, 16, 1000, tokens_per_sequence=3.0)
    drafted = 2 * decode_step_s(draft, h100, BF16, shard, 16, 1000)
    assert got == pytest.approx((verify + drafted + TRTLLM_STEP_S) / ((1 - 0.8**3) / 0.2), rel=1e-12)
    # the draft's weights and KV cache come out of the pool
    alone = engine_memory(target, h100, ENGINE_TRAITS["vllm"], BF16, shard, 2048)
    both = engine_memory(target, h100, _traits("vllm", speculation=spec), BF16, shard, 2048)
    assert both.kv_pool_bytes == pytest.approx(alone.kv_pool_bytes - draft.total_params() * 2.0, rel=1e-9)
    assert both.kv_bytes_per_sequence == pytest.approx(alone.kv_bytes_per_sequence * 10 / 8, rel=1e-12)  # 2 + 8 layers


# --- validation -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory_fraction": 0.0}, "--memory-fraction must be in (0, 1], got 0.0"),
    ({"memory_fraction": 1.2}, "--memory-fraction must be in (0, 1], got 1.2"),
    ({"speculative": "eagle", "spec_tokens": 3, "acceptance": 1.0}, "--acceptance must be in [0, 1), got 1.0"),
    ({"speculative": "eagle", "spec_tokens": 3, "acceptance": -0.1}, "--acceptance must be in [0, 1)"),
    ({"speculative": "eagle", "spec_tokens": 0, "acceptance": 0.5}, "--spec-tokens must be an integer >= 1, got 0"),
    ({"speculative": "eagle", "spec_tokens": 2.5, "acceptance": 0.5}, "--spec-tokens must be an integer >= 1"),
    ({"speculative": "mtp", "spec_tokens": 1, "acceptance": 0.5}, "llama-3.1-8b has no MTP layers"),
    ({"speculative": "medusa", "spec_tokens": 1, "acceptance": 0.5}, "give mtp, eagle, eagle:MODEL or draft:MODEL"),
    ({"speculative": "draft", "spec_tokens": 1, "acceptance": 0.5}, "give mtp, eagle, eagle:MODEL or draft:MODEL"),
    ({"speculative": "eagle"}, "--speculative needs --spec-tokens N"),
    ({"spec_tokens": 2}, "--spec-tokens and --acceptance go with --speculative"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(InputError) as caught:
        paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=1024, osl=512, concurrency=8, **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_mtp_is_accepted_for_a_model_with_mtp_layers():
    from paraplan.cost_models.serving import check_speculation
    from paraplan.model_specs.served import served_model

    deepseek = served_model("deepseek-v3").spec
    assert deepseek.mtp_layers == 1
    check_speculation(deepseek, Speculation(method="mtp", num_tokens=1, acceptance_frac=0.8))


# --- the plan document and the command line ------------------------------------------------------------------

def test_settings_reach_the_plan_document():
    result = paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=1024, osl=512, concurrency=8, top=1,
                            engines=["vllm"], tp=1, memory_fraction=0.8, cuda_graphs=False,
                            speculative="draft:llama-3.1-8b", spec_tokens=2, acceptance=0.6)
    entry = result.document["plans"][0]
    assert schema_errors(result.document, serving_schema()) == []
    assert {p["memory_frac"] for p in entry["pools"]} == {0.8}
    assert entry["engine_options"] == {"cuda_graphs": False, "speculative": {
        "method": "draft", "num_tokens": 2, "acceptance_frac": 0.6, "draft_model": "meta-llama/Llama-3.1-8B",
        "expected_tokens_per_step": pytest.approx(1 + 0.6 + 0.36)}}
    default = paraplan.serve("llama-3.1-8b", gpu="h100-sxm", gpus=8, isl=1024, osl=512, concurrency=8, top=1,
                             engines=["vllm"], tp=1)
    assert "engine_options" not in default.document["plans"][0]


def test_serve_command_takes_and_exports_the_settings(tmp_path):
    runner = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: ""})
    base = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", "--isl", "1024", "--osl", "512",
            "--concurrency", "8", "--top", "1", "--tp", "1"]
    result = runner.invoke(app, [*base, "--memory-fraction", "0.8", "--no-cuda-graphs", "--speculative", "eagle:e/h",
                                 "--spec-tokens", "3", "--acceptance", "0.7", "--export", "sglang", "-o",
                                 str(tmp_path)])
    assert result.exit_code == 0, result.output
    script = (tmp_path / "serve.sh").read_text()
    assert "--mem-fraction-static 0.8 " in script and "--disable-decode-cuda-graph" in script
    assert ("--speculative-algorithm EAGLE --speculative-draft-model-path e/h --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4") in script
    assert_bad_input(runner.invoke(app, [*base, "--memory-fraction", "1.5"]), "--memory-fraction must be in (0, 1]")
    assert_bad_input(runner.invoke(app, [*base, "--speculative", "mtp", "--spec-tokens", "1", "--acceptance", "0.5"]),
                     "--speculative mtp: llama-3.1-8b has no MTP layers")
