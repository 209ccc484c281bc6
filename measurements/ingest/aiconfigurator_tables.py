"""One table of NVIDIA aiconfigurator's per-op database (measurements/ingest/aiconfigurator.py finds them): its
columns checked before any arithmetic and turned into paraplan's records, column by column (a table holds up to a
few hundred thousand rows; nothing here makes an object per row until ``ParsedTable.records`` is asked for).

The records (``time_s``: the row's ``latency`` in seconds; ``line``: the 1-based row; every param a number or text;
``stack`` is ``"<framework> <version>"`` lower-case, e.g. ``vllm 0.24.0``; dtypes in paraplan's names, ``DTYPES``):

- ``gemm_perf``: kind ``gemm``, name the ``kernel_source``; ``m``, ``n``, ``k``, ``dtype``, ``stack``.
- ``context_attention_perf``: kind ``attention``, name the kernel; ``pass`` ``forward``, ``causal`` 1, ``batch``,
  ``seq_len`` (new tokens per sequence), ``prefix`` (tokens cached before them), ``heads``, ``kv_heads``,
  ``head_dim``, ``window`` (0: none), ``dtype``, ``kv_dtype``, ``stack``.
- ``generation_attention_perf``: kind ``attention``, name the kernel; ``pass`` ``decode``, ``batch``, ``kv_len``
  (keys one decode step attends to per sequence), ``heads``, ``kv_heads``, ``head_dim``, ``window``, ``dtype``,
  ``kv_dtype``, ``stack``.
- ``context_mla_perf`` and ``generation_mla_perf`` (multi-head latent attention's core, DeepSeek-V3's shape): kind
  ``attention`` with ``mla`` 1, name the kernel; as the two tables above but without ``kv_heads``, ``head_dim`` and
  ``window`` (``pass`` ``forward`` with ``causal``, ``seq_len`` and ``prefix``, or ``decode`` with ``kv_len``;
  ``batch``, ``heads``, ``dtype``, ``kv_dtype``, ``stack``), and the latent shape the collectors fix:
  ``kv_lora_rank`` 512, ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128.
- ``nccl_perf`` and ``custom_allreduce_perf``: kind ``collective``, name paraplan's collective (``all_reduce``,
  ``all_gather``, ``reduce_scatter``, ``all_to_all``) or ``custom_all_reduce``; ``size_bytes`` (the whole buffer),
  ``group_size``, ``domain`` (``intra`` within one NVLink domain, else ``inter``), ``dtype``, ``kernel`` (the
  ``kernel_source``: NCCL, or the custom kernel and graph/eager mode), ``stack``.
- ``moe_perf``: kind ``moe``, name the kernel; ``num_tokens``, ``hidden_size``, ``inter_size``, ``topk``,
  ``num_experts``, ``moe_tp_size``, ``moe_ep_size``, ``dtype``, ``distribution``, ``stack``.

What the columns mean, from aiconfigurator's collector and its table loader (github.com/ai-dynamo/aiconfigurator at
commit 095f58a; the 0.12.0 wheel ships the loader compiled from aic-core's Rust, whose source is cited):

- ``latency``: milliseconds per call, the mean over CUDA-event timed runs (collector/helper.py
  ``benchmark_with_power``, lines 237 and 387).
- GEMM ``m``, ``n``, ``k``: ``x[m, k]`` times a linear layer's ``weight[n, k]`` (collector/vllm/collect_gemm.py
  lines 105 and 177-184), so C[m, n] = A[m, k]·B[k, n] as paraplan's ``gemm`` rows say.
- Context attention: ``isl`` new tokens per sequence with nothing cached before them: the collectors write ``step``
  0 (collector/vllm/collect_attn.py lines 98-102 and 328-331, query and sequence lengths both ``input_len``) and the
  loader keys the row by ``isl`` alone (aic-core perf_database/attention.rs ``load_context_parquet``, line 535 on).
  A ``step`` would be history already cached, as in generation rows, so it is kept as ``prefix``.
- Generation attention: one new token per sequence (``isl`` = 1) after ``step`` tokens of history, so a decode step
  attends to ``kv_len = isl + step`` keys: vLLM's ``seq_lens = input_len + 1`` with ``query_lens = 1`` and
  ``step = input_len`` (collect_attn.py lines 103-108 and 332-334; TensorRT-LLM's collector caches ``input_len``
  tokens and decodes one, collector/trtllm/collect_attn.py lines 297-324 and 414-420), and the loader keys the row
  by ``isl + step`` (attention.rs line 14, "kv_seq_tokens = isl + step", and line 639).
- MLA attention (``context_mla_perf``, ``generation_mla_perf``): ``num_heads`` are the query heads ONE GPU runs (the
  collectors time ``num_heads // tp_size`` local heads of a 64- or 128-head model and write that local count,
  collector/sglang/collect_mla.py ``run_mla`` and collector/trtllm/collect_mla.py, so ``tp_size`` is not read), all
  sharing one latent KV head; ``isl`` and ``step`` as in the attention tables above (the context kernel runs ``isl``
  new tokens, ``step`` 0; the decode kernel one token after ``step`` cached ones). Both collectors build
  DeepSeek-V3's MLA: ``KV_LORA_RANK`` 512, ``QK_NOPE_HEAD_DIM`` 128, ``QK_ROPE_HEAD_DIM`` 64, values of 128 before
  absorption (collect_mla.py module constants); ``mla_dtype`` is the attention math's dtype. The projections around
  the kernel (``mla_bmm_perf``, the module tables) are not these rows.
- NCCL ``message_size``: ELEMENTS of ``nccl_dtype``: nccl-tests' byte size divided by 2 for ``half`` and 1 for
  ``int8`` (collector/network/collect_nccl.py lines 48 and 107); nccl-tests' size is the whole buffer (the gathered
  output for all-gather). Its ``version`` column is the NCCL version that ran (lines 45-46 and 112) and its
  ``framework`` is a fixed ``TRTLLM`` label, so the stack of these rows is ``nccl <version>``.
- Custom all-reduce ``message_size``: elements too: the tensor holds ``size`` elements of ``allreduce_dtype``
  (collector/network/collect_all_reduce.py lines 69-76, 167-168 and 253).
- All collectives ran on one node of ``num_gpus`` GPUs (nccl-tests ``-t num_gpus`` threads), or one NVL72 rack.
- MoE: ``num_tokens`` tokens of width ``hidden_size`` enter one rank's fused-MoE layer; ``inter_size`` is the
  expert's full intermediate size and ``num_experts`` the model's experts; the single GPU runs rank 0's share under
  ``moe_tp_size`` x ``moe_ep_size`` sharding (collector/vllm/collect_moe.py lines 538-542, 595-598 and 702);
  ``distribution`` is how tokens pick experts: ``balanced`` or ``power_law_<alpha>`` (lines 736-748 and 787-789).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from paraplan.errors import InputError
from paraplan.files import listed, one_line, shown
from paraplan.measurements.ingest.records import Measurement

READ_KINDS = ("gemm", "attention", "collective", "moe")
"""The measurement kinds the tables paraplan reads become (``--op``)."""
TABLES = {"gemm_perf": "gemm", "context_attention_perf": "attention", "generation_attention_perf": "attention",
          "context_mla_perf": "attention", "generation_mla_perf": "attention",
          "nccl_perf": "collective", "custom_allreduce_perf": "collective", "moe_perf": "moe"}
"""The tables paraplan reads -> the measurement kind their rows become."""
MAX_DIM = 1 << 24
"""Largest shape a row may give (m, n, k, batch, sequence, heads, widths, tokens): 16.7 million, past any layer or
batch these tables sweep (the 0.12.0 wheel's largest: a 131,072-key decode step, GEMM sides of 65,536)."""
MAX_ELEMENTS = 1 << 40
"""Largest collective message, in elements (2 TiB of fp16): far past one GPU's memory."""
MAX_LATENCY_MS = 1e6
"""Longest call a row may time: 1,000 s; the slowest kernel in the 0.12.0 wheel takes 1.35 s (an L40S fp8 GEMM)."""
MAX_TABLE_ROWS = 2_000_000
"""Rows of one table: the largest in the 0.12.0 wheel has 260,756; one table's rows are in memory at a time."""
MAX_TABLE_UNPACKED_BYTES = 1 << 30
"""A table's columns once decompressed, as its own metadata states them: refused before anything is decoded."""
MAX_ROW_GROUPS = 100_000
"""Row groups of one table (each is a few KB of metadata)."""
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32", "nvfp4": "fp4"}
"""aiconfigurator's dtype names -> paraplan's; any other (fp8, fp8_block, int8, w4a16_mxfp4, ...) is lowercased."""
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}
"""Bytes per element of a collective's dtype (paraplan's names): message sizes are counted in elements."""
COLLECTIVE_NAMES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
                    "alltoall": "all_to_all", "all_to_all": "all_to_all"}
"""aiconfigurator's ``op_name`` of an NCCL row -> paraplan's collective name (cost_models/collectives.py)."""
_ATTENTION = ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype", "kv_cache_dtype",
              "latency")
_MLA = ("batch_size", "isl", "num_heads", "mla_dtype", "kv_cache_dtype", "latency")
MLA_SHAPE = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
"""The latent shape aiconfigurator's MLA collectors time (DeepSeek-V3's; collector/sglang/collect_mla.py and
collector/trtllm/collect_mla.py constants), kept on every MLA row so a model of another shape matches none."""
_REQUIRED = {
    "gemm_perf": ("gemm_dtype", "m", "n", "k", "latency"),
    "context_attention_perf": _ATTENTION,
    "generation_attention_perf": (*_ATTENTION, "step"),
    "context_mla_perf": _MLA,
    "generation_mla_perf": (*_MLA, "step"),
    "nccl_perf": ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency"),
    "custom_allreduce_perf": ("allreduce_dtype", "num_gpus", "message_size", "latency"),
    "moe_perf": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
                 "moe_ep_size", "distribution", "latency"),
}
"""The columns each table must have; ``_OPTIONAL`` ones are read when present."""
_OPTIONAL = ("framework", "version", "device", "kernel_source", "op_name", "window_size", "beam_width", "step")


@dataclass(frozen=True, slots=True)
class Texts:
    """A text column factorized: each row's index into ``values`` (the distinct texts, converted)."""

    codes: Any
    """Per row, an index into ``values`` (numpy integers)."""
    values: list[Any]
    """The distinct values."""

    def column(self) -> list[Any]:
        """The value of every row."""
        import numpy as np

        lookup = np.empty(len(self.values), dtype=object)
        lookup[:] = self.values
        return list(lookup[self.codes])


Param = Any
"""One param over a table's rows: an int64 numpy array, :class:`Texts`, or one str or int for every row."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedTable:
    """One table's rows, checked, in column form."""

    software: str
    """aiconfigurator-core's version, the stacks and the devices the rows name."""
    measurement_kind: str
    """The kind every row is (``gemm``, ``attention``, ``collective``, ``moe``)."""
    names: Texts
    """Each row's op or kernel name."""
    seconds: list[float]
    """Each row's time in seconds."""
    params: dict[str, Param]
    """Each param over the rows."""

    def json_params(self) -> list[str]:
        """Each row's params as ``json.dumps(params, sort_keys=True)`` writes them, built column by column in C."""
        import json

        import pyarrow as pa
        import pyarrow.compute as pc

        pieces: list[Any] = []
        literal = "{"
        for key in sorted(self.params):
            literal += ("" if literal == "{" else ", ") + json.dumps(key) + ": "
            value = self.params[key]
            if isinstance(value, (str, int)):
                literal += json.dumps(value)
                continue
            if isinstance(value, Texts):
                texts = pa.array([json.dumps(v) for v in value.values], pa.string()).take(pa.array(value.codes))
            else:
                texts = pa.array(value).cast(pa.string())
            pieces += [pa.scalar(literal), texts]
            literal = ""
        if not pieces:
            return [literal + "}"] * len(self.seconds)
        return list(pc.binary_join_element_wise(*pieces, pa.scalar(literal + "}"), "").to_pylist())

    def records(self) -> tuple[Measurement, ...]:
        """The rows as Measurements (an object per row: for tests and small tables)."""
        import itertools

        keys = tuple(self.params)
        values = [_per_row(value) for value in self.params.values()]
        return tuple(Measurement(kind=self.measurement_kind, name=name, time_s=time_s, line=line,
                                 params=dict(zip(keys, row)))
                     for line, name, time_s, *row in zip(itertools.count(1), self.names.column(), self.seconds,
                                                         *values))


def _per_row(value: Param) -> Iterator[Any] | list[Any]:
    import itertools

    if isinstance(value, Texts):
        return value.column()
    if isinstance(value, (str, int)):
        return itertools.repeat(value)
    return list(value.tolist())


class _Columns:
    """One table's columns as read; each is checked before any arithmetic, and an error names the table, the row
    (1-based) and the column."""

    def __init__(self, shown_name: str, table: Any, folder: tuple[str, str, str, str]) -> None:
        self.shown, self.table, self.folder, self.rows = shown_name, table, folder, table.num_rows
        self.present = set(table.column_names)

    def error(self, row: int | None, column: str, what: str) -> InputError:
        """The one error shape: table, row, column, what is wrong."""
        where = f"row {row}: " if row is not None else ""
        return InputError(one_line(f"{self.shown}: {where}column {column!r} {what}"))

    def _numbers(self, column: str) -> Any:
        import pyarrow as pa

        array = self.table.column(column)
        if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
            raise self.error(None, column, f"must hold numbers, holds {shown(str(array.type), 30)}")
        return array.cast(pa.float64(), safe=False).fill_null(float("nan")).to_numpy()

    def _check(self, ok: Any, column: str, values: Any, what: str) -> None:
        if not ok.all():
            row = int((~ok).nonzero()[0][0])
            raise self.error(row + 1, column, f"{what}, got {shown(values[row].item(), 40)}")

    def whole(self, column: str, low: int, high: int, default: int | None = None) -> Any:
        """``column`` as int64, every value a whole number in [low, high] (``default`` when the column is absent)."""
        import numpy as np

        if column not in self.present:
            if default is None:
                raise self.error(None, column, "is missing")
            return np.full(self.rows, default, dtype=np.int64)
        values = self._numbers(column)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(values) & (values >= low) & (values <= high) & (values == np.round(values))
        self._check(ok, column, values, f"must be a whole number from {low:,} to {high:,}")
        return values.astype(np.int64)

    def seconds(self) -> list[float]:
        """``latency`` (milliseconds) in seconds, every value finite, positive and under MAX_LATENCY_MS."""
        import numpy as np

        from paraplan.hardware_profiles.units import SECONDS_PER_MS

        values = self._numbers("latency")
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(values) & (values > 0) & (values < MAX_LATENCY_MS)
        self._check(ok, "latency", values, f"must be milliseconds above 0 and below {MAX_LATENCY_MS:,.0f}")
        return list((values * SECONDS_PER_MS).tolist())

    def text(self, column: str, default: str | None = None, convert: Callable[[str], Any] = str) -> Texts:
        """``column`` factorized, each distinct value printable text of 1 to 200 characters, then ``convert``ed
        (which may raise ValueError with a reason); ``default`` for every row when the column is absent."""
        import numpy as np
        import pyarrow as pa

        if column not in self.present:
            if default is None:
                raise self.error(None, column, "is missing")
            return Texts(np.zeros(self.rows, dtype=np.int64), [convert(default)])
        array = self.table.column(column).combine_chunks()
        if pa.types.is_dictionary(array.type):
            array = array.cast(array.type.value_type)
        if getattr(pa.types, "is_string_view", lambda _: False)(array.type):  # pyarrow >= 16
            array = array.cast(pa.string())
        if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            raise self.error(None, column, f"must hold text, holds {shown(str(array.type), 30)}")
        encoded = array.dictionary_encode()
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        values: list[Any] = []
        for index, value in enumerate(encoded.dictionary.to_pylist()):
            if not 0 < len(value) <= 200 or not value.isprintable():
                raise self.error(self._first(codes, index), column, "must be printable text of 1 to 200 characters, "
                                 f"got {shown(value, 40)}")
            try:
                values.append(convert(value))
            except ValueError as exc:
                raise self.error(self._first(codes, index), column, str(exc)) from None
        if (codes < 0).any():
            raise self.error(self._first(codes, -1), column, "is empty")
        return Texts(codes, values)

    @staticmethod
    def _first(codes: Any, index: int) -> int:
        return int((codes == index).nonzero()[0][0]) + 1

    def dtype(self, column: str) -> Texts:
        """``column`` (a dtype) in paraplan's names."""
        return self.text(column, convert=lambda name: DTYPES.get(name.lower(), name.lower()))

    def stack(self, nccl: bool = False) -> Texts:
        """Per row ``"<framework> <version>"`` lower-cased (``vllm 0.24.0``); ``nccl <version>`` for NCCL rows, whose
        version column is the NCCL that ran; the engine and version folders where the columns are absent."""
        import numpy as np

        versions = self.text("version", default=self.folder[3])
        frameworks = Texts(np.zeros(self.rows, dtype=np.int64), ["nccl"]) if nccl else \
            self.text("framework", default=self.folder[2], convert=str.lower)
        pairs, codes = np.unique(frameworks.codes * len(versions.values) + versions.codes, return_inverse=True)
        return Texts(codes.reshape(-1), [f"{frameworks.values[int(p) // len(versions.values)]} "
                                         f"{versions.values[int(p) % len(versions.values)]}" for p in pairs])

    def names(self) -> Texts:
        """The kernel each row timed (``kernel_source``), else its ``op_name``, else the table's name."""
        import numpy as np

        for column in ("kernel_source", "op_name"):
            if column in self.present:
                return self.text(column)
        return Texts(np.zeros(self.rows, dtype=np.int64), [self.shown.rsplit("/", 1)[-1].removesuffix(".parquet")])


def _gemm(t: _Columns) -> dict[str, Param]:
    return {"m": t.whole("m", 1, MAX_DIM), "n": t.whole("n", 1, MAX_DIM), "k": t.whole("k", 1, MAX_DIM),
            "dtype": t.dtype("gemm_dtype"), "stack": t.stack()}


def _attention(t: _Columns) -> dict[str, Param]:
    """The shape both attention tables share (beam width 1 only: the only one the collectors write)."""
    t.whole("beam_width", 1, 1, default=1)
    return {"batch": t.whole("batch_size", 1, MAX_DIM), "heads": t.whole("num_heads", 1, MAX_DIM),
            "kv_heads": t.whole("num_key_value_heads", 1, MAX_DIM), "head_dim": t.whole("head_dim", 1, MAX_DIM),
            "window": t.whole("window_size", 0, MAX_DIM, default=0), "dtype": t.dtype("attn_dtype"),
            "kv_dtype": t.dtype("kv_cache_dtype"), "stack": t.stack()}


def _context_pass(t: _Columns) -> dict[str, Param]:
    # isl new tokens after `step` cached ones (0 in every collector): see the module docstring.
    return {"pass": "forward", "causal": 1, "seq_len": t.whole("isl", 1, MAX_DIM),
            "prefix": t.whole("step", 0, MAX_DIM, default=0)}


def _decode_pass(t: _Columns) -> dict[str, Param]:
    # A decode step attends to isl + step keys (attention.rs line 639; collect_attn.py lines 103-108 and 332-334;
    # MLA: collect_mla.py, isl 1 new token after step input_len cached ones).
    return {"pass": "decode", "kv_len": t.whole("isl", 1, MAX_DIM) + t.whole("step", 0, MAX_DIM)}


def _context_attention(t: _Columns) -> dict[str, Param]:
    return {**_context_pass(t), **_attention(t)}


def _generation_attention(t: _Columns) -> dict[str, Param]:
    return {**_decode_pass(t), **_attention(t)}


def _mla(t: _Columns) -> dict[str, Param]:
    """The shape both MLA tables share: local query heads over one latent KV head (module docstring)."""
    t.whole("beam_width", 1, 1, default=1)
    return {"mla": 1, **MLA_SHAPE, "batch": t.whole("batch_size", 1, MAX_DIM),
            "heads": t.whole("num_heads", 1, MAX_DIM), "dtype": t.dtype("mla_dtype"),
            "kv_dtype": t.dtype("kv_cache_dtype"), "stack": t.stack()}


def _context_mla(t: _Columns) -> dict[str, Param]:
    return {**_context_pass(t), **_mla(t)}


def _generation_mla(t: _Columns) -> dict[str, Param]:
    return {**_decode_pass(t), **_mla(t)}


def _element_bytes(name: str) -> int:
    paraplan_name = DTYPES.get(name.lower(), name.lower())
    if paraplan_name not in ELEMENT_BYTES:
        raise ValueError(f"is a dtype of unknown size {shown(name, 30)} (known: {', '.join(ELEMENT_BYTES)})")
    return ELEMENT_BYTES[paraplan_name]


def _collective(t: _Columns, dtype_column: str, domain_gpus: int, nccl: bool) -> dict[str, Param]:
    """A collective's whole buffer in bytes (``message_size`` counts elements), its group and where it ran."""
    import numpy as np

    from paraplan.limits import MAX_GPUS

    group = t.whole("num_gpus", 1, MAX_GPUS)
    width = t.text(dtype_column, convert=_element_bytes)
    sizes = t.whole("message_size", 1, MAX_ELEMENTS) * np.asarray(width.values, dtype=np.int64)[width.codes]
    return {"size_bytes": sizes, "group_size": group,
            "domain": Texts((group <= domain_gpus).astype(np.int64), ["inter", "intra"]),
            "dtype": t.dtype(dtype_column), "kernel": t.text("kernel_source", default="NCCL" if nccl else "custom"),
            "stack": t.stack(nccl=nccl)}


def _moe(t: _Columns) -> dict[str, Param]:
    from paraplan.limits import MAX_EXPERTS, MAX_GPUS

    return {"num_tokens": t.whole("num_tokens", 1, MAX_DIM), "hidden_size": t.whole("hidden_size", 1, MAX_DIM),
            "inter_size": t.whole("inter_size", 1, MAX_DIM), "topk": t.whole("topk", 1, MAX_EXPERTS),
            "num_experts": t.whole("num_experts", 1, MAX_EXPERTS), "moe_tp_size": t.whole("moe_tp_size", 1, MAX_GPUS),
            "moe_ep_size": t.whole("moe_ep_size", 1, MAX_GPUS), "dtype": t.dtype("moe_dtype"),
            "distribution": t.text("distribution"), "stack": t.stack()}


def _collective_name(name: str) -> str:
    if name not in COLLECTIVE_NAMES:
        raise ValueError(f"is a collective paraplan does not know: {shown(name, 30)} (known: "
                         f"{', '.join(COLLECTIVE_NAMES)})")
    return COLLECTIVE_NAMES[name]


def _params_and_names(table: str, t: _Columns, domain_gpus: int) -> tuple[dict[str, Param], Texts]:
    """The params of one table's rows and each row's name (the collective for collectives, else the kernel)."""
    import numpy as np

    if table == "nccl_perf":
        return _collective(t, "nccl_dtype", domain_gpus, True), t.text("op_name", convert=_collective_name)
    if table == "custom_allreduce_perf":
        params = _collective(t, "allreduce_dtype", domain_gpus, False)
        return params, Texts(np.zeros(t.rows, dtype=np.int64), ["custom_all_reduce"])
    build = {"gemm_perf": _gemm, "context_attention_perf": _context_attention,
             "generation_attention_perf": _generation_attention, "context_mla_perf": _context_mla,
             "generation_mla_perf": _generation_mla, "moe_perf": _moe}[table]
    return build(t), t.names()


def parse_table(shown_name: str, table: str, folder: tuple[str, str, str, str], domain_gpus: int, data: bytes,
                core_version: str | None) -> ParsedTable:
    """One table's bytes (``table``: its name, ``gemm_perf``; ``folder``: its (system, op, engine, version); the
    system's NVLink-domain GPUs) read and checked, in column form; InputError naming the table, the row and the
    column of a bad value."""
    t = _Columns(shown_name, _read_table(shown_name, table, data), folder)
    if not t.rows:
        raise InputError(f"{shown_name}: the table has no rows")
    params, names = _params_and_names(table, t, domain_gpus)
    seconds = t.seconds()
    devices = t.text("device").values if "device" in t.present else []
    core = f"aiconfigurator-core {core_version}" if core_version else "aiconfigurator-core (version not recorded)"
    software = one_line(f"{core}; {listed(sorted(params['stack'].values), 80)}; "
                        f"{listed(sorted(devices), 80) or 'device not recorded'}", 400)
    return ParsedTable(software=software, measurement_kind=TABLES[table], names=names, seconds=seconds,
                       params=params)


_ARROW_ERRORS = (ValueError, OSError, TypeError, KeyError, IndexError, NotImplementedError, OverflowError,
                 MemoryError, EOFError, RecursionError, UnicodeError)
"""What pyarrow raises on a damaged file: its ArrowException subclasses derive from these builtins."""


def _read_table(shown_name: str, table: str, data: bytes) -> Any:
    """The columns of ``table`` paraplan reads, as a pyarrow Table; its size is checked from the file's metadata
    before any column is decoded."""
    import pyarrow.parquet as parquet

    try:
        handle = parquet.ParquetFile(io.BytesIO(data))
        meta = handle.metadata
        groups = meta.num_row_groups
        unpacked = sum(meta.row_group(i).total_byte_size for i in range(min(groups, MAX_ROW_GROUPS)))
        if groups > MAX_ROW_GROUPS or meta.num_rows > MAX_TABLE_ROWS or not 0 <= unpacked <= MAX_TABLE_UNPACKED_BYTES:
            raise InputError(f"{shown_name}: {meta.num_rows:,} rows in {groups:,} row groups, {unpacked:,} bytes "
                             f"unpacked is too large for an aiconfigurator table (at most {MAX_TABLE_ROWS:,} rows, "
                             f"{MAX_TABLE_UNPACKED_BYTES:,} bytes)")
        present = set(handle.schema_arrow.names)
        if missing := [c for c in _REQUIRED[table] if c not in present]:
            raise InputError(one_line(f"{shown_name}: column {missing[0]!r} is missing ({table} needs "
                                      f"{listed(list(_REQUIRED[table]), 120)})"))
        read = handle.read(columns=[c for c in dict.fromkeys((*_REQUIRED[table], *_OPTIONAL)) if c in present])
        read.validate(full=True)  # offsets and UTF-8 of every text cell, before anything decodes them
        return read
    except InputError:
        raise
    except _ARROW_ERRORS as exc:
        raise InputError(one_line(f"{shown_name}: not a readable parquet table ({type(exc).__name__}: "
                                  f"{shown(str(exc), 100)})")) from None
