"""``paraplan ingest``, ``profiles list|show``, ``learn`` and ``profile``: parse, call the library, render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer

from paraplan.cli import render
from paraplan.cost_models.learned.provider import COST_MODELS
from paraplan.errors import InputError
from paraplan.measurements.ingest import FORMATS
from paraplan.measurements.store_location import default_store_path

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd
    from rich.console import Console

    from paraplan.measurements.profile_grids import PartName
    from paraplan.measurements.profile_suite import SuiteSession
    from paraplan.measurements.profiler import ProfileSettings
    from paraplan.model_specs.model_spec import ModelSpec

StoreOpt = Annotated[Path | None, typer.Option(
    "--store", help="Profile store (SQLite). Default: $PARAPLAN_STORE or $XDG_DATA_HOME/paraplan/profiles.sqlite.")]
HardwareOpt = Annotated[str | None, typer.Option(help="GPU catalog name (see 'paraplan hardware list').")]
CostModelOpt = Annotated[str, typer.Option(
    "--cost-model", help=f"{', '.join(COST_MODELS)}: auto uses a learned model where 'paraplan learn' saved one "
                         "for the GPU; measured prices GEMMs from the store's measured kernel table of the GPU "
                         "(store: --store, $PARAPLAN_STORE or the default).")]


def store_path(store: Path | None) -> Path:
    """``--store`` or the default."""
    return store if store is not None else default_store_path()


def ingest(
    files: Annotated[list[Path], typer.Argument(help="Profile files (nccl-tests, torch traces, Megatron logs, ...) or "
                                                     "aiconfigurator databases: its wheel, a systems/data folder, one "
                                                     "GPU folder or one parquet table ('ingest aiconfigurator PATH' "
                                                     "reads PATH as one).")],
    kind: Annotated[str, typer.Option(help=f"auto or one of {', '.join(FORMATS)}.")] = "auto",
    hardware: Annotated[str | None, typer.Option(help="GPU catalog name the files were measured on; for an "
                                                      "aiconfigurator database, the GPU whose tables to read.")] = None,
    op: Annotated[str | None, typer.Option("--op", help="aiconfigurator databases: the tables to read, a comma list "
                                                        "of gemm, attention, collective, moe (default: all).")] = None,
    store: StoreOpt = None,
) -> None:
    """Add measurements to the profile store: every PATH checked (single files parsed) first, then all of them in
    one transaction, all or nothing; a file already stored adds nothing."""
    from paraplan.cli import render_profiles
    from paraplan.measurements.ingest import open_path
    from paraplan.measurements.store import ingest_all

    kind, paths = _ingest_spelling(kind, files)
    ops = tuple(part.strip() for part in op.split(",") if part.strip()) if op is not None else None
    target = store_path(store)
    sources = [open_path(path, kind, hardware, ops) for path in paths]
    count = sum(source.num_files for source in sources)
    with render.working(render.make_console(stderr=True), f"ingesting {count:,} files into {target}"):
        results = ingest_all((item for source in sources for item in source.files()), target)
    render_profiles.ingest_results(render.make_console(), results, target)
    notes = render.make_console(stderr=True)
    for note in (note for source in sources for note in source.notes):
        notes.print(f"note: {note}", markup=False, highlight=False)


def _ingest_spelling(kind: str, files: list[Path]) -> tuple[str, list[Path]]:
    """``ingest aiconfigurator PATH...`` is ``ingest --kind aiconfigurator PATH...`` when no file of that name
    exists."""
    if len(files) > 1 and str(files[0]) == "aiconfigurator" and not files[0].exists() and kind in ("auto",
                                                                                                  "aiconfigurator"):
        return "aiconfigurator", files[1:]
    return kind, files


ProfilesJsonOpt = Annotated[Path | None, typer.Option("--json", help="Also write machine-readable JSON to this file "
                                                                     "('-': to standard output, the table to stderr).")]
ProfilesForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing --json file.")]


def profiles_list(store: StoreOpt = None, json_path: ProfilesJsonOpt = None, force: ProfilesForceOpt = False) -> None:
    """What the store holds, per hardware and kind of measurement."""
    render.prepare_json(json_path, force)
    from paraplan.cli import render_profiles
    from paraplan.measurements.store import summarize

    target = store_path(store)
    summary = summarize(target)
    render_profiles.store_summary(render.make_console(), summary, f"profile store {target}")
    if json_path is not None:
        render.write_json(json_path, {"schema_version": 1, "store": str(target),
                                      "measurements": _plain_records(summary)}, force)


def _plain_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A summary frame as JSON-ready rows (numpy integers as ints, missing text as null)."""
    return json.loads(frame.to_json(orient="records"))


def profiles_show(hardware: Annotated[str, typer.Argument(help="GPU catalog name.")], store: StoreOpt = None) -> None:
    """The files and measurements stored for one hardware."""
    from paraplan.cli import render_profiles
    from paraplan.measurements.store import stored_files, summarize

    target = store_path(store)
    summary = summarize(target)
    if hardware not in set(summary["hardware"]):
        have = ", ".join(sorted(set(summary["hardware"]))) or "nothing"
        raise InputError(f"the store {target} has no measurements for {hardware!r} (it has: {have})")
    render_profiles.hardware_detail(render.make_console(), hardware, summary[summary["hardware"] == hardware],
                                    stored_files(target, hardware))


def learn(hardware: HardwareOpt = None, store: StoreOpt = None) -> None:
    """Fit learned cost models from the store and report their held-out error against the analytical model."""
    from paraplan.cli import render_profiles
    from paraplan.cost_models.learned.learn import learn as learn_models

    target = store_path(store)
    with render.working(render.make_console(stderr=True), "fitting and scoring held out"):
        learned = learn_models(target, hardware)
    render_profiles.learn_report(render.make_console(), learned)


# Collective message sizes: 1 KiB to 1 GiB in steps of 4x, the span nccl-tests sweeps by default
# (-b 8 -e 1G in its README) without its smallest, latency-only sizes.
COLLECTIVE_BYTES = tuple(2**p for p in range(10, 31, 2))
DEFAULT_PROFILE = Path("paraplan-profile.json")


def _ints(flag: str, text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise InputError(f"--{flag} expects a comma list of positive integers (e.g. 512,4096), got {text!r}")
    return tuple(sorted({int(part) for part in parts}))


class DeviceDefaults(TypedDict):
    """One device's profiling defaults: the shape flags as their text would be typed, then repeat counts."""

    tokens: str
    tp: str
    seq_len: str
    copy_mib: str
    repeats: int
    warmup: int


# Defaults per device. A GPU runs the shapes of real micro-batches; a CPU runs bf16 GEMMs at about
# 0.37 GFLOP/s (measured on this project's 2-core machine: 64x4096x3584 in 5 s), so its defaults are the
# smallest shapes that still exercise every code path: about a minute in all on that machine.
DEVICE_DEFAULTS: dict[str, DeviceDefaults] = {
    "cuda": {"tokens": "512,2048,8192", "tp": "1,2,4,8", "seq_len": "1024,4096,8192", "copy_mib": "64,1024",
             "repeats": 10, "warmup": 3},
    "cpu": {"tokens": "16", "tp": "8", "seq_len": "256", "copy_mib": "16", "repeats": 3, "warmup": 1},
}


def profile(
    model: Annotated[str, typer.Option(help="Preset or config.json whose layer GEMMs to time (training suite: "
                                            "the widths of its memory-bound ops).")] = "llama-3.1-8b",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="JSON profile to write (then: paraplan ingest). "
                                                                 "Default: paraplan-profile.json.")] = None,
    device: Annotated[str, typer.Option(help="auto (GPU when present), cuda or cpu.")] = "auto",
    tokens: Annotated[str | None, typer.Option(help="GEMM M (tokens per micro-batch), comma list. Default: "
                                                    "512,2048,8192 on a GPU, 16 on CPU.")] = None,
    tp: Annotated[str | None, typer.Option(help="Tensor-parallel degrees splitting N or K, comma list. Default: "
                                                "1,2,4,8 on a GPU, 8 on CPU.")] = None,
    seq_len: Annotated[str | None, typer.Option(help="Attention sequence lengths, comma list. Default: "
                                                     "1024,4096,8192 on a GPU, 256 on CPU.")] = None,
    copy_mib: Annotated[str | None, typer.Option(help="Memory-copy buffer sizes in MiB, comma list. Default: "
                                                      "64,1024 on a GPU, 16 on CPU.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed runs per point (median kept). Default: 10 on a GPU, "
                                                     "3 on CPU; training suite: 5, quick 2.")] = None,
    warmup: Annotated[int | None, typer.Option(help="Untimed runs first. Default: 3 on a GPU, 1 on CPU; training "
                                                    "suite: 2, quick 1.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out.")] = False,
    suite: Annotated[str, typer.Option(help="layers: the GEMMs of --model's layers, attention and copies (the shape "
                                            "flags above); training: the training kernel suite in parts.")] = "layers",
    part: Annotated[str | None, typer.Option(help="Training suite: run only these parts, comma list (gemm, attention, "
                                                  "elementwise, grouped_gemm, optimizer, collectives).")] = None,
    resume: Annotated[Path | None, typer.Option(help="Training suite: continue FILE (created when absent): skip the "
                                                     "parts it has, append the rest, rewriting it after each.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Training suite: tiny grids (always on CPU).")] = False,
    budget_s: Annotated[float | None, typer.Option("--budget-s", help="Training suite: start no part whose estimate "
                                                                      "ends past this many seconds.")] = None,
) -> None:
    """Run GEMM, attention, memory (and, under torchrun, NCCL) microbenchmarks; write a profile to ingest.
    Prints the estimated run time first and its progress as it goes."""
    from paraplan.model_specs.hf_config import load_model

    if device not in ("auto", "cuda", "cpu"):
        raise InputError(f"--device must be auto, cuda or cpu, got {device!r}")
    if suite == "training":
        if any(flag is not None for flag in (tokens, tp, seq_len, copy_mib)):
            raise InputError("--tokens, --tp, --seq-len and --copy-mib go with --suite layers; the training suite's "
                             "grids are fixed (--quick: the tiny ones)")
        target, resuming = _training_target(out, resume, force)
        _profile_training(load_model(model), device, (target, resuming), part, quick, budget_s, (warmup, repeats))
        return
    if suite != "layers":
        raise InputError(f"--suite must be layers or training, got {suite!r}")
    if part is not None or resume is not None or quick or budget_s is not None:
        raise InputError("--part, --resume, --quick and --budget-s go with --suite training")
    target = out or DEFAULT_PROFILE
    render.check_writable(target, force)
    settings = _settings(load_model(model), device, tokens, tp, seq_len, copy_mib, repeats, warmup)
    _profile_layers(settings, target, force)


def _profile_layers(settings: ProfileSettings, out: Path, force: bool) -> None:
    """The layer microbenchmarks: estimate, measure with a progress bar, write."""
    from paraplan.cli import render_profiles
    from paraplan.measurements.profiler import calibration_flops_per_s, estimated_seconds, resolve_device, run_profile

    device_used = resolve_device(settings.device)
    rate = calibration_flops_per_s(device_used, min(settings.gemm_shapes, key=lambda s: s[0] * s[1] * s[2]))
    estimate = estimated_seconds(settings, rate)
    err = render.make_console(stderr=True)
    err.print(f"profiling on {device_used}: {len(settings.gemm_shapes)} GEMM shapes, "
              f"{len(settings.attention_shapes)} attention shapes; estimated run time about "
              f"{render.seconds(estimate)} s (bf16 GEMMs measured at {rate / 1e9:.3g} GFLOP/s)")
    points = len(settings.gemm_shapes) + len(settings.attention_shapes)
    document = _with_progress(err, points, lambda tick: run_profile(settings, tick))
    render.write_json(out, document, force)
    render_profiles.profile_written(render.make_console(), document, out)


def _with_progress(console: Console, points: int, work: Callable[[Callable[[str], None]], Any]) -> Any:
    """``work(tick)`` under a transient progress bar of ``points`` steps; ``tick(label)`` advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("profiling", total=points)
        return work(lambda label: bar.update(task, advance=1, description=label))


def _training_target(out: Path | None, resume: Path | None, force: bool) -> tuple[Path, bool]:
    """(the file the training suite writes, whether to resume it): --resume's, resumed where it exists, else --out's
    (which must be new unless --force: then it is started afresh)."""
    if resume is not None and out is not None and out != resume:
        raise InputError(f"--resume {resume} writes back to {resume}; leave out -o {out} or make it the same file")
    target = resume if resume is not None else out or DEFAULT_PROFILE
    if render.is_stdout(target):
        raise InputError("the training suite rewrites its file after each part; give a file path, not '-'")
    render.check_writable(target, force or resume is not None)
    return target, resume is not None and target.is_file()


def _profile_training(spec: ModelSpec, device: str, output: tuple[Path, bool], part: str | None, quick: bool,
                      budget_s: float | None, runs: tuple[int | None, int | None]) -> None:
    """The training suite: each part's estimate, then the part, then the file rewritten with it (``output``: the
    file and whether to resume it; ``runs``: the --warmup and --repeats given)."""
    import time
    from functools import partial

    from rich.markup import escape

    from paraplan.cli import render_profiles
    from paraplan.measurements import profile_suite as suite
    from paraplan.measurements.profile_grids import part_points

    (target, resuming), wanted = output, suite.check_parts(part) if part is not None else None
    session = suite.start_session(spec, device, quick, *runs)
    document = suite.read_suite_document(target, session) if resuming else suite.new_document(session)
    todo, present = suite.parts_to_run(document, wanted)
    err = render.make_console(stderr=True)
    err.print(_training_header(session, todo, present, target))
    began = time.monotonic()
    for name in todo:
        estimate = suite.estimate(session, name)
        if budget_s is not None and time.monotonic() - began + estimate > budget_s:
            again = ("run the same command again to go on" if name != todo[0] else
                     "give it a larger --budget-s, or run it alone with --part")
            err.print(f"stopping before {name}: its estimate, {render.seconds(estimate)} s, would pass --budget-s "
                      f"{budget_s:g}; {again}")
            break
        err.print(f"{name}: {part_points(name, session.grid)} points, estimated {render.seconds(estimate)} s")
        result = _with_progress(err, part_points(name, session.grid), partial(suite.run_part, session, name))
        for skip in result.skipped:
            points = f"{skip['points']} point{'s' if skip['points'] != 1 else ''}"
            err.print(f"  left out {escape(skip['what'])} ({points}): {escape(skip['reason'])}")
        if result.complete:
            document = suite.with_part(document, result, session.grid, estimate)
            if session.rank == 0:
                render.write_json(target, document, force=True)
    suite.close_session(session)
    if session.rank == 0 and document["parts"]:
        render_profiles.profile_written(render.make_console(), document, target)


def _training_header(session: SuiteSession, todo: list[PartName], present: list[PartName], target: Path) -> str:
    """What the suite will run, where, at which calibrated rates, and in about how long."""
    from rich.markup import escape

    from paraplan.measurements.profile_suite import estimate

    rates = session.rates
    plan = ", ".join(f"{part} ~{render.seconds(estimate(session, part))} s" for part in todo) or "nothing"
    done = f"; already in {escape(str(target))}: {', '.join(present)}" if present else ""
    return (f"training suite on {session.device} ({escape(session.device_name)}, {session.stack}), "
            f"{session.grid.name} grid; bf16 GEMMs at {rates.flops_per_s / 1e12:.3g} TFLOP/s, copies at "
            f"{rates.bytes_per_s / 1e9:.3g} GB/s; to run: {plan}{done}")


def _settings(spec: ModelSpec, device: str, tokens: str | None, tp: str | None, seq_len: str | None,
              copy_mib: str | None, repeats: int | None, warmup: int | None) -> ProfileSettings:
    """The shapes and repeats to profile: the flags given, the device's defaults for the rest."""
    from paraplan.measurements.profiler import ProfileSettings, model_gemm_shapes, resolve_device

    defaults = DEVICE_DEFAULTS[resolve_device(device)]
    tps = _ints("tp", tp or defaults["tp"])
    try:
        return ProfileSettings(
            gemm_shapes=model_gemm_shapes(spec, _ints("tokens", tokens or defaults["tokens"]), tps),
            attention_shapes=tuple((1, spec.num_heads // t, s, spec.head_dim)
                                   for s in _ints("seq-len", seq_len or defaults["seq_len"])
                                   for t in tps if spec.num_heads % t == 0),
            copy_bytes=tuple(m * 2**20 for m in _ints("copy-mib", copy_mib or defaults["copy_mib"])),
            collective_bytes=COLLECTIVE_BYTES, repeats=defaults["repeats"] if repeats is None else repeats,
            warmup=defaults["warmup"] if warmup is None else warmup, device=device)
    except ValueError as exc:
        raise InputError(str(exc)) from None
