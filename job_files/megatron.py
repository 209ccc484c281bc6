"""Megatron-LM job files: a launch script (``torchrun ... pretrain_gpt.py --tensor-model-parallel-size 8 ...``)
and a training log's arguments block, which ``megatron/training/arguments.py`` _print_args writes as
``  tensor_model_parallel_size ...................... 8`` between ``---- arguments ----`` and
``---- end of arguments ----``.
"""

from __future__ import annotations

import re
from pathlib import Path

from paraplan.errors import InputError
from paraplan.job_files.imported import Facts, ImportedJob
from paraplan.job_files.launch import FlagValues, cluster_facts, find_launch, flag_values, header_facts
from paraplan.job_files.megatron_args import read_megatron
from paraplan.job_files.megatron_values import Args
from paraplan.job_files.shell import read_script

ENTRY = re.compile(r"(^|/)(pretrain_\w+|train_\w+|pretrain)\.py$")
"""Megatron-LM's training entry points: pretrain_gpt.py, pretrain_mamba.py, examples' train_*.py."""
ARGUMENTS_START = re.compile(r"-{3,} arguments -{3,}")
ARGUMENTS_END = re.compile(r"-{3,} end of arguments -{3,}")
ARGUMENT_LINE = re.compile(r"(?:^|\s)([a-z_][a-z0-9_]*) \.{2,}(?: (.*))?$")


def is_megatron_script(text: str) -> bool:
    """A script that runs a Megatron training entry point with Megatron's parallel flags."""
    return bool(re.search(r"pretrain_\w+\.py|--tensor-model-parallel-size|--num-layers", text)) and \
        "--deepspeed" not in text and "deepspeed " not in text


def read_megatron_script(path: Path, text: str) -> ImportedJob:
    """The job a Megatron-LM launch script starts."""
    script = read_script(text, str(path))
    facts = Facts(str(path), "megatron-script", "megatron")
    launch = find_launch(script, lambda word: bool(ENTRY.search(word)))
    if launch is None:
        raise InputError(f"{path}: no command runs a Megatron-LM training script (torchrun ... pretrain_gpt.py "
                         "--tensor-model-parallel-size ...); is this the launch script?")
    cluster_facts(launch, script, facts)
    read_megatron(Args(flag_values(launch.program), facts, dashed=True), f"{path.name} model")
    header_facts(script, facts)
    for note in script.notes:
        facts.note(note)
    return facts.build()


def is_megatron_log(text: str) -> bool:
    """Whether ``text`` is a Megatron-LM training log (it prints an arguments block at start-up)."""
    return bool(ARGUMENTS_START.search(text)) and "tensor_model_parallel_size" in text


def read_megatron_log(path: Path, text: str) -> ImportedJob:
    """The job of the first arguments block in a Megatron-LM log."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if ARGUMENTS_START.search(line)), None)
    if start is None:
        raise InputError(f"{path}: no '---- arguments ----' block; Megatron prints it at start-up on rank 0")
    values: FlagValues = {}
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if ARGUMENTS_END.search(line):
            break
        match = ARGUMENT_LINE.search(line.rstrip())
        if match:
            values[match.group(1)] = ((match.group(2) or "").strip(), number)
    else:
        raise InputError(f"{path}:{start + 1}: the arguments block has no '---- end of arguments ----' line; is the "
                         "log cut short?")
    facts = Facts(str(path), "megatron-log", "megatron")
    read_megatron(Args(values, facts, dashed=False), f"{path.name} model")
    return facts.build()
