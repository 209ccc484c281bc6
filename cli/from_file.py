"""``--from FILE`` and ``--config job.yaml`` for ``plan`` and ``evaluate``: the job a user's launch script, log or
engine config states, under the options given on the command line.

Precedence: a flag typed on the command line, then ``--config``'s keys, then the job file, then the option's
default. ``plan --from`` searches from the file's model, cluster and batch and sets the file's own layout
beside the best plan (a ``from_job`` block in ``--json``).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from paraplan.cli import render
from paraplan.errors import InputError
from paraplan.files import shown

if typing.TYPE_CHECKING:
    from rich.console import Console

    from paraplan.job_files import ImportedJob
    from paraplan.request import FileLayout

META_KEY = "paraplan.from_job"
AXIS_PARAMS = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp", "offload",
               "pp_schedule", "tp_comm_overlap")
_ALIASES = {"json": "json_path", "compile": "compile_model", "from": "from_file", "o": "out"}
SEARCH_ONLY_OPTIONS = ("top", "objective", "place", "export", "out", "report")
"""``plan``'s options that ``evaluate`` has not: a job file may hold them for plan, and evaluate leaves them aside."""
_CLUSTER_PARAMS = ("cluster", "gpu", "gpus", "gpus_per_node", "nodes")
_MAX_YAML_INT = 2**63
"""A YAML integer past int64 sizes nothing (each size has its own, far lower, bound) and overflows numpy."""
_MAX_YAML_LIST = 1_000
"""Values of one axis list: an axis has at most a few dozen useful values."""
_FIXED_DEFAULTS = {"cp": "1", "cp_comm": "p2p", "ep": "1", "etp": "1", "vpp": "1", "mbs": "1", "zero": "0",
                   "recompute": "none", "sp": "off", "offload": "0", "pp_schedule": "1f1b", "tp_comm_overlap": "off"}


def require(**given: Any) -> None:
    """Without --from or --config, MODEL, --seq-len, --global-batch (and evaluate's --tp, --pp) are required."""
    for name, value in given.items():
        if value is None:
            flag = "MODEL" if name == "model" else "--" + name.replace("_", "-")
            raise InputError(f"missing {flag}; give it, or read the job from a file with --from FILE or --config "
                             "job.yaml")


def merged(ctx: typer.Context, command: Any, from_file: Path | None, config_file: Path | None,
           searching: bool) -> dict[str, Any]:
    """The command's keyword arguments after the file(s): call ``command(**merged(...))``."""
    from paraplan.job_files import read_job_file  # only --from / --config pay for the readers
    from paraplan.job_files.config_file import read_option_file
    from paraplan.job_files.merge import fill_global_batch, missing_flag

    params = dict(ctx.params)
    explicit = {name for name in params if _given_by_user(ctx, name)}
    hints = typing.get_type_hints(command)
    known = set(params) - {"config"} | (set() if searching else set(SEARCH_ONLY_OPTIONS))
    options = {} if config_file is None else read_option_file(config_file, known, _ALIASES)
    if not searching:
        _leave_search_options(options)
    options = {name: (_convert(name, value, hints[name], where), where) for name, (value, where) in options.items()}
    job_path = from_file if from_file is not None else options.pop("from_file", (None, ""))[0]
    imported = read_job_file(Path(job_path)) if job_path is not None else None
    from_job = _from_job_values(imported, explicit | set(options), searching)
    values = dict(params)
    for layer in (from_job, options):
        values.update({name: value for name, (value, _) in layer.items() if name not in explicit})
    values.update(from_file=None, config=None)
    if values.get("precision") != "fp8" and "fp8_recipe" in from_job and "fp8_recipe" not in explicit | set(options):
        values["fp8_recipe"] = params["fp8_recipe"]  # the file's fp8 recipe went with the precision overridden
    if imported is not None:
        fill_global_batch(imported, values)
        missing_flag(imported, values)
        ctx.meta[META_KEY] = (imported, {n: values[n] for n in AXIS_PARAMS if n in params})
    required = ("model", "seq_len", "global_batch") + (() if searching else ("tp", "pp"))
    require(**{name: values.get(name) for name in required})
    render.route_human_output(values.get("json_path"))
    if imported is not None:
        show_source(render.make_console(), imported, values, searching)
    return {"ctx": ctx, **values}


def _given_by_user(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave parameter ``name`` on the command line or in its environment variable."""
    source = ctx.get_parameter_source(name)
    assert source is not None  # click records a source for every parameter it put in ctx.params
    return source.name in ("COMMANDLINE", "ENVIRONMENT")


def _leave_search_options(options: dict[str, tuple[Any, str]]) -> None:
    """Drop (in place) the job file's keys only ``plan`` takes, saying so: one file serves both commands."""
    left = [name for name in SEARCH_ONLY_OPTIONS if options.pop(name, None) is not None]
    if left:
        render.make_console(stderr=True).print(f"note: evaluate leaves aside plan's {', '.join(left)} (a search's "
                                               "options) from the --config file")


def _from_job_values(imported: ImportedJob | None, overridden: set[str], searching: bool) -> dict[str, Any]:
    """The file's option values, less the cluster form the command line or --config replaces and, for a
    search, the layout (which the search chooses)."""
    from paraplan.job_files.merge import option_values

    if imported is None:
        return {}
    values = option_values(imported)
    if "cluster" in overridden:
        values = {k: v for k, v in values.items() if k not in ("gpu", "gpus", "gpus_per_node")}
    else:
        values.pop("nodes", None)  # the --gpu form counts GPUs, not nodes
    if overridden & {"cluster", "gpus", "nodes"}:
        values.pop("dp", None)  # another world size: data parallel follows it
    if searching:
        values = {k: v for k, v in values.items() if k not in AXIS_PARAMS}
    return values


def _convert(name: str, value: Any, hint: Any, where: str) -> Any:
    """A YAML value as the option's type (axes as the text their flag takes)."""
    kinds = {t for t in typing.get_args(hint) or (hint,) if t is not type(None)}
    if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) >= _MAX_YAML_INT
           for v in (value if isinstance(value, list) else [value])):
        raise InputError(f"{where}: {name.replace('_', '-')} {shown(value)} is out of range (at most "
                         f"{_MAX_YAML_INT - 1:,})")
    if name in AXIS_PARAMS:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, list):
            return ",".join(str(v) for v in value[:_MAX_YAML_LIST + 1])  # the flag's parser refuses what is cut
        return str(value)
    if int in kinds and isinstance(value, int) and not isinstance(value, bool):
        return value
    if float in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if bool in kinds and isinstance(value, bool):
        return value
    if Path in kinds and isinstance(value, str):
        return Path(value)
    if str in kinds and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    wanted = " or ".join(sorted(getattr(k, "__name__", str(k)) for k in kinds))
    raise InputError(f"{where}: {name.replace('_', '-')} expects {wanted}, got {shown(value)}")


def show_source(console: Console, imported: ImportedJob, values: dict[str, Any], searching: bool) -> None:
    """What was read from the file, where, and what the command line changed (a search leaves the layout open)."""
    from paraplan.job_files.merge import option_values

    table = Table(title=f"read from {imported.path} ({imported.format})", title_justify="left")
    for column in ("value", "from file", "used", "source"):
        table.add_column(column)
    for name, (value, source) in option_values(imported).items():
        used = values.get(name, value)
        if used is None:
            used = "(searched)" if searching and name in AXIS_PARAMS else "(not used)"
        used = getattr(used, "name", used)
        table.add_row(name, escape(str(getattr(value, "name", value))), escape(str(used)), escape(source))
    render.print_table(console, table)
    for note in imported.notes:
        console.print(f"note: {escape(note)}")


def fixed_extras(ctx: typer.Context) -> dict[str, list[bool]]:
    """Axes a job file sets that have no flag of their own: Megatron's --overlap-moe-expert-parallel-comm."""
    entry = ctx.meta.get(META_KEY)
    if entry is None or "ep_overlap" not in entry[0].layout:
        return {}
    return {"ep_overlap": [bool(entry[0].layout["ep_overlap"])]}


def file_layout(ctx: typer.Context) -> FileLayout | None:
    """``plan --from``: the file's own layout (the command line's single values over it), to price beside the best
    plan; None without a job file."""
    from paraplan.cli.train_flags import axis_values
    from paraplan.job_files.merge import option_values
    from paraplan.request import FileLayout, axis_codes

    entry = ctx.meta.get(META_KEY)
    if entry is None:
        return None
    imported, cli_axes = entry
    layout = {**_FIXED_DEFAULTS, **{k: v for k, (v, _) in option_values(imported).items() if k in AXIS_PARAMS}}
    layout.update({k: v for k, v in cli_axes.items() if v is not None and "," not in str(v)})
    layout.pop("dp", None)
    values = axis_values(**{"tp_overlap" if k == "tp_comm_overlap" else k: layout[k] for k in AXIS_PARAMS
                            if k in layout})
    fixed = {axis: axis_codes(axis, value) for axis, value in values.items()}
    fixed.update({axis: axis_codes(axis, value) for axis, value in fixed_extras(ctx).items()})
    return FileLayout(path=imported.path, format=imported.format, sources=dict(imported.sources),
                      notes=tuple(imported.notes), fixed=fixed)


_METRICS = (("step_time_s", "step time s", render.seconds), ("tokens_per_s_per_gpu", "tokens/s/GPU", render.count),
            ("mfu", "MFU %", render.percent), ("peak_memory_bytes", "peak memory GiB", render.gib))


def show_comparison(console: Console, block: dict[str, Any]) -> None:
    """The job file's layout beside the best plan (or why it could not be priced)."""
    if "error" in block:
        console.print(f"your layout ({escape(block['file'])}): {escape(block['error'])}")
        return
    comparison = block["comparison"]
    table = Table(title=f"your layout ({block['file']}) vs the best plan: {comparison['speedup']:.2f}x as fast",
                  title_justify="left")
    for column in ("", "yours", "best #1", "change %"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("layout", render.config_text(_short(comparison["yours_config"])),
                  render.config_text(_short(comparison["best_config"])), "")
    for key, label, fmt in _METRICS:
        row = comparison["metrics"][key]
        change = row["change_frac"]
        table.add_row(label, fmt(row["yours"]), fmt(row["best"]), render.percent(change, signed=True)
                      if change is not None else "")
    fits = comparison["metrics"]["fits"]
    table.add_row("fits", "yes" if fits["yours"] else "no", "yes" if fits["best"] else "no", "")
    render.print_table(console, table)


def _short(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute", "sp")
    return {k: config[k] for k in keys if k in config}
