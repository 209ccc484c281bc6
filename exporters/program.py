"""The shapes every exporter produces: output files and the program torchrun starts on each node.

An engine exporter (Megatron-LM, DeepSpeed, torchtitan) describes its training program once, as an
entry point and named argument groups; the launchers (a per-node torchrun script, SLURM, a
Kubernetes PyTorchJob) wrap the same Program, so every format runs the same arguments.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from paraplan.choices import Engine


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputFile:
    """One file an export writes."""

    name: str
    """Plain file name inside the output folder (no folders, no leading dot)."""
    text: str
    """Full contents, UTF-8."""
    executable: bool = False
    """Mark it executable (shell scripts)."""


def already_built(file: OutputFile) -> Callable[[], OutputFile]:
    """A builder of a file made beforehand, for the formats' tables of file name -> builder."""
    return lambda: file


@dataclass(frozen=True, slots=True)
class ConfigPath:
    """An argument that names a file of the export (ds_config.json, torchtitan.toml).

    Launchers resolve it: scripts to ``$CONFIG_DIR/<name>``, the PyTorchJob to its ConfigMap mount.
    """

    name: str


ArgValue = str | tuple[str, ...] | ConfigPath | None
Arg = tuple[str, ArgValue]
"""A flag and its value: None for a flag that takes no value, a tuple for one that takes several words."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgGroup:
    """Arguments that belong together, rendered as one bash array."""

    name: str
    """Bash array name, e.g. PARALLEL_ARGS."""
    comment: str
    """One line saying where the values come from."""
    args: tuple[Arg, ...]
    last: bool = False
    """Goes after the caller's extra arguments (a tyro subcommand must end the command line)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """What every node runs under torchrun: an entry point with its arguments and environment."""

    engine: Engine
    """The training engine the program runs."""
    entry: tuple[str, ...]
    """Default entry after torchrun: a script path, or ``-m module``; $TRAIN_SCRIPT replaces it."""
    entry_comment: str
    """One line saying what the entry is."""
    groups: tuple[ArgGroup, ...]
    """Its arguments, group by group."""
    env: tuple[tuple[str, str, str], ...] = ()
    """(name, value, why) exported before torchrun."""
    config_files: tuple[OutputFile, ...] = ()
    """Files its arguments name through ConfigPath."""
    notes: tuple[str, ...] = ()
    """What the plan or model holds that this program does not express."""

    def argv(self, resolve: dict[str, str] | None = None) -> list[str]:
        """The arguments as strings; ConfigPath values become ``resolve[name]`` (default: the bare name)."""
        words: list[str] = []
        for group in sorted(self.groups, key=lambda group: group.last):
            for flag, value in group.args:
                words.append(flag)
                if isinstance(value, ConfigPath):
                    words.append((resolve or {}).get(value.name, value.name))
                elif isinstance(value, tuple):
                    words.extend(value)
                elif value is not None:
                    words.append(value)
        return words


# -- bash rendering ---------------------------------------------------------------------------
def bash_word(value: str | tuple[str, ...] | ConfigPath) -> str:
    """One shell word (several for a tuple): plan values always through shlex.quote; config files under
    $CONFIG_DIR."""
    if isinstance(value, tuple):
        return " ".join(shlex.quote(word) for word in value)
    if isinstance(value, ConfigPath):
        return '"$CONFIG_DIR"/' + shlex.quote(value.name)
    return shlex.quote(value)


def bash_array(group: ArgGroup) -> str:
    """``NAME=(`` one flag (and its value) per line ``)``, with the group's comment above."""
    lines = [comment_block([group.comment]), f"{group.name}=("]
    for flag, value in group.args:
        lines.append(f"  {bash_word(flag)}" + ("" if value is None else f" {bash_word(value)}"))
    lines.append(")")
    return "\n".join(lines)


def bash_entry(program: Program) -> str:
    """``ENTRY`` array: $TRAIN_SCRIPT when set, else the program's default entry point."""
    default = " ".join(bash_word(word) for word in program.entry)
    return (comment_block([program.entry_comment]) + "\n"
            f'if [[ -n "${{TRAIN_SCRIPT:-}}" ]]; then ENTRY=("$TRAIN_SCRIPT"); else ENTRY=({default}); fi')


def bash_env(program: Program) -> str:
    """``export NAME=value`` lines, each with its reason."""
    return "\n".join(f"{comment_block([why])}\nexport {name}={shlex.quote(value)}" for name, value, why in program.env)


def bash_program_words(program: Program) -> str:
    """The expansion that passes ENTRY, the argument groups and the caller's extra arguments ("$@")."""
    def arrays(last: bool) -> list[str]:
        return [f'"${{{group.name}[@]}}"' for group in program.groups if group.last == last]

    return " ".join(['"${ENTRY[@]}"', *arrays(False), '"$@"', *arrays(True)])


def comment_block(lines: list[str]) -> str:
    """Lines as shell comments (a note's newlines stay inside the comment)."""
    return "\n".join("# " + part for line in lines for part in line.splitlines())
