"""torch.profiler Chrome traces (``export_chrome_trace``): kernel events mapped to the ops that launched them.

Events with ``ph == "X"`` carry ``ts``/``dur`` in microseconds. A GPU kernel (``cat: kernel``) names
its launching CPU op through ``args["External id"]``; the CPU op (``cat: cpu_op``) carries
``args["Input Dims"]`` when the trace was recorded with ``record_shapes=True``. From those:
matrix multiplies (``aten::mm``, ``addmm``, ``linear``, ``matmul``, ``bmm``) become ``gemm`` rows,
scaled-dot-product attention ops become ``attention`` rows, NCCL kernels (``ncclDevKernel_*``,
``ncclKernel_*``) become ``collective`` rows sized from their ``record_param_comms`` metadata, and
any other kernel an ``elementwise`` row. A trace without GPU kernels (CPU run) yields its CPU ops,
labelled hardware ``cpu``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from paraplan.files import shown
from paraplan.hardware_profiles.units import SECONDS_PER_US
from paraplan.limits import MAX_TENSOR_DIM
from paraplan.measurements.ingest.hardware_names import CPU, catalog_name
from paraplan.measurements.ingest.records import Measurement, Parsed, bad_line, json_list

MAX_TENSOR_RANK = 8
"""Dimensions of one matmul or attention input: transformer ops take at most 5; a product of 8 dimensions of
MAX_TENSOR_DIM each still fits a float."""

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")
ATTENTION_OPS = re.compile(r"aten::(_scaled_dot_product\w*attention\w*|scaled_dot_product_attention)")
_NCCL = re.compile(r"nccl(?:Dev)?Kernel_(\w+?)_")
_NCCL_NAMES = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
               "SendRecv": "send_recv", "Broadcast": "broadcast", "Reduce": "reduce", "AllToAll": "all_to_all"}
_DTYPE_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Int": 4, "Long": 8}


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _dims(op: dict[str, Any]) -> list[Any]:
    dims = _args(op).get("Input Dims", [])
    return dims if isinstance(dims, list) else []


def _positive_ints(dims: object) -> bool:
    return isinstance(dims, list) and 0 < len(dims) <= MAX_TENSOR_RANK and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_TENSOR_DIM for x in dims)


def _number(value: object) -> float:
    """``value`` if it is a finite positive number, else 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def _gemm_shape(name: str, dims: list[Any]) -> dict[str, float] | None:
    """(m, n, k) of a matmul-like op from its input dims, or None when they do not say."""
    shapes = [d for d in dims if _positive_ints(d)]
    if name == "aten::addmm" and len(shapes) >= 3:
        shapes = shapes[1:]
    if len(shapes) < 2 or len(shapes[0]) < 2:
        return None
    a, b = shapes[0], shapes[1]
    m = math.prod(a[:-1])
    n = b[0] if name == "aten::linear" else b[-1]
    return {"m": float(m), "n": float(n), "k": float(a[-1])}


def _classify(op_name: str, dims: list[Any], kernel: dict[str, Any] | None) -> tuple[str, str, dict[str, Any]]:
    kernel_name = str((kernel or {}).get("name", ""))
    nccl = _NCCL.search(kernel_name)
    if nccl or op_name.startswith(("c10d::", "nccl:", "gloo:")):
        return "collective", _collective_name(nccl.group(1) if nccl else op_name), _comm_params(kernel or {})
    if op_name in GEMM_OPS and (shape := _gemm_shape(op_name, dims)):
        return "gemm", op_name, {**shape, "dtype": "bf16"}
    if ATTENTION_OPS.search(op_name) and dims and _positive_ints(dims[0]) and len(dims[0]) == 4:
        batch, heads, seq, head_dim = dims[0]
        return "attention", op_name, {"batch": batch, "heads": heads, "seq_len": seq, "head_dim": head_dim,
                                      "pass": "forward"}
    return "elementwise", op_name or kernel_name, {}


def _collective_name(raw: str) -> str:
    for key, name in _NCCL_NAMES.items():
        if key.lower() in raw.lower().replace("_", ""):
            return name
    return raw.split("::")[-1].split(":")[-1].rstrip("_")


def _comm_params(event: dict[str, Any]) -> dict[str, float | str]:
    args = _args(event)
    size = _number(args.get("In msg nelems")) * _DTYPE_BYTES.get(str(args.get("dtype")), 2)
    group = _number(args.get("Group size"))
    return {"size_bytes": size, "group_size": group, "domain": "intra", "devices_per_node": group}


def _events(path: Path, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    document, events = json_list(path, text, "traceEvents", "a Chrome trace")
    return document, [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _external_id(event: dict[str, Any]) -> int | str | None:
    found = _args(event).get("External id")
    return found if isinstance(found, (int, str)) else None


def _duration(path: Path, index: int, event: dict[str, Any]) -> float:
    dur = event.get("dur")
    seconds = _number(dur) * SECONDS_PER_US
    if seconds == 0 and dur != 0:
        raise bad_line(path, index, f"event {shown(event.get('name', '?'), 40)} has no valid 'dur' in microseconds")
    return seconds


def parse_torch_trace(path: Path, text: str) -> Parsed:
    """One row per GPU kernel (or per CPU op in a CPU-only trace); ``line`` is the event's index."""
    document, events = _events(path, text)
    ops = {_external_id(e): e for e in events if e.get("cat") == "cpu_op"}
    kernels = [(i, e) for i, e in enumerate(events, start=1) if e.get("cat") == "kernel"]
    out = []
    for index, event in kernels or [(i, e) for i, e in enumerate(events, start=1) if e.get("cat") == "cpu_op"]:
        op = ops.get(_external_id(event), event) if kernels else event
        kind, name, params = _classify(str(op.get("name", "")), _dims(op), event if kernels else None)
        if kind == "collective" and not (params["size_bytes"] and params["group_size"]):
            continue  # a CPU-side collective op without message metadata carries no size to learn from
        out.append(Measurement(kind=kind, name=name, line=index, time_s=_duration(path, index, event),
                               params=params))
    devices = document.get("deviceProperties")
    first = devices[0] if isinstance(devices, list) and devices else None
    gpu = catalog_name(str(first.get("name", ""))) if isinstance(first, dict) else None
    version = str(document.get("schemaVersion", "?"))[:20]
    return Parsed(measurements=out, hardware=gpu if kernels else CPU,
                  software=f"torch.profiler trace schema {version}" + ("" if kernels else " (CPU ops, no GPU kernels)"))
