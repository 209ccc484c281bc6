"""The launch line of a script: launcher (torchrun, deepspeed, srun, python), entry point and program flags;
the cluster it states (nodes, GPUs per node, world size) and paraplan's own export header.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from paraplan.errors import InputError
from paraplan.files import shown
from paraplan.job_files.imported import Facts
from paraplan.job_files.shell import Script, Word

FlagValues = dict[str, tuple[str | bool | list[str], int | None]]
_LAUNCHERS = {"torchrun", "deepspeed", "srun", "mpirun", "python", "python3", "accelerate", "exec", "env", "uv"}
_NO_VALUE = {"--standalone", "--no-python", "--no_python", "--no-local-rank", "--no_local_rank", "-u", "--exclusive",
             "--no_ssh_check", "--force_multi"}
# "Written by paraplan 0.1.0 from plan rank 1: llama-3.1-8b on h100-sxmx16 (16 x h100-sxm: 2 node(s) x 8)."
_HEADER = re.compile(r"Written by paraplan \S+ from plan rank \d+: (?P<model>\S+) on \S+ \((?P<gpus>\d+) x "
                     r"(?P<gpu>[^:]+): (?P<nodes>\d+) node\(s\) x (?P<per>\d+)\)")

# "seq 4096, global batch 64 sequences (2 micro-batches per step), bf16, deepspeed, ..."
_HEADER_JOB = re.compile(r"^seq (\d+), global batch \d+ sequences")


@dataclass(frozen=True, slots=True)
class Launch:
    """One command that starts training."""

    launcher: FlagValues
    """Options before the entry point (torchrun's, deepspeed's, srun's), by name with dashes as underscores."""
    launcher_name: str
    entry: Word
    """The training script or module."""
    program: list[Word]
    """Every word after the entry point."""


def find_launch(script: Script, is_entry: Callable[[str], bool]) -> Launch | None:
    """The last command holding an entry point ``is_entry`` accepts (a script may test-run first)."""
    for words in reversed(script.commands):
        for index, word in enumerate(words):
            if is_entry(word.text):
                before = words[:index]
                launcher = next((w.text.rsplit("/", 1)[-1] for w in before if w.text.rsplit("/", 1)[-1] in _LAUNCHERS
                                 and w.text not in ("exec", "env")), "python")
                if index >= 1 and words[index - 1].text == "-m" and launcher.startswith("python"):
                    launcher = "torchrun"
                return Launch(launcher=flag_values(before), launcher_name=launcher, entry=word,
                              program=words[index + 1:])
    return None


def flag_values(words: list[Word]) -> FlagValues:
    """``--name value``, ``--name=value``, ``--name v1 v2`` and bare ``--name`` flags, names with underscores."""
    split = [Word(part, w.line) for w in words for part in (w.text.split() if w.text.startswith("-") else [w.text])]
    values: FlagValues = {}
    i = 0
    while i < len(split):
        word = split[i]
        i += 1
        if not word.text.startswith("-") or _is_number(word.text):
            continue
        name, eq, value = word.text.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if eq:
            values[name] = (value, word.line)
            continue
        taken: list[str] = []
        while word.text not in _NO_VALUE and i < len(split) and (
                not split[i].text.startswith("-") or _is_number(split[i].text)):
            taken.append(split[i].text)
            i += 1
        values[name] = (True if not taken else taken[0] if len(taken) == 1 else taken, word.line)
    return values


def _is_number(text: str) -> bool:
    return re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", text) is not None


# Where nodes and GPUs per node are stated, most direct first: torchrun's and deepspeed's own options, then
# srun's / #SBATCH's. A task count is a GPU count only where each task is one process (srun python ...), so
# it comes last (srun starting one torchrun per node says --ntasks-per-node=1).
_NODES = (("launcher", "nnodes"), ("launcher", "num_nodes"), ("launcher", "nodes"), ("launcher", "N"),
          ("sbatch", "nodes"), ("sbatch", "N"))
_PER_NODE = (("launcher", "nproc_per_node"), ("launcher", "num_gpus"), ("launcher", "gpus_per_node"),
             ("sbatch", "gpus_per_node"), ("launcher", "ntasks_per_node"), ("sbatch", "ntasks_per_node"))


def cluster_facts(launch: Launch | None, script: Script, facts: Facts) -> None:
    """Nodes and GPUs per node from the launcher's options and #SBATCH directives."""
    found = {"launcher": launch.launcher if launch is not None else {},
             "sbatch": flag_values([Word(part, c.line) for c in script.comments if c.text.startswith("SBATCH")
                                    for part in c.text.split()[1:]])}
    for key, places in (("num_nodes", _NODES), ("gpus_per_node", _PER_NODE)):
        for place, name in places:
            if name in found[place] and key not in facts.values:
                _put_count(facts, key, found[place][name], f"#SBATCH --{name}" if place == "sbatch" else name)
    facts.derive_world()


def _put_count(facts: Facts, key: str, value: tuple[str | bool | list[str], int | None], name: str) -> None:
    text, line = value
    text = text[-1] if isinstance(text, list) else str(text)
    text = text.split(":")[-1]  # torchrun's elastic MIN:MAX nodes: the most it runs on
    text = text.removeprefix("gpu:")
    if re.fullmatch(r"[0-9]+", text) and int(text) > 0:
        facts.put(key, int(text), facts.at(line))
    elif not text.startswith("$"):
        raise InputError(f"{facts.at(line)}: {name} {shown(text)} is not a positive number of "
                         f"{'nodes' if key == 'num_nodes' else 'GPUs per node'}")


def header_facts(script: Script, facts: Facts) -> None:
    """Model, GPU and cluster from the header paraplan writes atop every launch file it exports."""
    for comment in script.comments:
        match = _HEADER.search(comment.text)
        if match:
            where = f"{facts.at(comment.line)} (paraplan header)"
            if "model" not in facts.values and "model_spec" not in facts.values:
                facts.put("model", match.group("model"), where)
            facts.put("gpu", match.group("gpu").strip(), where)
            facts.put("num_gpus", int(match.group("gpus")), where)
            facts.put("num_nodes", int(match.group("nodes")), where)
            facts.put("gpus_per_node", int(match.group("per")), where)
        job = _HEADER_JOB.search(comment.text)
        if job:
            facts.put("seq_len", int(job.group(1)), f"{facts.at(comment.line)} (paraplan header)")
