"""Mixture-of-Experts and MLA models read from config.json: exact parameter counts derived by hand
from the shipped configs, checked against the totals their authors publish, and every family's
rule for which layers are MoE."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.model_specs.hf_config import load_model, model_from_config

BILLION = 1e9


def _mixtral_8x7b_by_hand() -> tuple[int, int]:
    h, f, vocab, layers = 4096, 14336, 32000, 32
    attention = h * h + 2 * h * 1024 + h * h  # q, k, v (8 KV heads of 128), o
    expert = 3 * h * f  # gate, up, down
    layer = attention + 8 * expert + h * 8 + 2 * h  # + router + two RMSNorms
    active_layer = attention + 2 * expert + h * 8 + 2 * h
    edges = 2 * vocab * h + h  # untied embedding and head, final norm
    return edges + layers * layer, edges + layers * active_layer


def _deepseek_v3_by_hand() -> tuple[int, int, int]:
    h, heads, layers, dense = 7168, 128, 61, 3
    mla = (h * 1536 + 1536 + 1536 * heads * (128 + 64)  # q_a_proj, q_a_layernorm, q_b_proj
           + h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
           + heads * 128 * h)  # o_proj
    expert = 3 * h * 2048
    router = 256 * h + 256  # gate weight + e_score_correction_bias (noaux_tc)
    dense_layer = mla + 3 * h * 18432 + 2 * h
    moe_layer = mla + 256 * expert + expert + router + 2 * h  # 256 routed + 1 shared
    edges = 2 * 129280 * h + h
    total = edges + dense * dense_layer + (layers - dense) * moe_layer
    active = edges + dense * dense_layer + (layers - dense) * (moe_layer - 248 * expert)
    mtp = 2 * h + 2 * h * h + moe_layer + h  # enorm, hnorm, eh_proj, one layer, shared-head norm
    return total, active, mtp


def _gpt_oss_120b_by_hand() -> tuple[int, int]:
    h, layers, experts = 2880, 36, 128
    attention = (h * 4096 + 4096) + 2 * (h * 512 + 512) + (4096 * h + h) + 64  # biased q, k, v, o; 64 sinks
    expert = h * 2 * h + 2 * h + h * h + h  # gate_up_proj (+bias), down_proj (+bias); FFN 2880
    router = h * experts + experts
    layer = attention + experts * expert + router + 2 * h
    edges = 2 * 201088 * h + h
    return edges + layers * layer, edges + layers * (layer - (experts - 4) * expert)


def test_mixtral_8x7b_counts_by_hand_and_published():
    model = load_model("mixtral-8x7b")
    total, active = _mixtral_8x7b_by_hand()
    assert (model.total_params(), model.active_params()) == (total, active) == (46_702_792_704, 12_879_925_248)
    assert round(total / BILLION, 1) == 46.7 and round(active / BILLION, 1) == 12.9  # Mistral AI: 46.7B / 12.9B
    assert model.num_moe_layers == 32 and model.num_dense_layers == 0


def test_deepseek_v3_counts_by_hand_and_published():
    model = load_model("deepseek-v3")
    total, active, mtp = _deepseek_v3_by_hand()
    assert (model.total_params(), model.active_params(), model.mtp_params()) == (total, active, mtp)
    assert total == 671_026_419_200
    assert round(total / BILLION) == 671  # DeepSeek-V3 report: 671B total, 37B activated per token
    assert int(active / BILLION) == 37
    assert model.moe_layers == tuple(range(3, 61)) and model.is_mla and model.head_dim == 192


def test_qwen3_moe_counts_by_hand_and_published():
    small = load_model("qwen3-30b-a3b")
    h = 2048
    attention = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128  # q, k, v, o, q/k norms
    expert = 3 * h * 768
    layer = attention + 128 * expert + h * 128 + 2 * h
    edges = 2 * 151936 * h + h
    assert small.total_params() == edges + 48 * layer == 30_532_122_624
    assert small.active_params() == edges + 48 * (layer - 120 * expert) == 3_353_032_704
    assert round(small.total_params() / BILLION, 1) == 30.5 and round(small.active_params() / BILLION, 1) == 3.4
    large = load_model("qwen3-235b-a22b")
    assert round(large.total_params() / BILLION) == 235 and round(large.active_params() / BILLION) == 22  # Qwen3 report


def test_gpt_oss_120b_counts_by_hand_and_published():
    model = load_model("gpt-oss-120b")
    total, active = _gpt_oss_120b_by_hand()
    assert (model.total_params(), model.active_params()) == (total, active) == (116_829_156_672, 5_711_982_912)
    # OpenAI's model card: 116.83B total, 5.13B active (active counts the unembedding, not the embedding).
    assert round(total / BILLION, 2) == 116.83
    assert round((active - model.embedding_params()) / BILLION, 2) == 5.13
    assert (model.sliding_window, model.sliding_layers) == (128, 18)


def test_mixtral_8x22b_published():
    model = load_model("mixtral-8x22b")
    assert round(model.total_params() / BILLION) == 141 and round(model.active_params() / BILLION) == 39


def test_moe_flops_per_token_by_hand():
    model = load_model("mixtral-8x7b")
    h, seq = 4096, 4096
    attention_weights = 2 * h * h + 2 * h * 1024
    gemm = 2 * (attention_weights + h * 8 + 2 * 3 * h * 14336)  # router + two experts
    core = 4 * seq * h
    assert model.model_flops_per_token(seq) == 3 * (32 * (gemm + core) + 2 * h * 32000)
    # Mixtral's top-2 of 8 costs what a dense model of the same active parameters costs.
    assert model.model_flops_per_token(seq) < 0.3 * 6 * model.total_params() + 3 * 32 * core


def test_mla_attention_core_uses_qk_and_v_widths():
    model = load_model("deepseek-v3")
    # QKᵀ over 192-wide heads, AV over 128-wide values: 2·s·a·(192 + 128) per token, full convention.
    assert model.attention_core_flops_per_token(4096) == 2 * 4096 * 128 * (192 + 128)


_QWEN2_MOE = {
    "model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "shared_expert_intermediate_size": 128, "vocab_size": 100,
    "decoder_sparse_step": 2, "mlp_only_layers": [3],
}


def test_qwen2_moe_sparse_step_mlp_only_layers_and_shared_expert():
    model = model_from_config(_QWEN2_MOE, "tiny-qwen2-moe")
    assert model.moe_layers == (1, 5)  # (i + 1) % 2 == 0 gives 1, 3, 5; layer 3 is listed dense
    h = 64
    attention = 3 * (h * h + h) + h * h  # q, k, v with biases, o without
    shared = 3 * h * 128 + h  # shared expert MLP + its sigmoid gate (h -> 1)
    moe_layer = attention + 8 * 3 * h * 32 + shared + h * 8 + 2 * h
    dense_layer = attention + 3 * h * 256 + 2 * h
    assert model.total_params() == 2 * 100 * h + h + 2 * moe_layer + 4 * dense_layer


def test_deepseek_v2_without_query_compression():
    config = {
        "model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "intermediate_size": 256, "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 2,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 16,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "vocab_size": 100,
        "topk_method": "greedy",
    }
    model = model_from_config(config, "tiny-deepseek-v2")
    h = 64
    mla = h * 4 * 24 + h * (16 + 8) + 16 + 16 * 4 * (16 + 16) + 4 * 16 * h  # q_proj direct, no q norm
    assert model.attention_params() == mla
    assert model.moe_layers == (1, 2) and model.shared_expert_ffn_size == 64 and not model.router_bias


@pytest.mark.parametrize("spelling", [
    {"num_local_experts": 8, "num_experts_per_tok": 2},  # transformers 4.x Mixtral
    {"num_experts": 8, "num_experts_per_tok": 2},  # unified spelling
    {"num_local_experts": 8, "experts_per_token": 2},  # GPT-OSS spells top-k both ways
])
def test_expert_count_spellings(spelling):
    config = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, **spelling}
    model = model_from_config(config, "tiny-mixtral")
    assert (model.num_experts, model.experts_per_token, model.expert_ffn_size) == (8, 2, 128)


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 9}, "experts per token"),
    ({"num_local_experts": None}, "num_local_experts"),
    ({"num_local_experts": -8}, "num_experts must be a positive integer"),
])
def test_bad_moe_configs_are_one_clear_error(change, message):
    config = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 100, "num_local_experts": 8, "num_experts_per_tok": 2,
              **change}
    with pytest.raises(InputError, match=message):
        model_from_config(config, "bad-mixtral")


def test_models_show_and_list_report_moe_counts():
    runner = CliRunner()
    shown = runner.invoke(app, ["models", "show", "deepseek-v3"])
    assert shown.exit_code == 0
    for text in ("671,026,419,200", "37,552,297,472", "58 of 61", "8 of 256 per token", "kv rank 512"):
        assert text in shown.output
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0 and "8 of 128" in listed.output and "116.83" in listed.output
