"""Which measured kernel table prices a job's GEMMs, read from the profile store and cached beside it.

A training job's 16-bit GEMMs are cuBLAS(Lt) calls under every engine paraplan plans (PyTorch's ``F.linear``
under torchtitan and DeepSpeed, Transformer Engine's ``te.Linear`` under Megatron-LM), so a table measured
through PyTorch's linear layer on the same GPU prices them: paraplan's own training suite (stack ``pytorch ...``)
first, else aiconfigurator's plain-PyTorch GEMM tables (``torch.nn.functional.linear`` under vLLM,
``sglang_torch_linear`` under SGLang; ``vllm_default`` and ``sglang`` in older collectors' 16-bit rows), the
newest version of each engine, pooled. Low-precision GEMMs differ per recipe (per-tensor,
block-scaled, MX): they stay analytical until a table measured with the job's recipe exists.

Building a table reads only its group's rows (SQLite filters them); the built grid is cached in
``<store>.models/kernel_tables/`` under a digest of the hardware's stored files, so the next plan loads it in
milliseconds and new data invalidates it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.cost_models.kernel_tables import KernelTable, TableAxis, build_table
from paraplan.measurements.kernel_rows import KernelGroup, group_rows, kernel_groups, store_version

TORCH_LINEAR_KERNELS = ("torch.nn.functional.linear", "sglang_torch_linear")
"""aiconfigurator GEMM kernels that are PyTorch's own linear layer (cuBLAS), as a training step calls it."""
LEGACY_TORCH_LINEAR_KERNELS = ("sglang", "vllm_default")
"""aiconfigurator's older collectors named their GEMM rows by engine alone, every dtype alike; their 16-bit rows are
PyTorch's linear layer too: SGLang up to 0.5.10 ran ``F.linear(a, b, None)`` on 16-bit tensors (collector/sglang/
collect_gemm.py, ``kernel_source="sglang"``; the 0.12.0 wheel's A100 and H100 sglang 0.5.10 and 0.5.6.post2 tables),
vLLM up to 0.14.0 an unquantized ``RowParallelLinear`` (``kernel_source="vllm_default"``), whose unquantized method
calls ``torch.nn.functional.linear`` (the 0.24.0 collector labels the same path so). The A100 tables have only
these. (vLLM 0.14.0's and SGLang's pre-0.5.10 rows were timed on fp16 tensors and relabelled ``bfloat16`` when
aiconfigurator renamed its 16-bit type in April 2026: the same tensor-core rate on A100 and H100.)"""
SIXTEEN_BIT = ("bf16", "fp16")
GEMM_AXES = ("m", "n", "k")
TABLE_RULES_VERSION = 5
"""Part of every cache name: raise it when the choice or the building of a table changes, so old caches go unread."""


def _training_gemm_groups(groups: list[KernelGroup], dtype: str) -> list[KernelGroup]:
    """The groups that price a training job's ``dtype`` GEMMs: paraplan's own suite if the store has it, else the
    plain-PyTorch linear tables of the newest version of each serving engine (the same cuBLAS kernel measured under
    several engines: pooled, each grid cell then takes the median of all their rows; an engine's newer release
    supersedes its older one, as the newest NCCL does); the job's own 16-bit type where measured, else the other."""
    if dtype not in SIXTEEN_BIT:
        return []
    usable = [g for g in groups if g.dtype in SIXTEEN_BIT and g.name != "grouped_mm"
              and (g.stack.startswith("pytorch") or g.name in TORCH_LINEAR_KERNELS + LEGACY_TORCH_LINEAR_KERNELS)]
    chosen = [g for g in usable if g.stack.startswith("pytorch")] or _newest_per_engine(usable)
    same_type = [g for g in chosen if g.dtype == dtype]
    return sorted(same_type or chosen, key=lambda g: (g.stack, g.name, g.dtype))


def _newest_per_engine(groups: list[KernelGroup]) -> list[KernelGroup]:
    """The groups measured under the newest version of each engine (``sglang 0.5.14`` over ``sglang 0.5.6.post2``)."""
    newest: dict[str, tuple[int, ...]] = {}
    for group in groups:
        engine = group.stack.split()[0]
        newest[engine] = max(newest.get(engine, ()), _version_key(group.stack))
    return [g for g in groups if _version_key(g.stack) == newest[g.stack.split()[0]]]


def _cache_path(store: Path, hardware: str, what: str, version: str) -> Path:
    """Where the built tables ``what`` (e.g. ``gemm-bf16``) of ``hardware`` for this state of the store live."""
    name = f"{what}-v{TABLE_RULES_VERSION}-{version[:16]}.npz"
    return Path(store).with_suffix(".models") / "kernel_tables" / hardware / name


def _save(path: Path, tables: dict[str, KernelTable]) -> None:
    """Write ``tables`` (by key) atomically; a store folder that cannot be written just goes uncached."""
    meta = {key: {"op": t.op, "label": t.label, "num_rows": t.num_rows,
                  "axes": [[a.name, a.monotone, a.exponent_above] for a in t.axes]} for key, t in tables.items()}
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    for index, table in enumerate(tables.values()):
        arrays[f"t{index}_log_seconds"] = table.log_seconds
        arrays.update({f"t{index}_axis{i}": a.log2_points for i, a in enumerate(table.axes)})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        with partial.open("wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)
        partial.replace(path)
    except OSError:
        return


def _load(path: Path) -> dict[str, KernelTable] | None:
    """The cached tables by key, or None when absent or unreadable (they are then rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            return {key: KernelTable(op=m["op"], label=m["label"], num_rows=int(m["num_rows"]),
                                     log_seconds=data[f"t{index}_log_seconds"],
                                     axes=tuple(TableAxis(name, data[f"t{index}_axis{i}"], bool(mono), exp)
                                                for i, (name, mono, exp) in enumerate(m["axes"])))
                    for index, (key, m) in enumerate(meta.items())}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _cached(store: Path, hardware: str, what: str,
            build: Callable[[], dict[str, KernelTable]]) -> dict[str, KernelTable]:
    """The tables ``what`` of ``hardware``: from the cache for this state of the store, else built and cached (an
    empty result leaves a ``.none`` marker, so a store without them is not scanned again)."""
    path = _cache_path(store, hardware, what, store_version(store, hardware))
    if path.with_suffix(".none").is_file():
        return {}
    cached = _load(path) if path.is_file() else None
    if cached is not None:
        return cached
    tables = build()
    if tables:
        _save(path, tables)
    else:
        _mark_none(path.with_suffix(".none"))
    return tables


def _build_gemm(store: Path, groups: list[KernelGroup]) -> KernelTable | None:
    frames = [group_rows(store, group, GEMM_AXES, {"pass": "forward"}) for group in groups]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return None
    rows = rows[(rows[list(GEMM_AXES)] > 0).all(axis=1) & (rows["time_s"] > 0)]
    if rows.empty:
        return None
    kernels = ", ".join(f"{g.name} on {g.stack}" for g in groups)
    label = f"measured {groups[0].dtype} GEMM table ({groups[0].hardware}, {kernels}, {len(rows):,} rows)"
    return build_table("gemm", GEMM_AXES, rows[list(GEMM_AXES)].to_numpy(float), rows["time_s"].to_numpy(float),
                       label)


def training_gemm_table(store: Path, hardware: str, dtype: str) -> KernelTable | None:
    """The measured GEMM table for a training job's ``dtype`` on ``hardware``, or None when the store has none.

    The cache is consulted before the store's rows: finding the group scans every GEMM row's params (about half a
    second for aiconfigurator's whole database), a cached table loads in milliseconds."""
    if dtype not in SIXTEEN_BIT or not Path(store).is_file():
        return None

    def build() -> dict[str, KernelTable]:
        table = _build_gemm(store, _training_gemm_groups(kernel_groups(store, hardware, "gemm"), dtype))
        return {"gemm": table} if table is not None else {}

    return _cached(store, hardware, f"gemm-{dtype}", build).get("gemm")


def _mark_none(path: Path) -> None:
    """Remember that this state of the store has no table (best effort: an unwritable folder just rescans)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        return


SDPA_BACKENDS = {"flash": ("flash",), "fused": ("cudnn",)}
"""The training suite's SDPA backends (measurements/profile_kernels.py) that run a job's attention kernel: ``flash``
is FlashAttention-2 (the flash-attn library, SDPA's flash backend); ``fused`` is cuDNN's fused attention (Transformer
Engine under Megatron-LM, and torchtitan 0.2's SDPA wrapper, which puts CUDNN_ATTENTION first). The suite's
``default`` rows (whatever SDPA picks unasked) price neither: on PyTorch 2.11 they run at cuDNN's speed on H100 and
H200 (560-610 TFLOP/s forward at 8k-32k tokens, head dim 128), FlashAttention-2 at 300-345, so a job that states
flash priced from them came out up to 1.9x fast in its attention (MosaicML's 2023 flash-attn runs at 16k-64k
tokens: 12-49% fast on the shipped tables)."""
ATTENTION_AXES = ("seq_len", "sequences_heads")


def _attention_pair(rows: pd.DataFrame, label: str) -> tuple[KernelTable, KernelTable] | None:
    """(forward, backward) tables over (sequence length, sequences x heads) from one head dim's rows."""
    tables = []
    for which in ("forward", "backward"):
        part = rows[rows["pass"] == which]
        if part.empty:
            return None
        shapes = np.column_stack([part["seq_len"], part["batch"] * part["heads"]]).astype(float)
        tables.append(build_table(f"attention_{which}", ATTENTION_AXES, shapes, part["time_s"].to_numpy(float),
                                  f"{label}, {which}", exponents_above=(2.0, 1.0)))
    return tables[0], tables[1]


def _build_attention(store: Path, hardware: str, backends: tuple[str, ...]) -> dict[str, KernelTable]:
    """Forward and backward tables per head dim, keyed ``forward-<d>`` and ``backward-<d>``."""
    groups = [g for g in kernel_groups(store, hardware, "attention") if g.stack.startswith("pytorch")]
    for backend in backends:
        frames = [_pass_rows(store, g, backend) for g in groups]
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if rows.empty:
            continue
        stacks = ", ".join(sorted({g.stack for g in groups}))
        tables: dict[str, KernelTable] = {}
        for head_dim, part in rows.groupby("head_dim"):
            label = f"measured causal SDPA table ({hardware}, backend {backend} on {stacks}), head dim {head_dim:g}"
            pair = _attention_pair(part, label)
            if pair is not None:
                tables[f"forward-{int(head_dim)}"], tables[f"backward-{int(head_dim)}"] = pair
        if tables:
            return tables
    return {}


def _pass_rows(store: Path, group: KernelGroup, backend: str) -> pd.DataFrame:
    """One group's rows of ``backend``, forward and backward, with a ``pass`` column."""
    columns = ("seq_len", "batch", "heads", "head_dim")
    return pd.concat([group_rows(store, group, columns, {"backend": backend, "pass": which}).assign(**{"pass": which})
                      for which in ("forward", "backward")], ignore_index=True)


def training_attention_tables(store: Path, hardware: str,
                              attention_kernel: str) -> dict[int, tuple[KernelTable, KernelTable]]:
    """Measured (forward, backward) causal attention tables per head dim for a training job's kernel on
    ``hardware`` (paraplan's own training suite only: serving engines' attention kernels are not a training step's)."""
    backends = SDPA_BACKENDS.get(attention_kernel)
    if backends is None or not Path(store).is_file():
        return {}
    flat = _cached(store, hardware, f"attention-{attention_kernel}",
                   lambda: _build_attention(store, hardware, backends))
    dims = sorted({int(key.split("-")[1]) for key in flat})
    return {d: (flat[f"forward-{d}"], flat[f"backward-{d}"]) for d in dims
            if f"forward-{d}" in flat and f"backward-{d}" in flat}


TABLE_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
COLLECTIVE_AXES = ("size_bytes", "group_size")


def _version_key(stack: str) -> tuple[int, ...]:
    """``nccl 2.29.2`` -> (2, 29, 2): the newest NCCL measured wins."""
    return tuple(int(part) for part in stack.split()[-1].split(".") if part.isdigit())


def _build_collectives(store: Path, hardware: str) -> dict[str, KernelTable]:
    """One table per collective over (buffer bytes, group size) inside one NVLink domain, from the newest NCCL
    version measured on ``hardware`` (16-bit buffers), keyed by the collective's name."""
    groups = [g for g in kernel_groups(store, hardware, "collective")
              if g.stack.startswith("nccl ") and g.name in TABLE_COLLECTIVES and g.dtype in SIXTEEN_BIT]
    if not groups:
        return {}
    newest = max((g.stack for g in groups), key=_version_key)
    tables = {}
    for group in (g for g in groups if g.stack == newest):
        rows = group_rows(store, group, COLLECTIVE_AXES, {"domain": "intra"})
        rows = rows[(rows["size_bytes"] > 0) & (rows["group_size"] > 1) & (rows["time_s"] > 0)]
        if rows.empty:
            continue
        label = f"{group.name} ({hardware}, {newest}, {len(rows):,} rows)"
        tables[group.name] = build_table(group.name, COLLECTIVE_AXES, rows[list(COLLECTIVE_AXES)].to_numpy(float),
                                         rows["time_s"].to_numpy(float), label, exponents_above=(1.0, None))
    return tables


def collective_tables(store: Path, hardware: str) -> dict[str, KernelTable]:
    """Measured NCCL collective tables of ``hardware`` by name (empty when the store has none)."""
    if not Path(store).is_file():
        return {}
    return _cached(store, hardware, "collectives", lambda: _build_collectives(store, hardware))
