"""Which of the profile store's aiconfigurator tables price one serving deployment's kernels.

A deployment runs one engine (``trtllm``, ``sglang``, ``vllm``) at one version on one GPU, with one quantization per
GEMM kind. Its tables are that engine's rows on that GPU (``stack`` ``"<engine> <version>"``): the deployment's own
version where the store holds it for the op, else the newest version stored for the engine (per op: aiconfigurator
measures each op at its own versions). Within a version and dtype the kernel with the most rows at the model's
shapes is used (one kernel's surface, not a median across kernels that the engine would not mix). MoE rows take
aiconfigurator's default routing (``power_law_1.01``: its SDK queries ``workload_distribution`` power_law with alpha
1.01), else balanced. The TP all-reduce reads the engine's custom all-reduce (its CUDA-graph variant, which decode
replays) where measured, then NCCL's newest all-reduce.

Each (store, GPU, op kind) is read from SQLite once per process (an H100's GEMM rows: about 344,000) and filtered in
memory. ``deployment_tables`` caches one deployment's built tables beside the store (``<store>.models/kernel_tables/
<GPU>/serving-...``, keyed by a digest of the GPU's stored files, as ``kernel_source`` caches training tables), so a
second ``paraplan serve`` loads them in milliseconds instead of reading the rows again (about 7 s per GPU).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paraplan.cost_models.kernel_source import _cache_path, _load, _mark_none, _save
from paraplan.cost_models.kernel_tables import KernelTable, build_table
from paraplan.cost_models.serving_kernels import ServingKernels
from paraplan.measurements.ingest.aiconfigurator_tables import MLA_SHAPE
from paraplan.measurements.kernel_rows import store_version
from paraplan.measurements.store import _read_sql
from paraplan.model_specs.model_spec import ModelSpec

MODE_DTYPES = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4", "mxfp4": "w4a16_mxfp4",
               "int4_wo": "int4_wo"}
"""An engine's quantization mode (cost_models.serving) -> the dtype its aiconfigurator rows are stored under."""
MOE_DISTRIBUTIONS = ("power_law_1.01", "balanced")
COLUMNS = {
    "gemm": ("m", "n", "k"),
    "attention": ("pass", "batch", "seq_len", "prefix", "kv_len", "heads", "kv_heads", "head_dim", "window",
                  "kv_dtype", "mla", *MLA_SHAPE),
    "moe": ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
            "distribution"),
    "collective": ("size_bytes", "group_size", "domain", "kernel"),
}
"""The params read per op kind (measurements/ingest/aiconfigurator_tables.py names them)."""


@lru_cache(maxsize=32)
def _rows(store: str, modified_ns: int, hardware: str, kind: str) -> pd.DataFrame:
    """Every stack-tagged row of ``kind`` on ``hardware``: name, stack, engine, version, dtype, time_s and the kind's
    params (``modified_ns``: the store's mtime, so a changed store is read again)."""
    fields = ", ".join(f"json_extract(params, '$.{c}') AS {c}" for c in COLUMNS[kind])
    frame = _read_sql(Path(store), f"SELECT name, time_s, json_extract(params, '$.stack') AS stack, "
                      f"COALESCE(json_extract(params, '$.dtype'), '') AS dtype, {fields} FROM measurements "
                      "WHERE hardware = ? AND kind = ? AND json_extract(params, '$.stack') IS NOT NULL",
                      (hardware, kind))
    split = frame["stack"].str.split(" ", n=1, expand=True).reindex(columns=[0, 1])
    return frame.assign(engine=split[0].fillna(""), version=split[1].fillna(""))


def rows(store: Path, hardware: str, kind: str) -> pd.DataFrame:
    """The store's rows of ``kind`` on ``hardware`` (empty without a store)."""
    path = Path(store)
    if not path.is_file():
        return pd.DataFrame(columns=["name", "time_s", "stack", "dtype", "engine", "version", *COLUMNS[kind]])
    return _rows(str(path.resolve()), path.stat().st_mtime_ns, hardware, kind)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of an engine version: numbers compare as numbers (``1.3.0rc23`` after ``1.3.0rc20``); a name
    without a leading number (``nightly-dev``) sorts first."""
    parts = re.findall(r"\d+|[a-z]+", version.lower())
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in parts) if parts and parts[0].isdigit() else ()


def pick_version(frame: pd.DataFrame, version: str) -> pd.DataFrame:
    """The rows of ``version`` if any, else of the newest version in ``frame``."""
    if frame.empty or (frame["version"] == version).any():
        return frame[frame["version"] == version]
    newest = max(frame["version"].unique(), key=version_key)
    return frame[frame["version"] == newest]


def _table(op: str, axes: tuple[str, ...], frame: pd.DataFrame, label: str,
           exponents_above: tuple[float | None, ...] | None = None) -> KernelTable:
    """A table of ``frame``'s rows over ``axes``, made monotone from above: each cell lowered to the fastest
    measured cell at or above it on every axis. ``build_table``'s running maximum raises every cell to the slowest
    below it, so one slow outlier (the H100 vLLM fp8 table times (m 17, n 2048, k 768) at 57 us, ten times its
    neighbours) would become the floor of every larger shape; GPU timings err slow (interference, a kernel
    heuristic's bad pick), rarely fast, so the envelope from above keeps the physics and drops the outliers."""
    table = build_table(op, axes, frame[list(axes)].to_numpy(float), frame["time_s"].to_numpy(float), label,
                        monotone=(False,) * len(axes), exponents_above=exponents_above)
    grid = table.log_seconds
    lowered = grid
    for axis in range(grid.ndim):
        flipped = np.flip(lowered, axis=axis)
        lowered = np.flip(np.fmin.accumulate(np.where(np.isnan(flipped), np.inf, flipped), axis=axis), axis=axis)
    lowered = np.where(np.isnan(grid), np.nan, lowered)
    return replace(table, log_seconds=lowered,
                   axes=tuple(replace(axis, monotone=True) for axis in table.axes))


def _one_kernel(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the kernel with the most rows (ties: the first name)."""
    if frame.empty:
        return frame
    counts = frame.groupby("name").size()
    return frame[frame["name"] == counts.sort_values(ascending=False, kind="stable").index[0]]


def _chosen(frame: pd.DataFrame, engine: str, version: str, dtype: str) -> pd.DataFrame:
    mine = frame[(frame["engine"] == engine) & (frame["dtype"] == dtype)]
    return _one_kernel(pick_version(mine, version))


def _fastest(frame: pd.DataFrame, engine: str, version: str, dtype: str, shape: tuple[str, ...]) -> pd.DataFrame:
    """The engine's rows of ``dtype`` at ``version`` (else its newest), at each shape the fastest of its kernels there:
    where an engine ships several kernels for one op (TensorRT-LLM's CUTLASS, min-latency and TRT-LLM-gen MoE
    backends; vLLM's CUTLASS and DeepGEMM block-fp8 GEMMs), its autotuner and NVIDIA's serving recipes pick the
    fastest, so a deployment runs that one. ``name`` lists the kernels that won a shape."""
    mine = pick_version(frame[(frame["engine"] == engine) & (frame["dtype"] == dtype)], version)
    if mine.empty or mine["name"].nunique() == 1:
        return mine
    mine = mine.reset_index(drop=True)  # idxmin's labels must name one row each
    best = mine.loc[mine.groupby(list(shape))["time_s"].idxmin()]
    return best.assign(name=" / ".join(sorted(best["name"].unique())))


def _describe(frame: pd.DataFrame, what: str) -> str:
    return f"{what} {frame['dtype'].iloc[0]} {frame['name'].iloc[0]} on {frame['stack'].iloc[0]} ({len(frame):,} rows)"


EXCESS_FLOOR_MIN_S = 1e-6
"""Floors within 1 us of the fastest peer's are timing noise, not work per call (the bf16 GEMM floors of the three
engines agree within 0.1 us on H100, H200 and B200)."""


def without_excess_floor(frame: pd.DataFrame, peers: pd.DataFrame, shape: tuple[str, ...] = ("m", "n", "k")
                         ) -> tuple[pd.DataFrame, float]:
    """(``frame`` less its excess per-call floor, that excess in seconds). The floor of a GEMM table is its fastest
    call, the tiny shapes where no kernel moves enough bytes to matter: launch, host dispatch and whatever else the
    collector timed around the kernel. Where one table's floor stands more than ``EXCESS_FLOOR_MIN_S`` above the
    fastest floor of ``peers`` (the other kernels' tables of the same GPU and dtype), the difference is work per call
    the others show a CUDA-graph step need not pay: it comes off every cell, never below the fastest peer's time at
    that shape (the peers' floor where none measured it) and never above the cell's own time. TensorRT-LLM
    1.3.0rc20's per-tensor fp8 path floors at 12 us a call on H100, H200 and B200 against 4.2-4.9 us for vLLM's and
    SGLang's fp8 kernels; with it, Llama-3.1-70B's fp8 GEMMs alone at tp 8 on B200 take 5.9 ms a decode step, longer
    than the 5.4 ms the whole step measured (aiconfigurator's silicon sample). ``shape``: the columns a cell is keyed
    by (a routed-expert table's: its token count)."""
    mine = pd.MultiIndex.from_frame(frame[["engine", "version", "name"]]).unique()
    others = peers[~pd.MultiIndex.from_frame(peers[["engine", "version", "name"]]).isin(mine)]
    if frame.empty or others.empty:
        return frame, 0.0
    reference = float(others.groupby(["engine", "version", "name"])["time_s"].min().min())
    excess = float(frame["time_s"].min()) - reference
    if excess <= EXCESS_FLOOR_MIN_S:
        return frame, 0.0
    best = others.groupby(list(shape))["time_s"].min()
    at = best.reindex(pd.MultiIndex.from_frame(frame[list(shape)])).to_numpy(dtype=float)
    own = frame["time_s"].to_numpy(dtype=float)
    lowered = np.maximum(own - excess, np.where(np.isnan(at), reference, at))
    return frame.assign(time_s=np.minimum(own, lowered)), excess


def _gemm_table(store: Path, hardware: str, engine: str, version: str, mode: str) -> tuple[KernelTable | None, str]:
    dtype = MODE_DTYPES.get(mode, mode)
    every = rows(store, hardware, "gemm")
    frame = _fastest(every, engine, version, dtype, ("m", "n", "k"))
    if frame.empty:
        return None, ""
    frame, excess = without_excess_floor(frame, every[every["dtype"] == dtype])
    label = _describe(frame, "GEMM") + (f", less {excess * 1e6:.1f} us a call of excess floor" if excess else "")
    return _table("gemm", ("m", "n", "k"), frame, f"{hardware} {label}"), label


def _moe_tables(store: Path, hardware: str, engine: str, version: str, mode: str,
                model: ModelSpec) -> tuple[dict[tuple[int, int], KernelTable], str]:
    """Routed-expert tables for the model's expert shape, by (moe_tp, moe_ep), over tokens."""
    if not model.is_moe:  # a dense model reads no MoE rows (about 2 s of SQLite per GPU)
        return {}, ""
    frame = rows(store, hardware, "moe")
    if frame.empty:
        return {}, ""
    shape = (frame["hidden_size"] == model.hidden_size) & (frame["inter_size"] == model.expert_ffn_size) \
        & (frame["topk"] == model.experts_per_token) & (frame["num_experts"] == model.num_experts)
    frame = frame[shape]
    dtype = MODE_DTYPES.get(mode, mode)
    for distribution in MOE_DISTRIBUTIONS:
        alike = frame[(frame["distribution"] == distribution) & (frame["dtype"] == dtype)]
        chosen = _fastest(alike, engine, version, dtype, ("num_tokens", "moe_tp_size", "moe_ep_size"))
        if not chosen.empty:
            tables, excesses = {}, []
            for (tp, ep), part in chosen.groupby(["moe_tp_size", "moe_ep_size"]):
                peers = alike[(alike["moe_tp_size"] == tp) & (alike["moe_ep_size"] == ep)]
                part, excess = without_excess_floor(part, peers, ("num_tokens",))
                tables[(int(tp), int(ep))] = _table("moe", ("num_tokens",), part, f"{hardware} MoE tp{tp} ep{ep}")
                excesses.append(excess)
            most = max(excesses)
            less = f", less up to {most * 1e6:.1f} us a call of excess floor" if most else ""
            return tables, f"{_describe(chosen, 'MoE')}, {distribution}{less}"
    return {}, ""


def _mla_rows(frame: pd.DataFrame, model: ModelSpec) -> pd.Series:
    """Which attention rows a model's attention kernel is: MLA rows of its latent shape for an MLA model (keyed by
    (heads, 1): every query head of a GPU attends to the one latent KV head), else the standard rows of its head dim
    without a window."""
    mla = frame["mla"] == 1
    if not model.is_mla:
        return ~mla & (frame["head_dim"] == model.head_dim) & (frame["window"] == 0)
    shape = {"kv_lora_rank": model.kv_lora_rank, "qk_nope_head_dim": model.qk_nope_head_dim,
             "qk_rope_head_dim": model.qk_rope_head_dim, "v_head_dim": model.v_head_dim}
    return mla & np.logical_and.reduce([frame[key] == value for key, value in shape.items()])


def _attention_tables(store: Path, hardware: str, engine: str, version: str, model: ModelSpec, kv_dtype: str,
                      decode: bool) -> tuple[dict[tuple[int, int], KernelTable], str]:
    """Decode or prefill attention tables for the model's attention kernel (``_mla_rows``) and KV dtype (no cached
    prefix), by (heads, KV heads) per GPU: decode over (sequences, keys per sequence), prefill over (sequences, new
    tokens)."""
    frame = rows(store, hardware, "attention")
    if frame.empty:
        return {}, ""
    length = "kv_len" if decode else "seq_len"
    frame = frame[(frame["pass"] == ("decode" if decode else "forward")) & _mla_rows(frame, model)
                  & (frame["kv_dtype"] == kv_dtype)]
    if model.is_mla:
        frame = frame.assign(kv_heads=1)
    if not decode:
        frame = frame[frame["prefix"] == 0]
    mine = pick_version(frame[frame["engine"] == engine], version)
    # The attention math runs in the KV dtype where the engine measured that (TRT-LLM's fp8 context FMHA), else bf16.
    dtype = kv_dtype if (mine["dtype"] == kv_dtype).any() else "bf16"
    chosen = _one_kernel(mine[mine["dtype"] == dtype])
    if chosen.empty:
        return {}, ""
    tables = {(int(h), int(kv)): _table("attention", ("batch", length), part, f"{hardware} attention h{h} kv{kv}",
                                        exponents_above=(1.0, 1.0 if decode else 2.0))
              for (h, kv), part in chosen.groupby(["heads", "kv_heads"])}
    what = ("MLA " if model.is_mla else "") + ("decode attention" if decode else "prefill attention")
    return tables, _describe(chosen, what)


def _all_reduce_tables(store: Path, hardware: str, engine: str, version: str) -> tuple[tuple[KernelTable, ...], str]:
    """The engine's custom all-reduce (CUDA-graph variant where measured), then NCCL's newest, inside a domain."""
    frame = rows(store, hardware, "collective")
    frame = frame[(frame["domain"] == "intra") & (frame["size_bytes"] > 0) & (frame["group_size"] > 1)]
    custom = pick_version(frame[(frame["name"] == "custom_all_reduce") & (frame["engine"] == engine)], version)
    graph = custom[custom["kernel"].str.contains("graph", case=False)]
    custom = graph if not graph.empty else custom
    nccl = frame[(frame["name"] == "all_reduce") & (frame["engine"] == "nccl") & frame["dtype"].isin(["bf16", "fp16"])]
    nccl = pick_version(nccl, "")
    tables, labels = [], []
    for part, exponent, what in ((custom, None, "custom all-reduce"), (nccl, 1.0, "NCCL all-reduce")):
        if part.empty:
            continue
        part = part[part["kernel"] == part["kernel"].iloc[0]]
        tables.append(_table("all_reduce", ("size_bytes", "group_size"), part, f"{hardware} {what}",
                             exponents_above=(exponent, None)))
        labels.append(f"{what} {part['kernel'].iloc[0]} on {part['stack'].iloc[0]}")
    return tuple(tables), ", ".join(labels)


def _term_tables(store: Path, hardware: str, *, engine: str, version: str, model: ModelSpec, dense_mode: str,
                 attention_mode: str, moe_mode: str, kv_dtype: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(ServingKernels' table fields, the label of each term's tables: '' where the store holds none)."""
    dense, dense_label = _gemm_table(store, hardware, engine, version, dense_mode)
    attention, attention_label = _gemm_table(store, hardware, engine, version, attention_mode)
    head, head_label = _gemm_table(store, hardware, engine, version, "bf16")
    moe, moe_label = _moe_tables(store, hardware, engine, version, moe_mode, model)
    decode, decode_label = _attention_tables(store, hardware, engine, version, model, kv_dtype, True)
    prefill, prefill_label = _attention_tables(store, hardware, engine, version, model, kv_dtype, False)
    all_reduce, all_reduce_label = _all_reduce_tables(store, hardware, engine, version)
    labels = {"dense GEMMs": dense_label, "attention projections": attention_label, "head and router": head_label,
              "routed experts": moe_label, "decode attention": decode_label, "prefill attention": prefill_label,
              "TP all-reduce": all_reduce_label}
    fields = {"dense_gemm": dense, "attention_gemm": attention, "head_gemm": head, "moe": moe,
              "decode_attention": decode, "prefill_attention": prefill, "all_reduce": all_reduce}
    return fields, labels


def _kernels_label(hardware: str, engine: str, version: str, labels: dict[str, str]) -> str:
    found = "; ".join(f"{term}: {label}" for term, label in labels.items() if label)
    return f"aiconfigurator tables ({hardware}, {engine} {version} deployment) - {found}"


def serving_kernels(store: Path, hardware: str, *, engine: str, version: str, model: ModelSpec, dense_mode: str,
                    attention_mode: str, moe_mode: str, kv_dtype: str) -> ServingKernels | None:
    """The tables of one deployment's kernels on ``hardware`` (quantization modes as ``cost_models.serving`` names
    them; ``kv_dtype`` bf16 or fp8), or None when the store holds none of them."""
    fields, labels = _term_tables(store, hardware, engine=engine, version=version, model=model,
                                  dense_mode=dense_mode, attention_mode=attention_mode, moe_mode=moe_mode,
                                  kv_dtype=kv_dtype)
    if not any(labels.values()):
        return None
    return ServingKernels(**fields, label=_kernels_label(hardware, engine, version, labels))


def covered_terms(kernels: ServingKernels) -> tuple[str, ...]:
    """The terms ``kernels`` holds tables for (for reports)."""
    held = {"dense GEMMs": kernels.dense_gemm, "attention projections": kernels.attention_gemm,
            "head": kernels.head_gemm, "routed experts": kernels.moe, "decode attention": kernels.decode_attention,
            "prefill attention": kernels.prefill_attention, "TP all-reduce": kernels.all_reduce}
    return tuple(name for name, table in held.items() if table is not None and (not isinstance(table, (dict, tuple))
                                                                                   or len(table) > 0))



def table_modes(model: ModelSpec, gemm_mode: str, moe_mode: str, attention_16bit: bool) -> tuple[str, str, str]:
    """(dense, attention, routed-expert) table modes of a deployment quantized ``gemm_mode``/``moe_mode``, as
    ``cost_models.serving.weight_precision`` prices them: an MoE checkpoint in nvfp4 keeps its dense layers in fp8,
    and attention a checkpoint leaves unquantized (``attention_16bit``) runs 16-bit GEMMs."""
    dense = "fp8" if model.is_moe and gemm_mode == "nvfp4" else gemm_mode
    return dense, "bf16" if attention_16bit else dense, moe_mode


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentTables:
    """One deployment's tables with what each term was read from (for provenance)."""

    kernels: ServingKernels
    """The tables, as ``inference_step.step_time`` reads them from ``ClusterSpec.serving_kernels``."""
    terms: tuple[tuple[str, str], ...]
    """(term, the kernel, dtype, engine version and rows its table was built from) per term a table prices."""
    engine: str
    """The engine whose tables these are."""

    @property
    def versions(self) -> tuple[str, ...]:
        """The engine's versions the tables were measured under (each op at its own: usually one)."""
        found = {v for _, label in self.terms for v in re.findall(rf" on {re.escape(self.engine)} ([^\s,()]+)", label)}
        return tuple(sorted(found, key=version_key))


SERVING_TABLE_RULES_VERSION = 5
"""Part of every cached deployment's key: raise it when the choice or the building of a serving table changes."""


def _shape_key(model: ModelSpec) -> list[Any]:
    """The model's numbers the tables are chosen by (attention head dim and kind; the routed experts' shape)."""
    experts = [model.hidden_size, model.expert_ffn_size, model.experts_per_token, model.num_experts]
    latent = [model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim]
    return [model.head_dim, model.is_mla, bool(model.indexer_params), model.is_moe,
            *(experts if model.is_moe else [0] * len(experts)), *(latent if model.is_mla else [])]


def _flatten(fields: dict[str, Any]) -> dict[str, KernelTable]:
    """ServingKernels' table fields as one flat dict (``moe/1/8``, ``decode_attention/8/1``, ``all_reduce/0``)."""
    flat: dict[str, KernelTable] = {}
    for name, value in fields.items():
        if isinstance(value, dict):
            flat.update({f"{name}/{a}/{b}": table for (a, b), table in value.items()})
        elif isinstance(value, tuple):
            flat.update({f"{name}/{i}": table for i, table in enumerate(value)})
        elif value is not None:
            flat[name] = value
    return flat


def _unflatten(flat: dict[str, KernelTable]) -> dict[str, Any]:
    fields: dict[str, Any] = {"moe": {}, "decode_attention": {}, "prefill_attention": {}, "all_reduce": []}
    for key, table in flat.items():
        name, *index = key.split("/")
        if len(index) == 2:
            fields[name][(int(index[0]), int(index[1]))] = table
        elif index:
            fields[name].append(table)
        else:
            fields[name] = table
    return {**fields, "all_reduce": tuple(fields["all_reduce"])}


def _write_labels(path: Path, labels: dict[str, str]) -> None:
    """The terms' labels beside the cached tables (best effort, as ``kernel_source._save``)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(labels))
    except OSError:
        return


def _read_labels(path: Path) -> dict[str, str] | None:
    try:
        labels = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return labels if isinstance(labels, dict) else None


def deployment_tables(store: Path, hardware: str, *, engine: str, version: str, model: ModelSpec, dense_mode: str,
                      attention_mode: str, moe_mode: str, kv_dtype: str) -> DeploymentTables | None:
    """``serving_kernels`` with its provenance, cached beside the store for this state of ``hardware``'s files (a
    deployment without tables leaves a ``.none`` marker); ``version`` '' takes the newest stored per op."""
    query = [SERVING_TABLE_RULES_VERSION, engine, version, dense_mode, attention_mode, moe_mode, kv_dtype,
             *_shape_key(model)]
    what = f"serving-{engine}-{hashlib.sha256(json.dumps(query).encode()).hexdigest()[:16]}"
    path = _cache_path(store, hardware, what, store_version(store, hardware))
    label_path = path.with_suffix(".json")
    if path.with_suffix(".none").is_file():
        return None
    flat = _load(path) if path.is_file() else None
    labels = _read_labels(label_path) if flat is not None else None
    if flat is not None and labels is not None:
        fields = _unflatten(flat)
    else:
        fields, labels = _term_tables(store, hardware, engine=engine, version=version, model=model,
                                      dense_mode=dense_mode, attention_mode=attention_mode, moe_mode=moe_mode,
                                      kv_dtype=kv_dtype)
        if not any(labels.values()):
            _mark_none(path.with_suffix(".none"))
            return None
        _write_labels(label_path, labels)  # first: the tables' file is what marks the entry complete
        _save(path, _flatten(fields))
    labels = {term: label for term, label in labels.items() if term not in _unpriced_terms(model)}
    kernels = ServingKernels(**fields, label=_kernels_label(hardware, engine, version, labels))
    return DeploymentTables(kernels=kernels, terms=tuple((t, lab) for t, lab in labels.items() if lab), engine=engine)


def _unpriced_terms(model: ModelSpec) -> set[str]:
    """Terms ``serving_kernels`` never prices for ``model`` whatever the store holds: MLA's low-rank projections and
    a sparse-attention indexer's, and DSA attention cores, stay analytical (serving_kernels.py)."""
    skip = {"attention projections"} if model.is_mla or model.indexer_params else set()
    return skip | ({"decode attention", "prefill attention"} if model.mixers.index_topk else set())
