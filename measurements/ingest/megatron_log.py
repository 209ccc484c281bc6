"""Megatron-LM training logs: iteration times, TFLOP/s, memory, and the run's configuration.

Lines (megatron/training/training.py ``training_log``), after any launcher prefix
(``[host:rank]:``, ``N:``) and timestamp: `` iteration 43/ 100 | consumed samples: ... |
elapsed time per iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | ...
global batch size: 128 | ...``. Memory: ``[Rank 0] (after 10 iterations) memory (MB) |
allocated: ... | max allocated: ...``. The configuration comes from the ``arguments`` block Megatron
prints at start (``  tensor_model_parallel_size ...... 8``); those values ride on every step row.
"""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.hardware_profiles.units import FLOPS_PER_TFLOP, SECONDS_PER_MS
from paraplan.measurements.ingest.records import Measurement, Parsed, bad_line, positive_number

# Megatron divides torch's byte counts by 1024·1024 and prints 'MB': the unit is MiB.
BYTES_PER_MIB = 2**20
_ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_ARGUMENT = re.compile(r"^\s*([a-z][a-z0-9_]*)\s+\.{3,}\s+(\S.*)$")
_MEMORY = re.compile(r"memory \(MB\)\s*\|(.*)$")
# The arguments that tell what ran: kept as params of every step row.
CONFIG_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
               "expert_model_parallel_size", "expert_tensor_parallel_size", "data_parallel_size", "world_size",
               "micro_batch_size",
               "global_batch_size", "seq_length", "num_layers", "hidden_size", "ffn_hidden_size",
               "num_attention_heads", "num_query_groups", "num_experts", "moe_router_topk", "padded_vocab_size",
               "num_layers_per_virtual_pipeline_stage", "sequence_parallel", "use_distributed_optimizer",
               "recompute_granularity", "fp8", "bf16", "swiglu")


def fields_of(text: str) -> dict[str, str]:
    """'key: value | key: value |' segments as a dict (key up to the first colon, both stripped; segments
    without a colon or a value are skipped). Split, not a regular expression: a nested lazy pattern took
    cubic time on a line of spaces (214 s for 1,000)."""
    found = {}
    for segment in text.split("|"):
        key, colon, value = segment.partition(":")
        if colon and key.strip() and value.strip():
            found[key.strip()] = value.strip()
    return found


def _arguments(lines: list[str]) -> dict[str, float | str]:
    found: dict[str, float | str] = {}
    for line in lines:
        match = _ARGUMENT.match(line)
        if match and match.group(1) in CONFIG_KEYS:
            value = match.group(2).strip()
            found[match.group(1)] = float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else value
    return found


def _step(path: Path, line_no: int, match: re.Match[str], config: dict[str, float | str]) -> Measurement:
    fields = fields_of(match.group(3))
    elapsed = next((v for k, v in fields.items() if k.startswith("elapsed time per iteration")), None)
    if elapsed is None:
        raise bad_line(path, line_no, "an iteration line without 'elapsed time per iteration (ms)'")
    params: dict[str, float | str] = {"iteration": float(match.group(1)), **config}
    tflops = next((v for k, v in fields.items() if k.startswith("throughput per GPU")), None)
    if tflops is not None:
        params["model_flops_per_s_per_gpu"] = positive_number(path, line_no, "throughput per GPU",
                                                              tflops) * FLOPS_PER_TFLOP
    if "global batch size" in fields:
        params["global_batch"] = positive_number(path, line_no, "global batch size", fields["global batch size"])
    seconds = positive_number(path, line_no, "elapsed time per iteration (ms)", elapsed) * SECONDS_PER_MS
    return Measurement(kind="step", name="iteration", line=line_no, time_s=seconds, params=params)


def _memory(path: Path, line_no: int, match: re.Match[str]) -> Measurement:
    fields = fields_of(match.group(1))
    params: dict[str, float | str] = {
        f"{key.replace(' ', '_')}_bytes": positive_number(path, line_no, key, value) * BYTES_PER_MIB
        for key, value in fields.items()}
    if not params:
        raise bad_line(path, line_no, "a memory (MB) line without 'allocated: N' fields")
    return Measurement(kind="gpu_memory", name="memory", line=line_no, time_s=0.0, params=params)


def parse_megatron_log(path: Path, text: str) -> Parsed:
    """Step and memory rows of a Megatron-LM log; the GPU is not in the log (pass --hardware)."""
    lines = text.splitlines()
    config = _arguments(lines)
    out = []
    for line_no, line in enumerate(lines, start=1):
        step = _ITERATION.search(line)
        if step and "elapsed time per iteration" in line:
            out.append(_step(path, line_no, step, config))
        elif "memory (MB)" in line and (memory := _MEMORY.search(line)):
            out.append(_memory(path, line_no, memory))
    version = re.search(r"megatron[-_ ]core[^\d]{0,12}(\d+\.\d+[.\w]*)", text, flags=re.IGNORECASE)
    software = f"Megatron-core {version.group(1)}" if version else "Megatron-LM (version not in the log)"
    return Parsed(measurements=out, software=software)
