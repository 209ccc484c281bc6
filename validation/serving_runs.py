"""Measured serving deployments (aiconfigurator's published silicon measurements) against paraplan's prediction.

``paraplan/data/serving/serving_runs.csv.gz`` (shipped with the package) holds 5,221 fixed-concurrency benchmark
rows from NVIDIA aiconfigurator (Apache-2.0; its README explains the columns, the source and licence of each row and
of each model config). Each row is mapped to a deployment (model config, GPU system, engine,
quantization, sharding, concurrency), predicted with ``cost_models.serving`` and compared on TTFT and
TPOT. A row is not covered only with a stated reason (a model feature the cost model does not price, a GPU
without the row's tensor-core dtype, a model without a config).
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paraplan.cost_models.inference_step import Sharding, WeightPrecision, prefill_attention_flops, step_time
from paraplan.cost_models.serving import (
    ENGINE_TRAITS,
    EngineTraits,
    Speculation,
    aggregated,
    benchmark_waves,
    check_speculation,
    decode_step_s,
    disaggregated,
    held_tokens,
    prefill_s,
    rank_batched_tokens,
    running_capacity,
    wave_mean,
    weight_precision,
)
from paraplan.cost_models.serving_kernel_source import serving_kernels, table_modes
from paraplan.cost_models.serving_kernels import ServingKernels
from paraplan.errors import InputError
from paraplan.files import decode_user_text, one_line, read_user_bytes
from paraplan.hardware_profiles import ClusterSpec
from paraplan.hardware_profiles.catalog import load_cluster, quick_cluster
from paraplan.model_specs.hf_config import load_model
from paraplan.model_specs.model_spec import ModelSpec

SERVING_DATA_ENV = "PARAPLAN_SERVING_DATA"
PACKAGED_FOLDER = "serving"
"""The shipped data's folder inside ``paraplan.data``."""
MEASUREMENTS_FILES = ("serving_runs.csv.gz", "serving_runs.csv", "aiconfigurator_silicon_sample.csv")
"""A data folder holds one of these (the first found is read) beside ``model_configs/``: the shipped layout
(gzip or plain) or aiconfigurator's own ``systems/silicon_sample.csv``, all 34 columns, under that name."""
MEASURED_COLUMNS = ("silicon_data_source", "backend", "model_path", "system", "mode", "isl", "osl", "batch_size",
                    "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size", "gemm_quant_mode",
                    "moe_quant_mode", "prefill_num_workers", "prefill_tp_size", "prefill_pp_size",
                    "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size", "decode_batch_size",
                    "decode_num_workers", "decode_tp_size", "decode_pp_size", "decode_attention_dp_size",
                    "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms")
"""Columns the predictions read (data/serving/README.md); a file without them is refused by name."""
TEXT_COLUMNS = ("silicon_data_source", "backend", "model_path", "system", "mode", "gemm_quant_mode", "moe_quant_mode")
"""The columns of ``MEASURED_COLUMNS`` that hold text; the others hold numbers or nothing."""
DEPLOYMENTS_FILE = "inferencex_deployments.csv"
"""Published deployments of rows that state none (``bench/inferencex_deployments.py`` builds it from InferenceX's
launch configs): read from the data folder, else the shipped one; applied by row ``id``."""
DEPLOYMENT_COLUMNS = tuple(f"{pool}_{axis}" for pool in ("prefill", "decode")
                           for axis in ("num_workers", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size"))
"""The columns a published deployment states (and replaces: the rows' decode columns repeat the prefill pool's)."""
RECV_INTERVAL = "scheduler_recv_interval"
"""SGLang's ``--scheduler-recv-interval`` a row's launch script set (``EngineTraits.scheduler_recv_interval``); NaN
where no published script states one above SGLang's default, 1."""
MAX_RECV_INTERVAL = 1000
"""Bound on a published receive interval (the shipped file states 10 and 30)."""
MEMORY_FRACTION = "memory_fraction"
"""The engine memory fraction a row's launch script set (under that engine's own rule, ``EngineTraits.budget``); NaN
where no published script states it (the engine's default is priced)."""
MAX_PUBLISHED_GPUS = 4096
"""Bound on a published worker count or parallel degree (the largest pool the shipped file states has 48 GPUs)."""
MAX_PUBLISHED_DRAFTS = 16
"""Bound on published MTP draft tokens a step (the shipped file states 1-3)."""
SPECULATIVE_TOKENS = "speculative_tokens"
"""MTP draft tokens a row's deployment ran per step (0: none); only published deployments state it."""
INFERENCEX_TWIN = "inferencex_twin"
"""The id of the InferenceX row whose measurement a row repeats ('' where none: ``inferencex_twins``)."""
FIXED_LENGTHS = "fixed_lengths"
"""Whether a row's benchmark sends every request at exactly its stated lengths (``AICONFIGURATOR_MARK``)."""
INFERENCEX_MARK = "wip="
"""The rows of SemiAnalysis' InferenceX benchmark (aiconfigurator's ``2026-03-25.csv`` and ``2026-04-06.csv`` sweeps,
3,368 rows) carry its API's ``wip`` field in ``silicon_data_source``; no other row does."""
INFERENCEX_WAVES = 10.0
"""InferenceX sends ten requests per concurrency slot: ``--num-prompts $((CONC * 10))`` in every benchmark script
of ``benchmarks/`` (SemiAnalysisAI/InferenceX, commit 12ba0ae07), so ten waves, the first a burst."""
INFERENCEX_LENGTH_SCALE = 0.9
"""InferenceX draws each prompt's input and output lengths uniformly from [0.8 L, L] (``RANDOM_RANGE_RATIO: 0.8``
in its benchmark workflows; ``sample_uniform`` in ``utils/bench_serving/benchmark_serving.py``): the mean is 0.9 L of
the stated ``isl`` and ``osl``."""
INFERENCEX_DB_MARK = "db-dump/"
"""The ``db-dump`` sweep (882 rows) is InferenceX's own results database: its source notes carry InferenceX's
workflow run and config ids and image tags, and 485 of its rows are the very measurements of InferenceX API rows
(``inferencex_twins``: TPOT and TTFT equal to 0.01 and 0.1 ms; 391 of them label DeepSeek-R1's runs with its
architecture's name, DeepSeek-V3)."""
AICONFIGURATOR_MARK = "aic-auto-gap-analysis/"
"""The rows of aiconfigurator's own gap-analysis sweeps (848 rows, ``aic-auto-gap-analysis/<gpu>/<engine>/<version>/``
in ``silicon_data_source``; none repeats an InferenceX measurement). aiconfigurator's benchmark sends every request
at exactly its stated lengths (its generator's aiperf command, ``generator/sflow.py`` and
``benchmark/bench_run.sh.j2``, ai-dynamo/aiconfigurator, Apache-2.0: input and output stddev 0, ``min_tokens`` =
``max_tokens`` = OSL, ``ignore_eos``), so these rows carry ``FIXED_LENGTHS``; its 20 rounds a concurrency slot are not
stated for these sweeps, so their wave count stays fitted. The other two gap-analysis files
(``qwen3.5-397b-gap-analysis.csv``, ``kimi-k2.5-gap-analysis.csv``) copy InferenceX rows (115 of their 123)."""
MAX_MEASUREMENTS_BYTES = 64 * 1024 * 1024
"""The shipped rows are 2.6 MB as text (0.2 MB gzip); 64 MiB leaves 25x room, compressed or not."""

SYSTEMS = {  # aiconfigurator system -> (cluster type, or None for the quick 8-GPU-node form; GPU)
    "h100_sxm": ("dgx-h100", "h100-sxm"),
    "h200_sxm": ("dgx-h200", "h200-sxm"),
    "b200_sxm": ("dgx-b200", "b200"),
    "b300_sxm": (None, "b300"),  # HGX B300: 8 GPUs per NVLink domain
    "gb200": ("gb200-nvl72", "gb200"),
    "gb300": ("gb300-nvl72", "gb300"),
}
CHECKPOINT_ARCHITECTURE = {
    # Quantized or renamed checkpoints whose decoder is the named config's (same shapes; the row's quant
    # columns say how the weights are stored).
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
}
GROUP_KEYS = ("backend", "system", "mode")


@contextmanager
def serving_data(path: str | Path | None = None) -> Iterator[Path]:
    """The folder with the measurements and model configs, for the ``with`` block: ``path``, else
    $PARAPLAN_SERVING_DATA, else the data shipped with paraplan (``paraplan/data/serving``)."""
    chosen = path if path is not None else os.environ.get(SERVING_DATA_ENV) or None
    if chosen is not None:
        yield serving_data_dir(chosen)
        return
    with resources.as_file(resources.files("paraplan.data") / PACKAGED_FOLDER) as folder:
        yield serving_data_dir(folder)


def serving_data_dir(path: str | Path) -> Path:
    """``path`` as a folder of serving measurements; InputError when it holds none."""
    folder = Path(path)
    measurements_file(folder)
    return folder


def measurements_file(folder: Path) -> Path:
    """The measurements file of ``folder``: the first of ``MEASUREMENTS_FILES`` present."""
    for name in MEASUREMENTS_FILES:
        if (folder / name).is_file():
            return folder / name
    raise InputError(one_line(f"serving measurements: {folder} holds none of {', '.join(MEASUREMENTS_FILES)} "
                              "(the layout of paraplan's data/serving/README.md)"))


def _measurements_text(path: Path) -> str:
    """The text of the measurements file, gunzipped when its name ends in .gz; InputError when it exceeds
    ``MAX_MEASUREMENTS_BYTES`` (compressed or not) or is not gzip or UTF-8."""
    raw = read_user_bytes(path, MAX_MEASUREMENTS_BYTES, "serving measurements")
    if path.suffix == ".gz":
        try:
            with gzip.GzipFile(fileobj=BytesIO(raw)) as unzipped:
                raw = unzipped.read(MAX_MEASUREMENTS_BYTES + 1)  # one byte more tells a file that is too large
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(one_line(f"{path}: not a gzip file of serving measurements ({exc})")) from None
        if len(raw) > MAX_MEASUREMENTS_BYTES:
            raise InputError(f"{path}: more than {MAX_MEASUREMENTS_BYTES:,} bytes uncompressed is too large for "
                             "serving measurements")
    return decode_user_text(raw, str(path))


def load_measurements(folder: Path) -> pd.DataFrame:
    """The measurement rows of ``folder`` with the concurrency read from each row's source note."""
    path = measurements_file(folder)
    try:
        rows = pd.read_csv(StringIO(_measurements_text(path)))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise InputError(one_line(f"{path}: not a CSV of serving measurements ({exc})")) from None
    missing = [c for c in MEASURED_COLUMNS if c not in rows.columns]
    if missing:
        raise InputError(one_line(f"{path}: lacks the columns {', '.join(missing)} (the layout of paraplan's "
                                  "data/serving/README.md)"))
    if "id" in rows and rows["id"].duplicated().any():
        raise InputError(one_line(f"{path}: the row id {rows['id'][rows['id'].duplicated()].iloc[0]!r} is listed "
                                  "more than once (each measurement needs its own id)"))
    numeric = [c for c in MEASURED_COLUMNS if c not in TEXT_COLUMNS]
    try:
        numbers = rows[numeric].apply(pd.to_numeric, errors="coerce")
    except (OverflowError, ValueError, TypeError):  # a number beyond float's range
        numbers = pd.DataFrame(np.nan, index=rows.index, columns=numeric)
    unreadable = [c for c in numeric if (numbers[c].isna() & rows[c].notna()).any()]
    if unreadable:
        raise InputError(one_line(f"{path}: the columns {', '.join(unreadable)} must hold numbers (or be empty)"))
    rows[numeric] = numbers.astype(float)
    stated = rows["silicon_data_source"].astype(str).str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
    agg = rows["batch_size"] * rows["attention_dp_size"].fillna(1.0).clip(lower=1.0)
    disagg = rows["decode_batch_size"] * rows["decode_num_workers"].fillna(1.0) \
        * rows["decode_attention_dp_size"].fillna(1.0).clip(lower=1.0)
    rows["concurrency"] = stated.fillna(agg).fillna(disagg)
    return _with_benchmark_protocol(inferencex_twins(_with_published_deployments(rows, folder)))


def _with_benchmark_protocol(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with what their benchmark's published code states: ``stated_waves`` (requests sent / concurrency;
    NaN where unknown, fitted), ``length_scale`` (mean over stated input and output lengths; 1 where unknown) and
    ``fixed_lengths`` (every request has exactly the stated lengths: aiconfigurator's protocol). InferenceX's
    protocol holds for its API rows, its database's (``INFERENCEX_DB_MARK``) and the rows that repeat one of their
    measurements (``INFERENCEX_TWIN``)."""
    source = rows["silicon_data_source"].astype(str)
    inferencex = source.str.contains(INFERENCEX_MARK, regex=False).to_numpy() \
        | source.str.contains(INFERENCEX_DB_MARK, regex=False).to_numpy() \
        | (_column_or(rows, INFERENCEX_TWIN, "") != "").to_numpy()
    aiconfigurator = source.str.contains(AICONFIGURATOR_MARK, regex=False).to_numpy()
    rows["stated_waves"] = np.where(inferencex, INFERENCEX_WAVES, np.nan)
    rows["length_scale"] = np.where(inferencex, INFERENCEX_LENGTH_SCALE, 1.0)
    rows[FIXED_LENGTHS] = aiconfigurator
    return rows


def _column_or(rows: pd.DataFrame, column: str, default: float | str) -> pd.Series:
    """``rows[column]`` with NaN as ``default``; all ``default`` where rows do not carry the column (rows built
    without ``load_measurements``)."""
    return rows[column].fillna(default) if column in rows else pd.Series(default, index=rows.index)


def _row_waves(rows: pd.DataFrame, waves: float) -> np.ndarray:
    """Per row the wave weight ``ServingLatency`` uses (``benchmark_waves``): of the benchmark's wave count as its
    protocol states it (``stated_waves``), else ``waves``, and whether the protocol fixes every length."""
    stated = _column_or(rows, "stated_waves", np.nan).to_numpy(dtype=float)
    per_row = np.where(np.isfinite(stated), stated, waves)
    fixed = _column_or(rows, FIXED_LENGTHS, False).to_numpy(dtype=bool)
    for backend, traits in ENGINE_TRAITS.items():
        sel = (rows["backend"] == backend).to_numpy()
        per_row[sel] = benchmark_waves(traits, per_row[sel], fixed[sel])
    return per_row


def _mean_lengths(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(mean input length, mean output length) of each row's requests: the stated ones x ``length_scale``."""
    scale = rows["length_scale"].to_numpy(dtype=float) if "length_scale" in rows else 1.0
    return rows["isl"].to_numpy(dtype=float) * scale, rows["osl"].to_numpy(dtype=float) * scale


def _deployments_path(folder: Path) -> Path:
    """``DEPLOYMENTS_FILE`` of ``folder``, else the shipped one."""
    own = folder / DEPLOYMENTS_FILE
    return own if own.is_file() else Path(str(resources.files("paraplan.data") / PACKAGED_FOLDER / DEPLOYMENTS_FILE))


def _with_published_deployments(rows: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """``rows`` with each published deployment (``DEPLOYMENTS_FILE``) in place of the row's own columns (those it
    states: an aggregated row's entry leaves its pools empty), its source in ``deployment_source`` ('' where none is
    published) and its MTP draft tokens in ``SPECULATIVE_TOKENS``."""
    rows[SPECULATIVE_TOKENS], rows["deployment_source"], rows[MEMORY_FRACTION] = 0.0, "", np.nan
    rows[RECV_INTERVAL] = np.nan
    path = _deployments_path(folder)
    if "id" not in rows or not path.is_file():
        return rows
    try:
        published = pd.read_csv(StringIO(decode_user_text(read_user_bytes(path, MAX_MEASUREMENTS_BYTES,
                                                                          "published deployments"), str(path))))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise InputError(one_line(f"{path}: not a CSV of published deployments ({exc})")) from None
    needed = ("id", "deployment_source", *DEPLOYMENT_COLUMNS, SPECULATIVE_TOKENS)
    missing = [c for c in needed if c not in published.columns]
    if missing:
        raise InputError(one_line(f"{path}: lacks the columns {', '.join(missing)}"))
    for optional in (MEMORY_FRACTION, RECV_INTERVAL):
        if optional not in published:
            published[optional] = np.nan
    numeric = [*DEPLOYMENT_COLUMNS, SPECULATIVE_TOKENS, MEMORY_FRACTION, RECV_INTERVAL]
    blank = published[numeric].isna()
    try:
        numbers = published[numeric].apply(pd.to_numeric, errors="coerce")
    except (OverflowError, ValueError, TypeError):  # a number beyond float's range: refused below
        numbers = pd.DataFrame(np.nan, index=published.index, columns=numeric)
    rules = {column: ((numbers[column] >= 1) & (numbers[column] <= MAX_PUBLISHED_GPUS) & (numbers[column] % 1 == 0),
                      f"a whole number from 1 to {MAX_PUBLISHED_GPUS}") for column in DEPLOYMENT_COLUMNS}
    drafts, fraction, interval = numbers[SPECULATIVE_TOKENS], numbers[MEMORY_FRACTION], numbers[RECV_INTERVAL]
    rules[SPECULATIVE_TOKENS] = ((drafts >= 0) & (drafts <= MAX_PUBLISHED_DRAFTS) & (drafts % 1 == 0),
                                 f"a whole number from 0 to {MAX_PUBLISHED_DRAFTS}")
    rules[MEMORY_FRACTION] = ((fraction > 0) & (fraction <= 1), "in (0, 1]")
    rules[RECV_INTERVAL] = ((interval >= 1) & (interval <= MAX_RECV_INTERVAL) & (interval % 1 == 0),
                            f"a whole number from 1 to {MAX_RECV_INTERVAL}")
    for column, (ok, rule) in rules.items():
        if not (ok | blank[column]).all():
            raise InputError(one_line(f"{path}: {column} must be empty or {rule}"))
    if published["id"].duplicated().any():
        raise InputError(one_line(f"{path}: each id must be listed once"))
    position = pd.Series(np.arange(len(rows)), index=rows["id"].astype(str))
    found = published["id"].astype(str).isin(position.index).to_numpy()
    at = position.loc[published["id"].astype(str)[found]].to_numpy()
    for column in (*DEPLOYMENT_COLUMNS, SPECULATIVE_TOKENS, MEMORY_FRACTION, RECV_INTERVAL):
        rows[column] = rows[column].astype(float)
        values = numbers[column].to_numpy(dtype=float)[found]
        stated = np.isfinite(values)  # an empty pool column (an aggregated row's) leaves the row's own
        rows.iloc[at[stated], rows.columns.get_loc(column)] = values[stated]
    sources = published["deployment_source"].astype(str).to_numpy()[found]
    rows.iloc[at, rows.columns.get_loc("deployment_source")] = sources
    return rows


TWIN_KEYS = ("system", "backend", "mode", "isl", "osl", "concurrency")
"""What a row and the InferenceX row it repeats share, besides the measured TPOT and TTFT (``inferencex_twins``);
not the model's name (InferenceX's database calls DeepSeek-R1 by its architecture's, DeepSeek-V3)."""


def measurement_keys(rows: pd.DataFrame) -> pd.DataFrame:
    """What identifies one measured run: ``TWIN_KEYS`` with the measured TPOT to 0.01 ms and TTFT to 0.1 ms (columns
    ``tpot``, ``ttft``; NaN where missing), of rows whose numeric columns hold numbers (as ``load_measurements``
    reads them). Two rows with equal keys are one run."""
    return rows[list(TWIN_KEYS)].assign(tpot=rows["silicon_tpot_ms"].round(2), ttft=rows["silicon_ttft_ms"].round(1))


def inferencex_twins(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``INFERENCEX_TWIN``: the id of the InferenceX API row (``INFERENCEX_MARK``) whose measurement a
    row of another sweep repeats (the same ``measurement_keys``; '' where none),
    and that row's published deployment in place of its own (``DEPLOYMENTS_FILE``: pools, MTP drafts, memory
    fraction), so one measurement is priced as one deployment wherever it appears."""
    rows[INFERENCEX_TWIN] = ""
    if not {*TWIN_KEYS, "id", "silicon_tpot_ms", "silicon_ttft_ms"} <= set(rows.columns) or rows.empty:
        return rows
    inferencex = rows["silicon_data_source"].astype(str).str.contains(INFERENCEX_MARK, regex=False).to_numpy()
    keyed = measurement_keys(rows)
    known = keyed.notna().all(axis=1).to_numpy()  # pandas would pair a missing key with a missing key
    keyed = keyed.assign(position=np.arange(len(rows)))
    keys = [*TWIN_KEYS, "tpot", "ttft"]
    originals = keyed[inferencex & known].drop_duplicates(keys)
    copies = keyed[~inferencex & known].merge(originals, on=keys, suffixes=("", "_original"))
    if copies.empty:
        return rows
    at, source = copies["position"].to_numpy(), copies["position_original"].to_numpy()
    rows.iloc[at, rows.columns.get_loc(INFERENCEX_TWIN)] = rows["id"].astype(str).to_numpy()[source]
    published = rows["deployment_source"].to_numpy()[source] != ""
    for column in (*DEPLOYMENT_COLUMNS, SPECULATIVE_TOKENS, MEMORY_FRACTION, RECV_INTERVAL, "deployment_source"):
        rows.iloc[at[published], rows.columns.get_loc(column)] = rows[column].to_numpy()[source[published]]
    return rows


def _config_path(folder: Path, repo_id: str) -> Path:
    repo_id = CHECKPOINT_ARCHITECTURE.get(repo_id, repo_id)
    return folder / "model_configs" / f"{repo_id.replace('/', '--')}_config.json"


def _cluster(system: str) -> ClusterSpec:
    if system not in SYSTEMS:
        raise InputError(f"unknown system {system!r}")
    cluster_name, gpu = SYSTEMS[system]
    return load_cluster(cluster_name, num_gpus=72 * 4) if cluster_name else quick_cluster(gpu, 8 * 36)


def _kv_dtype(backend: str, gemm_mode: str) -> str:
    """TensorRT-LLM serves quantized checkpoints with the fp8 KV cache their ModelOpt config states; vLLM and
    SGLang default to the model's 16-bit KV cache (kv_cache_dtype auto)."""
    return "fp8" if backend == "trtllm" and gemm_mode != "bf16" else "bf16"


def _axis(rows: pd.DataFrame, column: str) -> np.ndarray:
    """A parallel degree column: missing or 0 (unset) means 1."""
    values = rows[column].to_numpy(dtype=float)
    return np.where(np.isfinite(values) & (values > 0), values, 1.0)


def _sharding(rows: pd.DataFrame, prefix: str, model: ModelSpec) -> Sharding:
    tp, dp = _axis(rows, f"{prefix}tp_size"), _axis(rows, f"{prefix}attention_dp_size")
    moe_ep = _axis(rows, f"{prefix}moe_ep_size") if model.is_moe else np.ones_like(tp)
    moe_tp = _axis(rows, f"{prefix}moe_tp_size") if model.is_moe else tp * dp
    stated = rows[f"{prefix}moe_tp_size"].to_numpy(dtype=float)
    moe_tp = np.where(np.isfinite(stated) & (stated > 0), moe_tp, tp * dp / moe_ep)
    if model.is_moe:
        dp = _implied_attention_dp(tp, rows[f"{prefix}attention_dp_size"].to_numpy(dtype=float), moe_tp * moe_ep)
    if prefix == "":  # the disaggregated rows' pools as stated: read so, their TTFT is the closer (DeepSeek on NVL72)
        tp, dp, moe_tp, moe_ep = _launchable(tp, dp, moe_tp, moe_ep, model)
    return Sharding.of(tp, dp, moe_tp, moe_ep, _axis(rows, f"{prefix}pp_size"))


def _implied_attention_dp(tp: np.ndarray, stated_dp: np.ndarray, moe_gpus: np.ndarray) -> np.ndarray:
    """Attention DP of a row whose MoE layers span more GPUs (moe_tp x moe_ep) than its attention TP and that states no
    attention DP: the MoE group is every GPU of the worker, so attention runs data parallel over the rest, dp =
    moe_tp·moe_ep/tp. vLLM launches exactly this: ``--data-parallel-size 2`` at tp 1 without expert parallelism
    shards each MoE layer over dp·tp ranks (FusedMoEParallelConfig), which the rows record as moe_tp 2 (Qwen3-235B
    on two H200s: tp 1, moe_tp 2, attention DP unstated). Stated values, and groups that do not divide, stay."""
    unstated = ~(np.isfinite(stated_dp) & (stated_dp > 0))
    implied = unstated & (moe_gpus > tp) & (np.mod(moe_gpus, tp) == 0)
    return np.where(implied, moe_gpus / tp, np.where(unstated, 1.0, stated_dp))


def _launchable(tp: np.ndarray, dp: np.ndarray, moe_tp: np.ndarray, moe_ep: np.ndarray,
                model: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tp, dp, moe_tp, moe_ep) an engine can launch for rows whose ``tp_size`` is not an attention TP degree. No
    engine launches attention TP that does not divide the query heads (vLLM, SGLang and TensorRT-LLM all require
    num_heads % tp == 0), yet some aggregated rows state one with attention DP 1:
    - tp = attention TP x expert parallel (Qwen3.5-397B's 32 heads at tp 64, ep 8 on one 8-GPU H200): tp/ep
      divides the heads, so attention TP is tp/ep and the experts are split ep ways (moe_tp 1) on the same GPUs;
    - otherwise tp is the GPU count of a multi-node NVL72 deployment (DeepSeek-R1's 128 heads at tp 12-72, ep 1):
      the wide expert-parallel layout the engines publish for it, attention DP on every GPU and the routed
      experts over all of them."""
    odd = (tp > 1.0) & (dp <= 1.0) & (np.mod(model.num_heads, tp) != 0)
    if not odd.any():
        return tp, dp, moe_tp, moe_ep
    product = odd & (moe_ep > 1.0) & (np.mod(tp, moe_ep) == 0) & (np.mod(model.num_heads, tp / moe_ep) == 0)
    wide = odd & ~product
    gpus = tp
    tp = np.where(product, tp / moe_ep, np.where(wide, 1.0, tp))
    dp = np.where(wide, gpus, dp)
    if model.is_moe:
        moe_tp, moe_ep = np.where(odd, 1.0, moe_tp), np.where(wide, gpus, moe_ep)
    else:
        moe_tp = tp * dp
    return tp, dp, moe_tp, moe_ep


@lru_cache(maxsize=512)
def _deployment_kernels(store: Path, hardware: str, engine: str, version: str, model: ModelSpec, gemm_mode: str,
                        moe_mode: str) -> ServingKernels | None:
    """The store's tables for one group's deployments (cached: ``validate`` prices every group once per step
    overhead); the quantization of each term as ``weight_precision`` resolves it."""
    kv_dtype = _kv_dtype(engine, gemm_mode)
    prec = weight_precision(model, gemm_mode, moe_mode, kv_dtype)
    dense, attention, experts = table_modes(model, gemm_mode, moe_mode, prec.attention_bytes == 2.0)
    return serving_kernels(store, hardware, engine=engine, version=version, model=model, dense_mode=dense,
                           attention_mode=attention, moe_mode=experts, kv_dtype=kv_dtype)


def _with_kernels(cluster: ClusterSpec, store: Path | None, rows: pd.DataFrame, model: ModelSpec, gemm_mode: str,
                  moe_mode: str) -> ClusterSpec:
    """``cluster`` carrying the store's tables for the group's engine, version and GPU (unchanged without a store or
    tables)."""
    if store is None:
        return cluster
    stated = rows["backend_version"].iloc[0] if "backend_version" in rows else None
    version = str(stated) if isinstance(stated, str) else ""  # unstated: the newest stored
    kernels = _deployment_kernels(store, cluster.gpu.name, str(rows["backend"].iloc[0]), version, model, gemm_mode,
                                  moe_mode)
    return cluster if kernels is None else replace(cluster, serving_kernels=kernels)


def checkpoint_moe_mode(model: ModelSpec, moe_mode: str) -> str:
    """The routed experts' quantization as the checkpoint stores them: aiconfigurator's rows label gpt-oss-120b's
    experts ``nvfp4`` (precision fp4), but its checkpoint is MXFP4 (config.json quantization_config.quant_method
    mxfp4: 4-bit values with an e8m0 scale per 32, 4.25 bits) and every engine runs it with MXFP4 kernels (weight-only
    on Hopper, which has no fp4 tensor cores); an NVFP4 label on an MXFP4 checkpoint is read as mxfp4."""
    mxfp4 = model.weights is not None and model.weights.weight_format == "mxfp4"
    return "mxfp4" if mxfp4 and moe_mode == "nvfp4" else moe_mode


STEP_OVERHEAD_COLUMN = "step_overhead_grid_s"
"""A column ``_grid_runs`` adds: each row priced at its own engine step overhead (the whole grid in one call)."""


def _predict_group(rows: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec,
                   engine: EngineTraits, gemm_mode: str, moe_mode: str) -> np.ndarray:
    if STEP_OVERHEAD_COLUMN in rows:  # one overhead a deployment: numpy broadcasts it like a scalar
        engine = replace(engine, step_overhead_s=rows[STEP_OVERHEAD_COLUMN].to_numpy(dtype=float))
    prec = weight_precision(model, gemm_mode, moe_mode, _kv_dtype(engine.name, gemm_mode))
    isl, osl = _mean_lengths(rows)
    concurrency = rows["concurrency"].to_numpy(dtype=float)
    if rows["mode"].iloc[0] == "agg":
        shard = _sharding(rows, "", model)
        out = aggregated(model, cluster, engine, prec, shard, concurrency=concurrency, isl=isl, osl=osl,
                         max_batched_tokens=rank_batched_tokens(engine, shard))
    else:
        prefill, decode = _sharding(rows, "prefill_", model), _sharding(rows, "decode_", model)
        prefill_workers, decode_workers = _workers(rows, model, cluster, engine, prec, prefill, decode,
                                                   concurrency, isl, osl)
        out = disaggregated(model, cluster, engine, prec, prefill, decode, concurrency=concurrency,
                            prefill_workers=prefill_workers, decode_workers=decode_workers, isl=isl, osl=osl)
    return np.stack([out.tpot_steady_s, out.tpot_burst_s, out.ttft_steady_s, out.ttft_burst_s])


def _group_shares(rows: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec, gemm_mode: str,
                  moe_mode: str) -> np.ndarray:
    """(decode share, prefill share) per row: of one decode step at the row's batch and mean context, and of one
    prompt's prefill, the share of seconds ``cluster.serving_kernels`` priced."""
    prec = weight_precision(model, gemm_mode, moe_mode, _kv_dtype(str(rows["backend"].iloc[0]), gemm_mode))
    agg = rows["mode"].iloc[0] == "agg"
    decode, prefill = (_sharding(rows, "", model),) * 2 if agg else \
        (_sharding(rows, "decode_", model), _sharding(rows, "prefill_", model))
    isl, osl = _mean_lengths(rows)
    batch = _stated(rows, "batch_size" if agg else "decode_batch_size", rows["concurrency"].to_numpy(dtype=float))
    context = isl + osl / 2.0
    step = step_time(model, cluster, prec, decode, tokens_per_rank=batch, sequences_per_rank=batch,
                     attended_keys=(batch * context, batch * np.minimum(context, model.sliding_window or np.inf)),
                     attention_flops=(0.0, 0.0), decode=True)
    full, sliding = prefill_attention_flops(model, isl)
    first = step_time(model, cluster, prec, prefill, tokens_per_rank=isl, sequences_per_rank=1.0 + 0.0 * isl,
                      attended_keys=(0.0, 0.0), attention_flops=(full, sliding), decode=False)
    return np.stack([step.table_s / step.total_s, first.table_s / first.total_s])


def table_shares(rows: pd.DataFrame, folder: Path, store: Path) -> pd.DataFrame:
    """Per row: ``decode_table_frac`` and ``prefill_table_frac`` (``_group_shares``), ``moe`` (the model routes
    experts) and ``tables`` (the provenance of the tables that priced it; '' where none or not covered)."""
    out = pd.DataFrame({"decode_table_frac": np.nan, "prefill_table_frac": np.nan, "moe": False, "tables": ""},
                       index=rows.index)
    for (repo, system, _, gemm_mode, moe_mode, *_), index in rows.groupby(_group_keys(rows, store)).groups.items():
        path = _config_path(folder, repo)
        try:
            model = load_model(str(path))
            moe_mode = checkpoint_moe_mode(model, moe_mode)
            cluster = _with_kernels(_cluster(system), store, rows.loc[index], model, gemm_mode, moe_mode)
            shares = _group_shares(rows.loc[index], model, cluster, gemm_mode, moe_mode)
        except (InputError, OSError):
            continue
        out.loc[index, ["decode_table_frac", "prefill_table_frac"]] = shares.T
        out.loc[index, "moe"] = model.is_moe
        out.loc[index, "tables"] = cluster.serving_kernels.label if cluster.serving_kernels is not None else ""
    return out


UNSTATED_PREFILL_UTILISATION = 0.5
"""Rows without worker counts (most disaggregated rows state none) are priced as a deployment sized not to
queue: as many decode workers as the concurrency needs at the engine's batch limits, and as many prefill
workers as keep the prefill pool at most half busy."""


def _workers(rows: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec, engine: EngineTraits,
             prec: WeightPrecision, prefill: Sharding, decode: Sharding, concurrency: np.ndarray, isl: np.ndarray,
             osl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prefill workers, decode workers): as stated, else sized not to queue (UNSTATED_PREFILL_UTILISATION)."""
    fits, _ = running_capacity(model, cluster, engine, prec, decode, held_tokens(engine, isl, osl))
    per_worker = decode.dp * np.maximum(np.minimum(fits, engine.max_running), 1.0)
    decode_workers = _stated(rows, "decode_num_workers", np.ceil(concurrency / per_worker))
    batch = np.maximum(concurrency / (decode_workers * decode.dp), 1.0)
    lifetime = osl * decode_step_s(model, cluster, prec, decode, batch, isl + osl / 2.0)
    busy = concurrency / lifetime * prefill_s(model, cluster, prec, prefill, isl) / prefill.dp
    return _stated(rows, "prefill_num_workers", np.ceil(busy / UNSTATED_PREFILL_UTILISATION)), decode_workers


def _stated(rows: pd.DataFrame, column: str, otherwise: np.ndarray) -> np.ndarray:
    values = rows[column].to_numpy(dtype=float)
    return np.where(np.isfinite(values) & (values > 0), values, np.maximum(otherwise, 1.0))


PREDICTED = ("tpot_steady_s", "tpot_burst_s", "ttft_steady_s", "ttft_burst_s")


def _group_keys(rows: pd.DataFrame, store: Path | None) -> list[pd.Series]:
    """(model, system, engine, gemm mode, MoE mode, mode, MTP draft tokens, memory fraction (0: the engine's
    default), scheduler receive interval (1: SGLang's default)[, engine version]): one cost-model call each; the
    engine version splits groups only where a store's tables are priced per version."""
    gemm = rows["gemm_quant_mode"].fillna("bf16")
    keys = [rows["model_path"], rows["system"], rows["backend"], gemm, rows["moe_quant_mode"].fillna(gemm),
            rows["mode"], _column_or(rows, SPECULATIVE_TOKENS, 0.0), _column_or(rows, MEMORY_FRACTION, 0.0),
            _column_or(rows, RECV_INTERVAL, 1.0)]
    if store is not None and "backend_version" in rows:
        keys.append(rows["backend_version"].fillna("").astype(str))
    return keys


MTP_ACCEPTANCE = 0.65
"""Probability that each MTP draft token is accepted, given the ones before it were, in the InferenceX sweeps that ran
MTP (DeepSeek-R1 on TensorRT-LLM, 1-3 draft tokens, random prompts): a property of the benchmark's prompts and the
model's outputs, which no row states. Fitted: ``python bench/mtp_acceptance.py`` prices the 240 disaggregated rows
with MTP at 0.50 to 0.85 and takes the lowest median |log error| of TPOT (8.6%); fitted on the rows with 3 draft
tokens alone it is also 0.65, and the rows with 1 (a different function of it) come out at 9.2% median |error|, -1.7%
signed (tests/test_inferencex_deployments.py). DeepSeek-V3's report measured 85-90% for its second token on natural
text (arXiv:2412.19437, section 5.4.3)."""


def _group_engine(engine: EngineTraits, model: ModelSpec, drafted: float, fraction: float,
                  acceptance: float, recv_interval: float = 1.0) -> EngineTraits:
    """``engine`` as a group's deployment ran it: drafting ``drafted`` MTP tokens a step at ``acceptance`` (none at
    0), at memory fraction ``fraction`` (the engine's default at 0) and taking new requests every ``recv_interval``
    decode steps (``EngineTraits.scheduler_recv_interval``)."""
    if drafted > 0:
        spec = Speculation(method="mtp", num_tokens=int(drafted), acceptance_frac=acceptance)
        check_speculation(model, spec)
        engine = replace(engine, speculation=spec)
    if recv_interval > 1:
        engine = replace(engine, scheduler_recv_interval=int(recv_interval))
    return replace(engine, memory_frac=float(fraction)) if fraction > 0 else engine


def predict_rows(rows: pd.DataFrame, folder: Path, engines: dict[str, EngineTraits] | None = None,
                 store: Path | None = None, mtp_acceptance: float = MTP_ACCEPTANCE) -> pd.DataFrame:
    """Per row: predicted TPOT and the two TTFT parts (steady, first-wave burst; without the per-request
    overhead), NaN with a ``reason`` where not covered. Grouped so each call prices one model, GPU, engine
    and quantization, vectorized over the group's deployments. ``store``: a profile store whose aiconfigurator
    tables price the terms they cover (``cost_models.serving_kernel_source``). Rows whose published deployment ran MTP
    (``SPECULATIVE_TOKENS``) draft at ``mtp_acceptance``; rows whose launch script set the engine's memory fraction
    (``MEMORY_FRACTION``) are priced at it."""
    engines = engines or ENGINE_TRAITS
    out = rows.copy()
    for column in PREDICTED:
        out[column] = np.nan
    out["reason"] = ""
    models: dict[str, ModelSpec | str] = {}
    groups = rows.groupby(_group_keys(rows, store)).groups
    for (repo, system, backend, gemm_mode, moe_mode, _, drafted, fraction, interval, *_), index in groups.items():
        if repo not in models:
            path = _config_path(folder, repo)
            try:
                models[repo] = load_model(str(path)) if path.is_file() else f"no config.json for {repo}"
            except InputError as exc:
                models[repo] = str(exc)
        loaded = models[repo]
        try:
            if isinstance(loaded, str):
                raise InputError(loaded)
            moe_mode = checkpoint_moe_mode(loaded, moe_mode)
            cluster = _with_kernels(_cluster(system), store, rows.loc[index], loaded, gemm_mode, moe_mode)
            engine = _group_engine(engines[backend], loaded, drafted, fraction, mtp_acceptance, interval)
            values = _predict_group(rows.loc[index], loaded, cluster, engine, gemm_mode, moe_mode)
            out.loc[index, list(PREDICTED)] = values.T
        except InputError as exc:
            out.loc[index, "reason"] = str(exc)[:200]
    measured_ok = (rows["silicon_ttft_ms"] > 0) & (rows["silicon_tpot_ms"] > 0)
    out.loc[~measured_ok & (out["reason"] == ""), "reason"] = "no measured TTFT/TPOT"
    out.loc[~(rows["concurrency"] > 0) & (out["reason"] == ""), "reason"] = "concurrency not stated"
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedConstants:
    """The serving model's fitted constants (seconds) and the rows they were fitted on."""

    step_overhead_s: dict[str, float]
    """Per engine: CPU time per step not hidden behind the GPU."""
    request_overhead_s: dict[str, float]
    """Per engine: per-request latency outside the GPU steps."""
    first_token_steps: dict[str, float]
    """Per engine: steady-state TPOTs (disaggregated: the decode pool's) a request waits before its first token beyond
    its prefill (``EngineTraits.first_token_steps``)."""
    dp_sync_s: float
    """Every engine: host seconds more per step where attention-DP ranks step together (``EngineTraits.dp_sync_s``)."""
    waves: float
    """Request waves of the benchmark protocol (the first arrives at once)."""
    fitted_rows: int
    """Covered rows the fit saw."""


STEP_OVERHEAD_GRID_S = (*(round(k * 0.25e-3, 6) for k in range(21)), 6e-3, 8e-3, 12e-3)
"""0 to 5 ms in 0.25-ms steps, then 6, 8 and 12 ms. Every fit and fold so far lands between 0.5 and 4.5 ms; the
0.25-ms step keeps a flip between neighbours small (a 0.5-ms step let TRT-LLM's fit jump 1.0 <-> 1.5 ms)."""
DP_SYNC_GRID_S = tuple(k * 1e-3 for k in range(6))
"""0 to 5 ms a step in 1-ms steps: the attention-DP ranks' per-step agreement (``EngineTraits.dp_sync_s``). Every fit
and fold so far lands on 3 or 4 ms; each value prices the 418 attention-DP rows once more per step overhead."""
REQUEST_OVERHEAD_GRID_S = tuple(x * 1e-3 for x in (0, 5, 10, 15, 20, 30, 40, 60, 80, 120, 160, 200, 250, 300))
FIRST_TOKEN_STEPS_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0, 20.0)
"""Steady-state TPOTs a request waits before its first token (``EngineTraits.first_token_steps``), fitted jointly
with the request overhead. The measured TTFT beyond the GPU-side prediction, divided by the measured TPOT,
is a near-constant per engine across 4 to 128 concurrent requests (vLLM's median 5.3-7.0 TPOTs at 1,024-token
prompts while in milliseconds it grows 42 -> 143): a per-iteration cost, not a per-request constant."""
FIRST_TOKEN_STEPS_FITTED = frozenset({"vllm", "trtllm"})
"""Engines whose first-token steps are fitted; SGLang's stay 0. Its per-iteration wait is the scheduler's receive
interval, priced already ((N − 1)/2 decode steps, ``aggregated``); a free steps term on top trades against its request
overhead along a flat valley: in sample it fits 300 ms + 0 steps, but folds leaving out Qwen3-32B, Llama-3.1-8B,
GLM-5 or DeepSeek-R1 pick 200-250 ms + 5-8 steps, and the fixed-length sweeps' TTFT with each model left out goes
from 27.0% to 32.0% (measured with the grid open to SGLang)."""
NO_FIRST_TOKEN_STEPS = dict.fromkeys(ENGINE_TRAITS, 0.0)
"""The grid prices every row without first-token steps; the fit adds them in closed form (``fit_constants``)."""
WAVES_GRID = (1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 40.0, np.inf)


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadGrid:
    """Predictions of every row at each step overhead of ``STEP_OVERHEAD_GRID_S`` (arrays [grid, rows]); the
    waves and request overheads enter in closed form."""

    rows: pd.DataFrame
    """The measurements with ``reason`` (covered rows have '')."""
    tpot_steady_s: np.ndarray
    tpot_burst_s: np.ndarray
    ttft_steady_s: np.ndarray
    ttft_burst_s: np.ndarray
    synced_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    """Positions of the rows a DP sync changes (a pool with attention DP)."""
    synced: dict[str, np.ndarray] = field(default_factory=dict)
    """Those rows predicted at every (``DP_SYNC_GRID_S``, ``STEP_OVERHEAD_GRID_S``) pair, per ``PREDICTED`` column
    [sync, overhead, synced rows]; the arrays above hold every row at no sync (the grid's first value, 0)."""

    @property
    def syncs(self) -> int:
        """DP sync values the grid holds (1: none beyond 0)."""
        return len(DP_SYNC_GRID_S) if self.synced else 1

    def column(self, name: str, sync: int) -> np.ndarray:
        """``PREDICTED`` column ``name`` [overhead, rows] with the attention-DP rows at ``DP_SYNC_GRID_S[sync]``."""
        base = getattr(self, name)
        if sync == 0 or not self.synced:
            return base
        out = base.copy()
        out[:, self.synced_rows] = self.synced[name][sync]
        return out


def _grid_runs(rows: pd.DataFrame, folder: Path, store: Path | None, dp_sync_s: float) -> dict[str, np.ndarray]:
    """``PREDICTED`` columns of ``rows`` at every step overhead of the grid [overhead, rows], at ``dp_sync_s``: the
    rows repeated once per overhead (``STEP_OVERHEAD_COLUMN``), so each group is priced in one vectorized call."""
    tiled = pd.concat([rows.assign(**{STEP_OVERHEAD_COLUMN: o}) for o in STEP_OVERHEAD_GRID_S], ignore_index=True)
    run = predict_rows(tiled, folder, with_overheads({}, dp_sync_s=dp_sync_s, first_token_steps=NO_FIRST_TOKEN_STEPS),
                       store)
    return {c: run[c].to_numpy(dtype=float).reshape(len(STEP_OVERHEAD_GRID_S), len(rows)) for c in PREDICTED}


def overhead_grid(rows: pd.DataFrame, folder: Path, store: Path | None = None) -> OverheadGrid:
    """Every row predicted once per step-overhead value (``store``: priced with its kernel tables), and the rows with
    attention DP (those a DP sync changes) once more per (DP sync, step overhead) pair."""
    stack = _grid_runs(rows, folder, store, 0.0)
    # The same rows at the grid's first step overhead (0) with the largest sync: the rows it moves run attention DP.
    probe = predict_rows(rows, folder, with_overheads(dict.fromkeys(ENGINE_TRAITS, STEP_OVERHEAD_GRID_S[0]),
                                                      dp_sync_s=DP_SYNC_GRID_S[-1],
                                                      first_token_steps=NO_FIRST_TOKEN_STEPS), store)
    moved = np.zeros(len(rows), dtype=bool)
    for c in PREDICTED:
        a, b = stack[c][0], probe[c].to_numpy(dtype=float)
        moved |= np.isfinite(a) & (a != b)
    synced_rows = np.flatnonzero(moved)
    synced: dict[str, np.ndarray] = {}
    if synced_rows.size:  # no sync: the rows as the grid above priced them
        subset = rows.iloc[synced_rows]
        runs = [{c: stack[c][:, synced_rows] for c in PREDICTED}]
        runs += [_grid_runs(subset, folder, store, d) for d in DP_SYNC_GRID_S[1:]]
        synced = {c: np.stack([run[c] for run in runs]) for c in PREDICTED}
    return OverheadGrid(rows=probe.drop(columns=list(PREDICTED)), synced_rows=synced_rows, synced=synced, **stack)


def _log_err(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """|log(predicted / measured)| per row."""
    return np.abs(np.log(predicted / measured))


def step_overhead_index(tpot_s: np.ndarray, measured_s: np.ndarray) -> int:
    """The row of ``tpot_s`` ([STEP_OVERHEAD_GRID_S, rows]) whose mean |log error| against ``measured_s`` is lowest.

    The mean, not the median: a predicted TPOT is a + b x overhead for every row, so the mean's slope in the overhead
    is the sum over rows of ±b/TPOT (too fast pulls up, too slow down) and it is flat where the rows' pulls balance,
    each row's pull bounded however far off the row is, and largest where the overhead is a large share of the step.
    The median of |log error| moves in jumps as rows cross it and sits on a plateau for TRT-LLM (0.75-2.0 ms within
    0.006 of 0.226), where a near tie (0.2282 against 0.2289) decided 1.0 against 1.5 ms. Refitted on 100 bootstrap
    resamples of each engine's rows (this grid, benchmark waves 3; ``bench/serving_fit_stability.py``), the
    median's fit scatters by a standard deviation of 0.29 / 0.50 / 0.24 ms (vLLM / SGLang / TRT-LLM; TRT-LLM's
    5-95% range 1.0-1.75 ms), the mean's by 0.12 / 0.16 / 0.12 ms (1.0-1.25 ms)."""
    return int(np.argmin(np.mean(_log_err(tpot_s, measured_s), axis=1)))


def _engine_steps(tpot: np.ndarray, tpot_s: np.ndarray, engines: dict[str, np.ndarray]) -> dict[str, int]:
    """Per engine with rows: the index of its step overhead (``step_overhead_index``) on ``tpot`` [overhead, rows]."""
    return {engine: step_overhead_index(tpot[:, sel], tpot_s[sel]) for engine, sel in engines.items() if sel.any()}


def _sync_index(grid: OverheadGrid, waves: float, tpot_s: np.ndarray, engines: dict[str, np.ndarray]) -> int:
    """The DP sync of ``DP_SYNC_GRID_S`` whose TPOTs, each engine at its own best step overhead, have the lowest mean
    |log error| over every engine's rows (the DP sync is a per-step cost, fitted as the step overhead is)."""
    scores = []
    per_row = _row_waves(grid.rows, waves)
    for sync in range(grid.syncs):
        tpot = wave_mean(grid.column("tpot_steady_s", sync), grid.column("tpot_burst_s", sync), per_row)
        steps = _engine_steps(tpot, tpot_s, engines)
        errs = [_log_err(tpot[g, engines[e]], tpot_s[engines[e]]) for e, g in steps.items()]
        scores.append(np.mean(np.concatenate(errs)) if errs else np.inf)
    return int(np.argmin(scores))


def deployment_stated(rows: pd.DataFrame) -> np.ndarray:
    """Per row: whether its deployment is known: every aggregated row, and a disaggregated one whose prefill and
    decode worker counts the row states or InferenceX published (``DEPLOYMENTS_FILE``). A disaggregated row without
    them is priced at a guessed split (``UNSTATED_PREFILL_UTILISATION``), and its sweep may have run MTP unrecorded."""
    disagg = (rows["mode"] == "disagg").to_numpy()
    counts = rows["prefill_num_workers"].notna().to_numpy() & rows["decode_num_workers"].notna().to_numpy()
    return ~disagg | counts


def speculating(rows: pd.DataFrame) -> np.ndarray:
    """Per row: whether its deployment drafted MTP tokens (priced at the fitted ``MTP_ACCEPTANCE``)."""
    return _column_or(rows, SPECULATIVE_TOKENS, 0.0).to_numpy(dtype=float) > 0


def fit_constants(grid: OverheadGrid, mask: np.ndarray) -> FittedConstants:
    """Constants fitted on the covered rows in ``mask`` that state their deployment (``deployment_stated``: a
    fitted engine constant must not absorb what a guessed worker split or an unrecorded setting gets wrong) and
    that ran no MTP (whose acceptance is fitted on its own); the others are still predicted and reported: for each
    benchmark wave count, the DP sync (``_sync_index``) and per engine the step overhead with the lowest mean |log
    error| of TPOT (``step_overhead_index``), then the request overhead with the lowest median |log error| of TTFT;
    the wave count whose TPOT and TTFT median |log error| sum lowest wins."""
    rows = grid.rows
    mask = mask & (rows["reason"] == "").to_numpy() & deployment_stated(rows) & ~speculating(rows)
    tpot_s, ttft_s = rows["silicon_tpot_ms"].to_numpy() / 1e3, rows["silicon_ttft_ms"].to_numpy() / 1e3
    engines = {e: mask & (rows["backend"] == e).to_numpy() for e in ENGINE_TRAITS}
    best_score, best = np.inf, None
    for waves in WAVES_GRID:
        sync = _sync_index(grid, waves, tpot_s, engines)
        per_row = _row_waves(rows, waves)
        tpot = wave_mean(grid.column("tpot_steady_s", sync), grid.column("tpot_burst_s", sync), per_row)
        ttft = wave_mean(grid.column("ttft_steady_s", sync), grid.column("ttft_burst_s", sync), per_row)
        hop = grid.column("tpot_steady_s", sync)  # one first-token step of each row (disaggregated: the decode pool's)
        step, request = dict.fromkeys(ENGINE_TRAITS, 0.0), dict.fromkeys(ENGINE_TRAITS, 0.0)
        hops = dict.fromkeys(ENGINE_TRAITS, 0.0)
        tpot_errs, ttft_errs = [], []
        for engine, g in _engine_steps(tpot, tpot_s, engines).items():
            sel = engines[engine]
            steps_grid = FIRST_TOKEN_STEPS_GRID if engine in FIRST_TOKEN_STEPS_FITTED else (0.0,)
            errs = np.array([[np.median(_log_err(ttft[g, sel] + r + k * hop[g, sel], ttft_s[sel]))
                              for r in REQUEST_OVERHEAD_GRID_S] for k in steps_grid])
            k_at, r_at = np.unravel_index(int(np.argmin(errs)), errs.shape)  # the first minimum: fewest steps
            step[engine], request[engine] = STEP_OVERHEAD_GRID_S[g], REQUEST_OVERHEAD_GRID_S[r_at]
            hops[engine] = steps_grid[int(k_at)]
            tpot_errs.append(_log_err(tpot[g, sel], tpot_s[sel]))
            ttft_errs.append(_log_err(ttft[g, sel] + request[engine] + hops[engine] * hop[g, sel], ttft_s[sel]))
        score = np.median(np.concatenate(tpot_errs)) + np.median(np.concatenate(ttft_errs)) if tpot_errs else np.inf
        if score < best_score:
            best_score, best = score, (waves, step, request, hops, DP_SYNC_GRID_S[sync])
    unfitted = dict.fromkeys(ENGINE_TRAITS, 0.0)  # no covered row in the mask: nothing to fit
    waves, step, request, hops, dp_sync = best if best else (1.0, unfitted, dict(unfitted), dict(unfitted), 0.0)
    return FittedConstants(step_overhead_s=step, request_overhead_s=request, first_token_steps=hops, dp_sync_s=dp_sync,
                           waves=waves, fitted_rows=int(mask.sum()))


def apply_constants(grid: OverheadGrid, constants: FittedConstants) -> pd.DataFrame:
    """The rows with ``tpot_pred_s`` and ``ttft_pred_s`` under ``constants``."""
    rows = grid.rows.copy()
    sync = DP_SYNC_GRID_S.index(constants.dp_sync_s) if grid.synced else 0
    index = np.array([STEP_OVERHEAD_GRID_S.index(constants.step_overhead_s[b]) for b in rows["backend"]])
    at = np.arange(len(rows))
    request = rows["backend"].map(constants.request_overhead_s).to_numpy(dtype=float)
    hops = rows["backend"].map(constants.first_token_steps).to_numpy(dtype=float)
    col = {c: grid.column(c, sync)[index, at] for c in PREDICTED}
    per_row = _row_waves(rows, constants.waves)
    rows["tpot_pred_s"] = wave_mean(col["tpot_steady_s"], col["tpot_burst_s"], per_row)
    rows["ttft_pred_s"] = (request + hops * col["tpot_steady_s"]
                           + wave_mean(col["ttft_steady_s"], col["ttft_burst_s"], per_row))
    return rows


def held_out(grid: OverheadGrid, column: str) -> pd.DataFrame:
    """Each value of ``column`` (model_path or system) predicted with constants fitted on the other rows; NaN
    where no other covered row is left to fit on (a folder of one model or one GPU)."""
    parts = []
    for value in grid.rows[column].unique():
        mine = (grid.rows[column] == value).to_numpy()
        constants = fit_constants(grid, ~mine)
        predicted = apply_constants(grid, constants)
        if constants.fitted_rows == 0:
            predicted[["tpot_pred_s", "ttft_pred_s"]] = np.nan
        parts.append(predicted[mine])
    return pd.concat(parts).loc[grid.rows.index]


def relative_errors(predicted: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """|predicted / measured − 1| of TTFT and TPOT per row (NaN where not covered)."""
    ttft = np.abs(predicted["ttft_pred_s"] * 1e3 / predicted["silicon_ttft_ms"] - 1.0)
    tpot = np.abs(predicted["tpot_pred_s"] * 1e3 / predicted["silicon_tpot_ms"] - 1.0)
    covered = predicted["reason"] == ""
    return np.where(covered, ttft, np.nan).astype(float), np.where(covered, tpot, np.nan).astype(float)


def _stats(errors: np.ndarray) -> tuple[float, float]:
    errors = errors[np.isfinite(errors)]
    return (float(np.median(errors)), float(np.percentile(errors, 90))) if len(errors) else (np.nan, np.nan)


def summarise(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per engine × GPU × mode (and all rows): rows, coverage, median and p90 |error| of TPOT and TTFT."""
    ttft, tpot = relative_errors(predicted)
    frame = predicted[list(GROUP_KEYS)].assign(ttft_err=ttft, tpot_err=tpot, covered=predicted["reason"] == "")
    groups = [(key, part) for key, part in frame.groupby(list(GROUP_KEYS))] + [(("all", "all", "all"), frame)]
    records = []
    for key, part in groups:
        tpot_median, tpot_p90 = _stats(part["tpot_err"].to_numpy())
        ttft_median, ttft_p90 = _stats(part["ttft_err"].to_numpy())
        records.append({**dict(zip(GROUP_KEYS, key)), "rows": len(part), "covered_frac": float(part["covered"].mean()),
                        "tpot_median_err": tpot_median, "tpot_p90_err": tpot_p90,
                        "ttft_median_err": ttft_median, "ttft_p90_err": ttft_p90})
    return pd.DataFrame.from_records(records)


def moe_rows(rows: pd.DataFrame, folder: Path) -> np.ndarray:
    """Per row: whether its model (its config.json in ``folder``) is a mixture of experts."""
    flags = {}
    for repo in rows["model_path"].unique():
        path = _config_path(folder, repo)
        flags[repo] = bool(path.is_file() and load_model(str(path)).is_moe)
    return rows["model_path"].map(flags).to_numpy(dtype=bool)


def first_of_each_measurement(rows: pd.DataFrame) -> np.ndarray:
    """Per row: whether it is the first of the rows carrying one measurement (``measurement_keys``): the sweeps repeat
    runs (InferenceX's two files, its database, copies in gap analyses), and a median over every row counts a
    repeated run each time it appears."""
    return ~measurement_keys(rows).duplicated().to_numpy()


def slice_masks(rows: pd.DataFrame, moe: np.ndarray) -> dict[str, np.ndarray]:
    """The slices issue 32 states targets for: each engine, aggregated rows, disaggregated rows with and without
    their worker counts (and of those with, the ones InferenceX published, and the ones that ran MTP), the
    aggregated SGLang rows of aiconfigurator's fixed-length sweeps (every wave a burst: ``benchmark_waves``), dense
    and MoE models, and every row with each measurement counted once (``first_of_each_measurement``)."""
    disagg = (rows["mode"] == "disagg").to_numpy()
    stated = disagg & deployment_stated(rows)
    engines = {str(e): (rows["backend"] == e).to_numpy() for e in sorted(rows["backend"].unique())}
    published = (_column_or(rows, "deployment_source", "") != "").to_numpy()
    return {**engines, "aggregated": ~disagg, "disaggregated, worker counts stated": stated,
            "disaggregated, deployment published by InferenceX": disagg & published,
            "disaggregated with MTP (acceptance fitted)": disagg & speculating(rows),
            "aggregated with MTP (acceptance from the disaggregated rows)": ~disagg & speculating(rows),
            "aggregated SGLang, fixed lengths (every wave a burst)": ~disagg & engines.get("sglang", False)
            & _column_or(rows, FIXED_LENGTHS, False).to_numpy(dtype=bool),
            "disaggregated, worker counts not stated": disagg & ~stated, "dense models": ~moe, "MoE models": moe,
            "each measurement once (its repeats in other sweeps left out)": first_of_each_measurement(rows)}


def slice_summary(predicted: pd.DataFrame, held: pd.DataFrame, moe: np.ndarray) -> list[dict[str, Any]]:
    """Per slice (``slice_masks``): rows and median |error| of TPOT and TTFT in sample and with each model left out
    (``held``: :func:`held_out` by model_path, the same rows in the same order)."""
    ttft, tpot = relative_errors(predicted)
    held_ttft, held_tpot = relative_errors(held)
    return [{"slice": label, "rows": int(mask.sum()), "tpot_median_err": _stats(tpot[mask])[0],
             "ttft_median_err": _stats(ttft[mask])[0], "tpot_median_err_model_out": _stats(held_tpot[mask])[0],
             "ttft_median_err_model_out": _stats(held_ttft[mask])[0]}
            for label, mask in slice_masks(predicted, moe).items()]


def uncovered_reasons(predicted: pd.DataFrame) -> pd.Series:
    """How many rows are not covered, per reason."""
    return predicted.loc[predicted["reason"] != "", "reason"].value_counts()


def with_overheads(step_overheads: dict[str, float], request_overheads: dict[str, float] | None = None,
                   dp_sync_s: float | None = None,
                   first_token_steps: dict[str, float] | None = None) -> dict[str, EngineTraits]:
    """The engine table with the given per-step (and per-request) overheads, DP sync and first-token steps (None or
    an engine left out: the shipped one)."""
    request_overheads, first_token_steps = request_overheads or {}, first_token_steps or {}
    return {name: replace(traits, step_overhead_s=step_overheads.get(name, traits.step_overhead_s),
                          request_overhead_s=request_overheads.get(name, traits.request_overhead_s),
                          dp_sync_s=traits.dp_sync_s if dp_sync_s is None else dp_sync_s,
                          first_token_steps=first_token_steps.get(name, traits.first_token_steps))
            for name, traits in ENGINE_TRAITS.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingValidation:
    """``paraplan validate --serving``: the accuracy table in sample and held out."""

    constants: FittedConstants
    """Constants fitted on every covered row (the in-sample table uses them)."""
    table: pd.DataFrame
    """Per engine × GPU × mode: rows, coverage, median/p90 |error| of TPOT and TTFT (in sample)."""
    held_out: dict[str, tuple[float, float]]
    """Per scheme (leave one model out, leave one GPU out): median |error| of (TPOT, TTFT) over all covered rows."""
    uncovered: dict[str, int]
    """Rows not covered, per reason."""
    slices: list[dict[str, Any]]
    """Per engine, mode (disaggregated split by whether the row states its worker counts) and dense/MoE: rows and
    median |error| of TPOT and TTFT, in sample and with each model left out (``slice_summary``)."""
    source: str
    """Where the rows come from: their ``source`` and ``licence`` columns, else the file read."""


def _rows_source(rows: pd.DataFrame, folder: Path) -> str:
    """The distinct (source, licence) of the rows, or the measurements file's path when they state none."""
    if not {"source", "licence"} <= set(rows.columns):
        return str(measurements_file(folder))
    pairs = rows[["source", "licence"]].astype(str).drop_duplicates().itertuples(index=False)
    return "; ".join(f"{source} ({licence})" for source, licence in pairs)


def validate_serving(path: str | Path | None = None) -> ServingValidation:
    """Fit the constants, predict every row, and report in-sample and held-out error. ``path``: a folder in the
    layout of data/serving (default $PARAPLAN_SERVING_DATA, else the data shipped with paraplan)."""
    with serving_data(path) as folder:
        rows = load_measurements(folder)
        grid = overhead_grid(rows, folder)
        source = _rows_source(rows, folder)
        moe = moe_rows(grid.rows, folder)
    constants = fit_constants(grid, np.ones(len(grid.rows), dtype=bool))
    predicted = apply_constants(grid, constants)
    scores, held = {}, {}
    for label, column in (("leave one model out", "model_path"), ("leave one GPU out", "system")):
        held[column] = held_out(grid, column)
        ttft, tpot = relative_errors(held[column])
        scores[label] = (_stats(tpot)[0], _stats(ttft)[0])
    return ServingValidation(constants=constants, table=summarise(predicted), held_out=scores,
                             uncovered=uncovered_reasons(predicted).to_dict(),
                             slices=slice_summary(predicted, held["model_path"], moe), source=source)


def _plain(value: float) -> float | None:
    """JSON has no NaN: a group without covered rows reports null."""
    return None if not np.isfinite(value) else float(value)


def validation_document(report: ServingValidation) -> dict[str, Any]:
    """The report as plain data (the ``--json`` output of ``validate --serving``)."""
    groups: list[dict[str, Any]] = [
        {key: (_plain(value) if isinstance(value, float) else value) for key, value in row.items()}
        for row in report.table.to_dict(orient="records")]
    for group in groups:
        group["rows"] = int(group["rows"])
    c = report.constants
    return {"schema_version": 1, "groups": groups,
            "held_out": {label: {"tpot_median_err": _plain(tpot), "ttft_median_err": _plain(ttft)}
                         for label, (tpot, ttft) in report.held_out.items()},
            "constants": {"step_overhead_s": c.step_overhead_s, "request_overhead_s": c.request_overhead_s,
                          "first_token_steps": c.first_token_steps,
                          "dp_sync_s": c.dp_sync_s, "benchmark_waves": _plain(c.waves), "fitted_rows": c.fitted_rows},
            "uncovered": report.uncovered,
            "slices": [{key: (_plain(value) if isinstance(value, float) else value) for key, value in row.items()}
                       for row in report.slices],
            "source": report.source}
