"""Multi-head latent attention priced from aiconfigurator's MLA tables (``context_mla_perf``, ``generation_mla_perf``):
their rows are stored as ``attention`` rows marked ``mla`` with DeepSeek-V3's latent shape; a DeepSeek-shaped model's
decode and prefill attention core takes the table's seconds per layer where it covers the shape and the roofline
elsewhere; a model of another shape, or a standard one, never reads them (the real wheel: skipped without it)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from conftest import aiconfigurator_wheel, one_cell_attention_table

from paraplan.cost_models import serving_kernels as sk
from paraplan.cost_models.inference_step import (
    GRAPH_KERNEL_OVERHEAD_S,
    KERNELS_PER_LAYER,
    MOE_EXTRA_KERNELS,
    Sharding,
    step_time,
)
from paraplan.cost_models.serving import weight_precision
from paraplan.cost_models.serving_kernel_source import serving_kernels
from paraplan.cost_models.serving_kernels import ServingKernels
from paraplan.hardware_profiles import load_cluster
from paraplan.model_specs.hf_config import load_model

DEEPSEEK = load_model("deepseek-v3")
"""61 layers of MLA (128 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128): the collectors' own shape."""
LAYERS = DEEPSEEK.num_layers
PREC = weight_precision(DEEPSEEK, "fp8_block", "fp8_block", "bf16")


@pytest.fixture
def h200():
    return load_cluster("dgx-h200", num_gpus=8)


def decode(cluster, tp: float, batch: float = 4.0, context: float = 100.0):
    return step_time(DEEPSEEK, cluster, PREC, Sharding.of(tp), tokens_per_rank=batch, sequences_per_rank=batch,
                     attended_keys=(batch * context, 0.0), attention_flops=(0.0, 0.0), decode=True)


def test_deepseek_is_in_the_collectors_shape():
    assert DEEPSEEK.is_mla and (DEEPSEEK.num_heads, DEEPSEEK.kv_lora_rank, DEEPSEEK.qk_nope_head_dim,
                                DEEPSEEK.qk_rope_head_dim, DEEPSEEK.v_head_dim) == (128, 512, 128, 64, 128)
    assert not DEEPSEEK.mixers.index_topk and LAYERS == 61


def test_hand_derived_mla_decode_step(h200):
    """tp 8: each GPU runs 128/8 = 16 query heads over the one latent head, the (16, 1) table. 4 sequences of 100 keys
    take its 9 us in each of the 61 layers: attention 61 x 9 us = 549 us; the 61 attention kernels the table stands
    for leave the graph's per-kernel gaps; every other term is the roofline's, to the bit."""
    kernels = ServingKernels(decode_attention={(16, 1): one_cell_attention_table(9e-6, decode=True)})
    plain = decode(h200, 8)
    priced = decode(dataclasses.replace(h200, serving_kernels=kernels), 8)
    assert float(priced.attention_s) == pytest.approx(LAYERS * 9e-6, rel=1e-12)
    assert float(priced.table_s) == pytest.approx(LAYERS * 9e-6, rel=1e-12)
    all_kernels = LAYERS * KERNELS_PER_LAYER + DEEPSEEK.num_moe_layers * MOE_EXTRA_KERNELS
    assert float(priced.overhead_s) == pytest.approx((all_kernels - LAYERS) * GRAPH_KERNEL_OVERHEAD_S, rel=1e-12)
    for part in ("gemm_s", "experts_s", "elementwise_s", "comm_s"):
        assert float(getattr(priced, part)) == float(getattr(plain, part)), part
    expected = float(plain.total_s) - float(plain.attention_s) + LAYERS * 9e-6 - LAYERS * GRAPH_KERNEL_OVERHEAD_S
    assert float(priced.total_s) == pytest.approx(expected, rel=1e-12)


def test_hand_derived_mla_prefill_step(h200):
    """One 64-token prompt at tp 8: the context table's (16, 1) cell at (1 sequence, 64 tokens) is 11 us per layer;
    an eager prefill keeps its host launches, so only the attention term moves."""
    table = one_cell_attention_table(11e-6, decode=False)
    priced_cluster = dataclasses.replace(h200, serving_kernels=ServingKernels(prefill_attention={(16, 1): table}))
    steps = [step_time(DEEPSEEK, cluster, PREC, Sharding.of(8), tokens_per_rank=64.0, sequences_per_rank=1.0,
                       attended_keys=(0.0, 0.0), attention_flops=(1e9, 0.0), decode=False)
             for cluster in (h200, priced_cluster)]
    assert float(steps[1].attention_s) == pytest.approx(LAYERS * 11e-6, rel=1e-12)
    assert float(steps[1].overhead_s) == float(steps[0].overhead_s)
    assert float(steps[1].total_s) == pytest.approx(
        float(steps[0].total_s) - float(steps[0].attention_s) + LAYERS * 11e-6, rel=1e-12)


def test_uncovered_shapes_keep_the_roofline(h200):
    """At tp 4 a GPU runs 32 heads, which the (16, 1) table does not hold; at tp 8, 3 sequences lie below its one
    cell; a sparse-attention (top-k indexer) model reads no attention table at all."""
    kernels = ServingKernels(decode_attention={(16, 1): one_cell_attention_table(9e-6, decode=True)})
    priced_cluster = dataclasses.replace(h200, serving_kernels=kernels)
    for tp, batch in ((4, 4.0), (8, 3.0)):
        plain, priced = decode(h200, tp, batch), decode(priced_cluster, tp, batch)
        assert float(priced.total_s) == float(plain.total_s) and float(priced.table_s) == 0.0
    sparse = dataclasses.replace(DEEPSEEK, mixers=dataclasses.replace(DEEPSEEK.mixers, index_topk=2048))
    seconds, covered = sk.decode_attention_s(kernels, sparse, 8, 4.0, 400.0)
    assert not covered.any() and np.isnan(seconds).all()


def mla_measurements(kv_lora_rank: int = 512):
    """A stored MLA table pair as the ingest writes it: trtllm 1.3.0rc20, 16 heads per GPU, bf16 KV."""
    from paraplan.measurements.ingest.records import Measurement

    shape = {"mla": 1, "kv_lora_rank": kv_lora_rank, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
             "v_head_dim": 128, "heads": 16, "dtype": "bf16", "kv_dtype": "bf16", "stack": "trtllm 1.3.0rc20"}
    rows = [Measurement(kind="attention", name="default", time_s=t, line=i + 1,
                        params={**shape, "pass": "decode", "batch": b, "kv_len": n})
            for i, (b, n, t) in enumerate([(4, 100, 9e-6), (4, 200, 12e-6), (8, 100, 10e-6), (8, 200, 15e-6)])]
    rows += [Measurement(kind="attention", name="default", time_s=t, line=10 + i,
                         params={**shape, "pass": "forward", "causal": 1, "prefix": 0, "batch": 1, "seq_len": s})
             for i, (s, t) in enumerate([(64, 11e-6), (128, 20e-6)])]
    return rows


def synthetic_store(path: Path, kv_lora_rank: int = 512) -> Path:
    from paraplan.measurements.ingest.records import ParsedFile
    from paraplan.measurements.store import ingest_all

    parsed = ParsedFile(path=f"mla-{kv_lora_rank}.parquet", sha256=f"{kv_lora_rank:064x}", kind="aiconfigurator",
                        hardware="h200-sxm", software="aiconfigurator-core 0.12.0",
                        measurements=tuple(mla_measurements(kv_lora_rank)))
    ingest_all([parsed], path)
    return path


def test_the_source_picks_mla_rows_of_the_models_shape_only(tmp_path):
    store = synthetic_store(tmp_path / "s.sqlite")
    found = serving_kernels(store, "h200-sxm", engine="trtllm", version="1.3.0rc20", model=DEEPSEEK,
                            dense_mode="fp8_block", attention_mode="fp8_block", moe_mode="fp8_block", kv_dtype="bf16")
    assert found is not None
    assert set(found.decode_attention) == {(16, 1)} and set(found.prefill_attention) == {(16, 1)}
    assert "decode attention: MLA decode attention bf16 default on trtllm 1.3.0rc20 (4 rows)" in found.label
    assert "prefill attention: MLA prefill attention bf16 default on trtllm 1.3.0rc20 (2 rows)" in found.label
    seconds, covered = sk.decode_attention_s(found, DEEPSEEK, 8, 8.0, 8 * 200.0)
    assert covered.all() and float(seconds) == pytest.approx(15e-6, rel=1e-9)
    other_shape = dataclasses.replace(DEEPSEEK, kv_lora_rank=256)
    assert serving_kernels(store, "h200-sxm", engine="trtllm", version="1.3.0rc20", model=other_shape,
                           dense_mode="bf16", attention_mode="bf16", moe_mode="bf16", kv_dtype="bf16") is None
    standard = dataclasses.replace(DEEPSEEK, kv_lora_rank=0, q_lora_rank=0, head_dim=192, num_kv_heads=128)
    assert serving_kernels(store, "h200-sxm", engine="trtllm", version="1.3.0rc20", model=standard,
                           dense_mode="bf16", attention_mode="bf16", moe_mode="bf16", kv_dtype="bf16") is None


def test_ingest_reads_mla_tables_as_marked_attention_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from paraplan.measurements.ingest.aiconfigurator_tables import parse_table

    common = {"framework": ["TRTLLM"] * 2, "version": ["1.3.0rc20"] * 2, "kernel_source": ["default"] * 2,
              "mla_dtype": ["bfloat16"] * 2, "kv_cache_dtype": ["bfloat16", "fp8"], "num_heads": [16, 16],
              "batch_size": [4, 8], "tp_size": [4, 4], "latency": [0.009, 0.012]}
    for table, isl, step in (("context_mla_perf", [64, 128], [0, 0]), ("generation_mla_perf", [1, 1], [99, 199])):
        buffer = io.BytesIO()
        pq.write_table(pa.table({**common, "isl": isl, "step": step}), buffer)
        folder = ("h200_sxm", "mla", "trtllm", "1.3.0rc20")
        records = parse_table(table, table, folder, 8, buffer.getvalue(), "0.12.0").records()
        params = [r.params for r in records]
        assert [r.kind for r in records] == ["attention"] * 2 and [r.time_s for r in records] == [9e-6, 12e-6]
        assert all(p["mla"] == 1 and p["kv_lora_rank"] == 512 and p["heads"] == 16 and "head_dim" not in p
                   for p in params)
        assert [p["kv_dtype"] for p in params] == ["bf16", "fp8"] and params[0]["stack"] == "trtllm 1.3.0rc20"
        if table == "context_mla_perf":
            assert [(p["pass"], p["seq_len"], p["prefix"]) for p in params] == [("forward", 64, 0), ("forward", 128, 0)]
        else:
            assert [(p["pass"], p["kv_len"]) for p in params] == [("decode", 100), ("decode", 200)]


# -- the real wheel ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def h200_attention_store(tmp_path_factory) -> Path:
    named = aiconfigurator_wheel()
    from paraplan.measurements.ingest import open_path
    from paraplan.measurements.store import ingest_all

    store = tmp_path_factory.mktemp("aic-mla") / "store.sqlite"
    ingest_all(open_path(named, kind="aiconfigurator", hardware="h200-sxm", ops=("attention",)).files(), store)
    return store


def test_real_mla_rows_price_a_deepseek_r1_decode_step(h200_attention_store, h200):
    import paraplan.data
    from paraplan.measurements.store import load_measurements

    rows = load_measurements(h200_attention_store, "h200-sxm", "attention")
    mla = rows[rows["mla"] == 1]
    counts = mla.groupby(["stack", "pass"]).size().to_dict()
    # context_mla_perf: 1,760 rows, generation_mla_perf: 2,896, for each of SGLang 0.5.14 and TRT-LLM 1.3.0rc20.
    assert counts == {("sglang 0.5.14", "decode"): 2896, ("sglang 0.5.14", "forward"): 1760,
                      ("trtllm 1.3.0rc20", "decode"): 2896, ("trtllm 1.3.0rc20", "forward"): 1760}
    assert set(mla["heads"]) == {1, 2, 4, 8, 16, 32, 64, 128} and set(mla["kv_dtype"]) == {"bf16", "fp8"}

    config = Path(paraplan.data.__file__).parent / "serving" / "model_configs" / "deepseek-ai--DeepSeek-R1_config.json"
    r1 = load_model(str(config))
    kernels = serving_kernels(h200_attention_store, "h200-sxm", engine="trtllm", version="1.3.0rc20", model=r1,
                              dense_mode="fp8_block", attention_mode="fp8_block", moe_mode="fp8_block",
                              kv_dtype="bf16")
    assert kernels is not None and (16, 1) in kernels.decode_attention
    assert "decode attention: MLA decode attention bf16 default on trtllm 1.3.0rc20" in kernels.label
    batch, context = 64.0, 2048.0
    per_layer, covered = sk.decode_attention_s(kernels, r1, 8, batch, batch * context)
    assert covered.all() and 1e-6 < float(per_layer) < 1e-3
    prec = weight_precision(r1, "fp8_block", "fp8_block", "bf16")
    step = step_time(r1, dataclasses.replace(h200, serving_kernels=kernels), prec, Sharding.of(8),
                     tokens_per_rank=batch, sequences_per_rank=batch, attended_keys=(batch * context, 0.0),
                     attention_flops=(0.0, 0.0), decode=True)
    assert float(step.attention_s) == pytest.approx(r1.num_layers * float(per_layer), rel=1e-12)
    assert float(step.table_s) == pytest.approx(r1.num_layers * float(per_layer), rel=1e-12)
