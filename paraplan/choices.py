"""The closed vocabularies every layer speaks: each choice a ``Literal`` type, its allowed values, and the integer
codes the vectorized candidate table stores for it. Ground floor: nothing here imports the rest of paraplan."""

from __future__ import annotations

from typing import Literal, get_args

Engine = Literal["megatron", "deepspeed", "torchtitan"]
"""A training engine paraplan plans for and exports launch files to."""
ENGINES: tuple[Engine, ...] = get_args(Engine)

ServingEngine = Literal["vllm", "sglang", "trtllm"]
"""A serving engine."""
SERVING_ENGINES: tuple[ServingEngine, ...] = get_args(ServingEngine)

Precision = Literal["bf16", "fp8", "fp4"]
"""The GEMM precision of a training job."""
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

Objective = Literal["throughput", "cost", "memory"]
"""What the training search ranks by."""
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)

ServingObjective = Literal["throughput", "cost", "latency"]
"""What the serving search ranks by."""
SERVING_OBJECTIVES: tuple[ServingObjective, ...] = get_args(ServingObjective)

ServingMode = Literal["agg", "disagg", "both"]
"""Aggregated workers, prefill/decode split, or both searched."""
SERVING_MODES: tuple[ServingMode, ...] = get_args(ServingMode)

Recompute = Literal["none", "selective", "full", "modules"]
"""Activation recomputation."""
RECOMPUTE_CODES: dict[Recompute, int] = {"none": 0, "selective": 1, "full": 2, "modules": 3}
"""none; selective = Megatron's default --recompute-modules core_attn (Korthikanti et al.); full = every
layer; modules = the cheap modules NVIDIA's MoE recipes recompute: layernorm, mla_up_proj, moe_act."""
RECOMPUTE_NAMES: dict[int, Recompute] = {code: name for name, code in RECOMPUTE_CODES.items()}

CpComm = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
"""How context parallelism moves K and V (cost_models/context_parallel.py prices each)."""
CP_COMM_CODES: dict[CpComm, int] = {"p2p": 0, "a2a": 1, "allgather": 2, "a2a+p2p": 3}
"""Context-parallel communication: Megatron's --cp-comm-type names (``allgather`` is TE's all_gather)."""
CP_COMM_NAMES: dict[int, CpComm] = {code: name for name, code in CP_COMM_CODES.items()}
MEGATRON_CP_COMM_TYPES: dict[CpComm, str] = {"p2p": "p2p", "a2a": "a2a", "allgather": "all_gather",
                                             "a2a+p2p": "a2a+p2p"}
"""Each variant as megatron-core's TransformerConfig.cp_comm_type (0.16) spells it: it passes the name to
Transformer Engine, whose all-gather variant is all_gather."""

PipelineSchedule = Literal["1f1b", "dualpipev", "dualpipe"]
"""The pipeline schedule."""
PIPELINE_SCHEDULE_CODES: dict[PipelineSchedule, int] = {"1f1b": 0, "dualpipev": 1, "dualpipe": 2}
"""1f1b = Megatron's 1F1B, interleaved when vpp > 1; dualpipev = the V-shaped cut of DualPipe (two chunks per
rank, rank r holding chunks r and 2·pp − 1 − r; torch.distributed.pipelining's ScheduleDualPipeV); dualpipe =
DeepSeek-V3's bidirectional schedule (rank r holds stages r and pp − 1 − r of two model copies). See
cost_models/schedules.py."""
PIPELINE_SCHEDULE_NAMES: dict[int, PipelineSchedule] = {code: name for name, code in PIPELINE_SCHEDULE_CODES.items()}

NAMED_AXES: dict[str, dict[Recompute, int] | dict[CpComm, int] | dict[PipelineSchedule, int]] = {
    "recompute": RECOMPUTE_CODES, "cp_comm": CP_COMM_CODES, "pp_schedule": PIPELINE_SCHEDULE_CODES}
"""Configuration axes whose values are names, stored as codes in the candidate table."""
SWITCH_AXES = ("sp", "tp_overlap", "ep_overlap")
"""Configuration axes that are on or off (True or False; codes 1 and 0)."""
