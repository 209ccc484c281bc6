"""The ``paraplan`` command line. Each command parses its flags, calls the library, renders.

Bad input anywhere (an :class:`InputError`) becomes one ``error: ...`` line on stderr and exit
code 2; any other exception is a bug and propagates (exit code 1).
"""

import dataclasses
import difflib
import functools
import importlib
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from paraplan.cli import catalog_json, profile_cmd, render
from paraplan.cli.allocator import keep_freed_memory
from paraplan.cli.train_flags import ForceOpt, HardwareFileOpt, JsonOpt, ModelArg, flag_of
from paraplan.errors import INTERNAL_ERROR_EXIT_CODE, REPORT_REQUEST, InputError, InternalError, ParameterError
from paraplan.hardware_profiles.device_names import looks_like_device_name
from paraplan.hardware_profiles.user_file import resolve_catalog
from paraplan.model_specs.hf_config import load_model, preset_names
from paraplan.version import __version__

if TYPE_CHECKING:
    import pandas as pd  # for annotations only: pandas loads with the validate command, not at start-up

    from paraplan.validation.reference import Prediction

# The commands built only when they run (or help lists them), in help's order, before those defined below: a command
# then loads its own module and typer builds its parameters alone, not every command's at each start-up.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "export": ("paraplan.cli.export_cmd", "export"), "report": ("paraplan.cli.report_cmd", "report"),
    "sweep": ("paraplan.cli.sweep_cmd", "sweep"), "serve": ("paraplan.cli.serve_cmd", "serve"),
    "experts": ("paraplan.cli.place_cmd", "experts"), "place": ("paraplan.cli.place_cmd", "place"),
    "plan": ("paraplan.cli.train_cmd", "plan"), "evaluate": ("paraplan.cli.train_cmd", "evaluate"),
    "ingest": ("paraplan.cli.profile_cmd", "ingest"), "calibrate": ("paraplan.cli.calibrate_cmd", "calibrate"),
    "learn": ("paraplan.cli.profile_cmd", "learn"), "profile": ("paraplan.cli.profile_cmd", "profile"),
}


class _Commands(TyperGroup):
    """paraplan's command group: LAZY_COMMANDS join it as they are looked up."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*LAZY_COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            self.add_command(_lazy_command(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in LAZY_COMMANDS and args[0] not in self.commands:
            for name in LAZY_COMMANDS:  # an unknown name: typer suggests the close ones among the commands it holds
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


def _lazy_command(name: str) -> Any:
    """The typer command of LAZY_COMMANDS[name], built from its module."""
    module, function = LAZY_COMMANDS[name]
    single = typer.Typer(add_completion=False)
    single.command(name)(user_errors(getattr(importlib.import_module(module), function)))
    return typer.main.get_command(single)


app = typer.Typer(cls=_Commands, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Plan distributed training of transformers: search parallel layouts, predict step time, "
                       "MFU and memory.")
models_app = typer.Typer(no_args_is_help=True, help="Model presets: list them or show one in detail.")
hardware_app = typer.Typer(no_args_is_help=True, help="GPU and cluster catalog: list it or show one entry.")
app.add_typer(models_app, name="models")
app.add_typer(hardware_app, name="hardware")
profiles_app = typer.Typer(no_args_is_help=True, help="The profile store: what it holds per hardware.")
app.add_typer(profiles_app, name="profiles")


def _print_version(requested: bool) -> None:
    if requested:
        typer.echo(f"paraplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print paraplan's version and exit.")] = False) -> None:
    """Plan distributed training of transformers: search parallel layouts, predict step time, MFU and memory."""
    render.route_human_output(None)  # each command says where its own output goes

# -- parsing helpers --------------------------------------------------------------------------
def user_errors(command: Callable) -> Callable:
    """InputError: one ``error:`` line on stderr and exit code 2. Any other exception is a defect in paraplan:
    its traceback, then one ``internal error`` line asking for a report, and exit code 70 (EX_SOFTWARE), so
    neither the user nor a script takes a bug for a mistake in the command."""
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            text = str(InputError(exc.spelled(flag_of))) if isinstance(exc, ParameterError) else str(exc)
            typer.echo(f"error: {' '.join(text.split())}", err=True)
            raise typer.Exit(2) from None
        except InternalError as exc:
            typer.echo(f"internal error (a paraplan defect, not your input): {' '.join(str(exc).split())}; "
                       f"{REPORT_REQUEST}", err=True)
            raise typer.Exit(INTERNAL_ERROR_EXIT_CODE) from None
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place every other defect is reported as one
            typer.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
            what = " ".join(f"{type(exc).__name__}: {exc}".split())
            typer.echo(f"internal error (a paraplan defect, not your input): {what}; {REPORT_REQUEST}", err=True)
            raise typer.Exit(INTERNAL_ERROR_EXIT_CODE) from None
    return wrapper


# -- commands ---------------------------------------------------------------------------------
profiles_app.command("list")(user_errors(profile_cmd.profiles_list))
profiles_app.command("show")(user_errors(profile_cmd.profiles_show))


@models_app.command("list")
@user_errors
def models_list(json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every shipped model preset."""
    render.prepare_json(json_path, force)
    models = [load_model(name) for name in preset_names()]
    render.model_list(render.make_console(), models)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION,
                                      "models": [catalog_json.model_document(m) for m in models]}, force)


@models_app.command("types")
@user_errors
def models_types(json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every Hugging Face model_type a config.json may have, and the known ones refused with their reason."""
    from paraplan.model_specs.hf_config import supported_model_types
    from paraplan.model_specs.model_families import REFUSED, TEXT_CONFIG_WRAPPERS

    render.prepare_json(json_path, force)
    decoders = [t for t in supported_model_types() if t not in TEXT_CONFIG_WRAPPERS]
    render.model_types(render.make_console(), decoders, TEXT_CONFIG_WRAPPERS, REFUSED)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION, "read": decoders,
                                      "text_config_wrappers": TEXT_CONFIG_WRAPPERS, "refused": REFUSED}, force)


@models_app.command("show")
@user_errors
def models_show(model: ModelArg,
                seq_len: Annotated[int, typer.Option(help="Sequence length for FLOPs per token.")] = 4096,
                json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Shape, exact parameter counts and FLOPs per token of one model."""
    if seq_len < 1:
        raise InputError(f"--seq-len expects a positive integer, got {seq_len}")
    render.prepare_json(json_path, force)
    spec = load_model(model)
    render.model_detail(render.make_console(), spec, seq_len)
    if json_path is not None:
        render.write_json(json_path, {"schema_version": catalog_json.SCHEMA_VERSION,
                                      "model": catalog_json.model_document(spec, seq_len)}, force)


@hardware_app.command("list")
@user_errors
def hardware_list(hardware: HardwareFileOpt = None, json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every GPU and cluster type: the built-in catalog and your hardware file's entries."""
    render.prepare_json(json_path, force)
    catalog = resolve_catalog(hardware)
    gpus = [catalog.gpus[name] for name in sorted(catalog.gpus)]
    clusters = [catalog.cluster(name, num_nodes=1) for name in sorted(catalog.clusters)]
    render.hardware_lists(render.make_console(), gpus, clusters, catalog.cluster_origins)
    if json_path is not None:
        render.write_json(json_path, {
            "schema_version": catalog_json.SCHEMA_VERSION, "gpus": [catalog_json.gpu_document(g) for g in gpus],
            "clusters": [catalog_json.cluster_document(c, catalog.cluster_origins[c.name]) for c in clusters]}, force)


@hardware_app.command("show")
@user_errors
def hardware_show(name: Annotated[str, typer.Argument(help="A GPU or cluster name from 'hardware list'.")],
                  hardware: HardwareFileOpt = None, json_path: JsonOpt = None, force: ForceOpt = False) -> None:
    """Every number of one GPU or cluster type, with its source."""
    render.prepare_json(json_path, force)
    console, catalog = render.make_console(), resolve_catalog(hardware)
    document: dict[str, Any] = {"schema_version": catalog_json.SCHEMA_VERSION}
    if name in catalog.gpus or (name not in catalog.clusters and looks_like_device_name(name)):
        gpu = catalog.gpu(name)  # a driver's product name resolves (or is refused) here
        render.gpu_detail(console, gpu)
        document["gpu"] = catalog_json.gpu_document(gpu)
    elif name in catalog.clusters:
        cluster = catalog.cluster(name, num_nodes=1)
        render.cluster_detail(console, cluster, catalog.cluster_origins[name])
        document["cluster"] = catalog_json.cluster_document(cluster, catalog.cluster_origins[name])
    else:
        known = sorted(catalog.gpus) + sorted(catalog.clusters)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise InputError(f"unknown GPU or cluster {name!r}{hint} (known: {', '.join(known)})")
    if json_path is not None:
        render.write_json(json_path, document, force)


@app.command()
@user_errors
def validate(json_path: JsonOpt = None, force: ForceOpt = False,
             memory_runs: Annotated[Path | None, typer.Option(
                 "--memory-runs", help="Measured memory runs (memory_runs.csv); default $PARAPLAN_MEMORY_RUNS or "
                 "../shared/calibration/memory_runs.csv. The memory section is skipped when none is found.")] = None,
             cross_source: Annotated[bool, typer.Option(
                 "--cross-source", help="Also refit the efficiency fractions with each source (and each table of "
                 "one) left out and predict it with constants it did not influence: in-sample beside left-out "
                 "error per source (about a minute more).")] = False,
             serving: Annotated[bool, typer.Option(
                 "--serving", help="Validate the serving cost model instead: predict TTFT and TPOT of the 5,221 "
                 "measured serving deployments (NVIDIA aiconfigurator's sample, shipped with paraplan) and report "
                 "per engine, GPU and mode.")] = False,
             serving_data: Annotated[Path | None, typer.Option(
                 "--serving-data", help="Read another folder in the shipped layout (serving_runs.csv.gz, "
                 "serving_runs.csv or aiconfigurator_silicon_sample.csv, and model_configs/); default "
                 "$PARAPLAN_SERVING_DATA, else the data shipped with paraplan.")] = None,
             kernel_tables: Annotated[Path | None, typer.Option(
                 "--kernel-tables", help="Also price every 16-bit reference run (and paraplan's H100 probe) whose "
                 "GPU has a measured GEMM table in this profile store with --cost-model measured, and report each "
                 "source's error with the tables beside without.")] = None,
             ) -> None:
    """Predict every published reference run and report the error against its measurement."""
    from paraplan.validation.reference import load_reference_runs, predict_all, summarize  # pandas: this command only

    render.prepare_json(json_path, force)
    if kernel_tables is not None and not kernel_tables.is_file():  # before a minute of predictions, not after
        raise InputError(f"--kernel-tables: no profile store at {kernel_tables}; ingest kernel tables first "
                         "('paraplan ingest aiconfigurator WHEEL --op gemm --store PATH')")
    if serving:
        _serving_validation(json_path, force, serving_data, kernel_tables)
        return
    memory = _memory_validation(memory_runs)
    frame = load_reference_runs()
    with render.working(render.make_console(stderr=True), f"predicting {len(frame)} reference runs"):
        predictions = predict_all(frame)
    held_out = _cross_source_validation(frame) if cross_source else None
    rows = [{"id": p.run_id, "source": p.source, "model": row["model"], "gpu": row["gpu"],
             "num_gpus": int(row["num_gpus"]), "measured_tokens_per_s_per_gpu": p.measured_tokens_per_s_per_gpu,
             "predicted_tokens_per_s_per_gpu": _finite(p.predicted_tokens_per_s_per_gpu),
             "error_frac": _finite(p.error_frac), "chosen": p.chosen}
            for p, (_, row) in zip(predictions, frame.iterrows())]
    groups = dict.fromkeys(p.group for p in predictions)
    summaries = {g: summarize([p for p in predictions if p.group == g]) for g in groups}
    summaries["all sources"] = summarize(predictions)
    render.validation(render.make_console(), rows, summaries)
    if memory is not None:
        render.memory_validation(render.make_console(), memory)
    if held_out is not None:
        render.cross_source_validation(render.make_console(), held_out)
    tables = _kernel_table_validation(kernel_tables, predictions) if kernel_tables is not None else None
    if json_path is not None:
        clean = {s: {k: _finite(v) for k, v in summary.items()} for s, summary in summaries.items()}
        render.write_json(json_path, {"schema_version": 1, "runs": rows, "summary": clean,
                                      "memory": memory, "cross_source": held_out, "kernel_tables": tables}, force)


def _kernel_table_validation(store: Path, predictions: list["Prediction"]) -> dict[str, Any]:
    """``validate --kernel-tables STORE``: each source's error with the store's measured tables and without."""
    from paraplan.validation import kernel_tables as kt  # the store's readers: only this flag

    with render.working(render.make_console(stderr=True), "pricing the runs with the measured kernel tables"):
        rows = kt.reference_rows(store, {p.run_id: p for p in predictions}) + kt.probe_rows(store)
    summary = kt.summarize(rows)
    render.kernel_table_validation(render.make_console(), summary, str(store))
    return {"store": str(store), "runs": [{k: _finite(v) if isinstance(v, float) else v
                                           for k, v in dataclasses.asdict(r).items()} for r in rows],
            "summary": {s: {k: _finite(v) for k, v in values.items()} for s, values in summary.items()}}


def _serving_validation(json_path: Path | None, force: bool, folder: Path | None, store: Path | None) -> None:
    """``validate --serving``: the serving accuracy table (and its JSON); with ``--kernel-tables STORE`` also the
    same rows priced with the store's serving-engine tables beside without."""
    from paraplan.cli.render_serving import serving_validation
    from paraplan.validation.serving_runs import validate_serving, validation_document

    with render.working(render.make_console(stderr=True), "predicting the measured serving deployments"):
        document = validation_document(validate_serving(folder))
    serving_validation(render.make_console(), document)
    if store is not None:
        from paraplan.validation.kernel_tables import serving_comparison  # the store's readers: only this flag

        with render.working(render.make_console(stderr=True), "pricing the deployments with the kernel tables"):
            document["kernel_tables"] = serving_comparison(store, folder)
        _render_serving_tables(document["kernel_tables"])
    if json_path is not None:
        render.write_json(json_path, {k: _finite_tree(v) for k, v in document.items()}, force)


def _finite_tree(value: Any) -> Any:
    """``value`` with every non-finite float as null (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_tree(v) for v in value]
    return _finite(value) if isinstance(value, float) else value


def _render_serving_tables(comparison: dict[str, Any]) -> None:
    """The serving rows' median |error| analytical beside priced with kernel tables, and what priced them."""
    from rich.table import Table

    console = render.make_console()
    table = Table(title=f"serving with kernel tables ({comparison['store']}) and without: median |error| %, in "
                  "sample/each model left out; tab %: median share of a decode (prefill) step the tables priced")
    for column in ("split", "value", "rows", "TPOT roofline", "TPOT tables", "TTFT roofline", "TTFT tables",
                   "tab % dec", "tab % pre"):
        table.add_column(column, justify="left" if column in ("split", "value") else "right")
    for g in comparison["groups"]:
        table.add_row(g["split"], g["value"], str(g["rows"]),
                      f"{render.percent(g['tpot_analytical'])}/{render.percent(g['tpot_analytical_model_out'])}",
                      f"{render.percent(g['tpot_tables'])}/{render.percent(g['tpot_tables_model_out'])}",
                      f"{render.percent(g['ttft_analytical'])}/{render.percent(g['ttft_analytical_model_out'])}",
                      f"{render.percent(g['ttft_tables'])}/{render.percent(g['ttft_tables_model_out'])}",
                      render.percent(g["decode_table_frac"]), render.percent(g["prefill_table_frac"]))
    console.print(table)
    console.print(f"{len(comparison['tables'])} sets of tables priced the rows (engine, version, kernel and rows of "
                  "each term: kernel_tables.tables in --json)")


def _cross_source_validation(frame: "pd.DataFrame") -> dict[str, Any]:
    """Leave-one-source-out (and leave-one-table-out) refits of the fitted fractions, as plain data."""
    from paraplan.validation import cross_source as cs  # only this flag pays for the refits

    console = render.make_console(stderr=True)
    with render.working(console, "cross-source refits: predicting the dense rows on a grid of constants") as status:
        def progress(done: int, total: int) -> None:
            if status is not None:
                status.update(f"cross-source refits: row {done} of {total} on a grid of constants")
        result = cs.cross_source(frame, progress)
    folds = [{"level": f.level, "left_out": f.name, "label": cs.short_label(f.level, f.name), "rows": f.rows,
              "in_sample": cs.summary(f.in_sample_errors),
              "left_out_error": cs.summary(f.left_out_errors),
              "moved": [{"constant": label, "shipped": shipped, "fold": fold} for label, shipped, fold in f.moved]}
             for f in result.folds]
    refit = [{"constant": c.label, "shipped": cs.shipped_value(c), "refit_on_all_rows": value}
             for c, value in sorted(result.all_rows_refit.items())]
    return {"rows": len(result.row_ids), "in_sample": cs.summary(result.in_sample_errors),
            "in_sample_refit": cs.summary(result.refit_errors),
            "left_out": {level: cs.summary(errors) for level, errors in result.left_out_errors.items()},
            "folds": folds, "refit_on_all_rows": refit,
            "method": "efficiency fractions refitted without the left-out rows (validation/cross_source.py); "
                      "in-sample = the shipped efficiency.yaml constants"}


def _memory_validation(path: Path | None) -> dict | None:
    """Measured memory rows beside their predictions, per-source summaries and the fit/OOM confusion
    table; None (with a note on stderr) when no measurements file is found and none was named."""
    from paraplan.validation.memory_runs import confusion, load_memory_runs, predict_memory_all, summarize_memory

    try:
        frame = load_memory_runs(path)
    except InputError:
        if path is not None:
            raise
        render.make_console(stderr=True).print("memory: no memory_runs.csv found (--memory-runs PATH); skipped")
        return None
    predictions = predict_memory_all(frame)
    rows = [{"id": p.run_id, "source": p.source, "metric": p.metric,
             "measured_bytes": _finite(p.measured_bytes), "predicted_bytes": _finite(p.predicted_bytes),
             "error_frac": _finite(p.error_frac) if p.metric not in ("fits", "oom") else None,
             "predicted_fits": p.predicted_fits, "out_of_scope": p.out_of_scope} for p in predictions]
    return {"runs": rows, "summary": summarize_memory(predictions), "fit_oom": confusion(predictions)}


def _finite(value: float) -> float | None:
    """JSON has no NaN: an infeasible prediction is null."""
    return value if math.isfinite(value) else None


def main() -> None:
    """Console-script entry point."""
    keep_freed_memory()
    app()
