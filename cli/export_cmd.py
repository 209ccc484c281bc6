"""``paraplan export`` and the ``--export`` of ``paraplan plan``: parse, call the exporters (loaded when a command
exports, not at start-up), report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.choices import Engine
from paraplan.errors import InputError
from paraplan.exporters.defaults import DEFAULT_IMAGE, FORMATS

_EXPORT = "Export"
FormatOpt = Annotated[str, typer.Option("--format", "-f", help=f"One of {', '.join(FORMATS)}; for a serving plan "
                                        "vllm, sglang, trtllm, k8s, json or all.",
                                        rich_help_panel=_EXPORT)]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Folder to write into (created if missing).",
                                      rich_help_panel=_EXPORT)]
TitanVersionOpt = Annotated[str, typer.Option(help="torchtitan release line: 0.3 (overrides) or 0.2 (TOML).",
                                              rich_help_panel=_EXPORT)]
TitanModelOpt = Annotated[str | None, typer.Option(
    help="torchtitan model as MODULE:CONFIG (0.3) or NAME:FLAVOR (0.2); default from the preset.",
    rich_help_panel=_EXPORT)]
JobNameOpt = Annotated[str | None, typer.Option(help="SLURM / PyTorchJob name (default: from the model).",
                                                rich_help_panel=_EXPORT)]
ImageOpt = Annotated[str, typer.Option(help="Container image of the PyTorchJob.", rich_help_panel=_EXPORT)]
PlanFileArg = Annotated[Path, typer.Argument(
    help="A plan file from 'paraplan plan --json' or 'paraplan serve --json'.")]


def export(
    plan_file: PlanFileArg,
    fmt: FormatOpt, out: OutOpt,
    rank: Annotated[int | None, typer.Option(help="Which plan of the file, by rank (default: the best).",
                                             rich_help_panel=_EXPORT)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files already in the folder.")] = False,
    torchtitan_version: TitanVersionOpt = "0.3", torchtitan_model: TitanModelOpt = None,
    job_name: JobNameOpt = None, image: ImageOpt = DEFAULT_IMAGE,
) -> None:
    """Write launch configs of one plan: Megatron-LM, DeepSpeed, torchtitan, SLURM, Kubernetes or JSON; of a serving
    plan ('paraplan serve --json'): vLLM, SGLang, TensorRT-LLM, Kubernetes or JSON."""
    from paraplan.exporters.formats import ExportOptions, export_files
    from paraplan.exporters.plan_input import is_serving_document, plan_from_document, read_plan_document, select_plan
    from paraplan.exporters.writer import write_files

    document = read_plan_document(plan_file)
    if is_serving_document(document):  # 'paraplan serve --json': vLLM, SGLang, TensorRT-LLM, k8s, json, all
        from paraplan.exporters.serving import export_serving, serving_plan_index

        index = serving_plan_index(document, rank, str(plan_file))
        report(export_serving(document, index, fmt, out, force))
        return
    plan = plan_from_document(select_plan(document, rank, str(plan_file)))
    options = ExportOptions(torchtitan_version=torchtitan_version, torchtitan_model=torchtitan_model,
                            job_name=job_name, image=image)
    report(write_files(out, export_files(plan, fmt, options), force))


def export_requested(fmt: str | None, out: Path | None) -> bool:
    """Whether --export asks for files; InputError unless --export and -o come together."""
    if fmt is None:
        if out is not None:
            raise InputError("-o/--out goes with --export FORMAT (which launch files to write there)")
        return False
    if out is None:
        raise InputError("--export needs -o/--out DIR, the folder to write the launch files into")
    return True


def check_plan_export(fmt: str | None, out: Path | None, engine: Engine, force: bool) -> None:
    """Before a search: --export and -o come together, the format suits the engine, the folder takes its files."""
    if export_requested(fmt, out):
        from paraplan.exporters.formats import ExportOptions, output_names
        from paraplan.exporters.writer import check_destination

        assert fmt is not None and out is not None  # export_requested is True only when both are given
        check_destination(out, output_names(fmt, engine, ExportOptions()), force)


def export_plan_document(document: dict, fmt: str, out: Path, force: bool) -> None:
    """Export the top plan of a search (its JSON document) with default options."""
    from paraplan.exporters.formats import ExportOptions, export_files
    from paraplan.exporters.plan_input import plan_from_document
    from paraplan.exporters.writer import write_files

    report(write_files(out, export_files(plan_from_document(document), fmt, ExportOptions()), force))


def report(paths: list[Path]) -> None:
    """One line per written file."""
    for path in paths:
        typer.echo(f"wrote {path}")
