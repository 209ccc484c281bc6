"""Rich tables for ingest, profiles and learn."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paraplan.cli.render import count, percent
from paraplan.cost_models.learned.learn import LearnedTarget
from paraplan.measurements.store import IngestResult

# Every column folds rather than ends in an ellipsis: the end of a path or a name is what tells rows apart
# (rich truncates the end by default).


def ingest_results(console: Console, results: list[IngestResult], store: Path) -> None:
    """One row per file: format, hardware, rows added."""
    table = Table(title=f"ingested into {escape(str(store))}", box=box.SIMPLE_HEAD)
    for column in ("file", "format", "hardware", "rows added"):
        table.add_column(column, justify="right" if column == "rows added" else "left", overflow="fold")
    for item in results:
        added = "0 (already stored)" if item.already_present else count(item.rows_added)
        table.add_row(escape(item.path), item.kind, item.hardware, added)
    console.print(table)


def store_summary(console: Console, summary: pd.DataFrame, title: str) -> None:
    """Per hardware and kind: rows, distinct ops, files."""
    table = Table(title=escape(title), box=box.SIMPLE_HEAD)
    for column in ("hardware", "kind", "rows", "ops", "files"):
        table.add_column(column, justify="left" if column in ("hardware", "kind") else "right", overflow="fold")
    for row in summary.itertuples():
        table.add_row(row.hardware, row.kind, count(row.rows), str(row.names), str(row.files))
    console.print(table if len(summary) else f"{escape(title)}: empty")


def hardware_detail(console: Console, hardware: str, summary: pd.DataFrame, files: pd.DataFrame) -> None:
    """The kinds and the files stored for one hardware, with software versions and hashes."""
    store_summary(console, summary, f"measurements on {hardware}")
    table = Table(title=f"files measured on {hardware}", box=box.SIMPLE_HEAD)
    for column in ("file", "format", "rows", "sha256", "software"):
        table.add_column(column, justify="right" if column == "rows" else "left", overflow="fold")
    for row in files.itertuples():
        table.add_row(escape(row.path), row.kind, count(row.num_rows), row.sha256[:12], escape(row.software))
    console.print(table)


def learn_report(console: Console, learned: dict[str, list[LearnedTarget]]) -> None:
    """Held-out error of each learned model next to the analytical model's on the same rows."""
    table = Table(title="held-out error: learned vs analytical (same rows)", box=box.SIMPLE_HEAD)
    for column in ("hardware", "model", "held out", "rows", "learned MAPE %", "learned worst %",
                   "analytical MAPE %", "analytical worst %"):
        table.add_column(column, justify="left" if column in ("hardware", "model", "held out") else "right",
                         overflow="fold")
    for hardware, targets in learned.items():
        for target in targets:
            for score in target.scores:
                label = target.meta.target if score.group == "all" else f"  {score.group}"
                split = score.split if score.group == "all" else ""
                table.add_row(hardware, escape(label), split, count(score.num_rows),
                              percent(score.learned_mape_frac), percent(score.learned_worst_frac),
                              percent(score.analytical_mape_frac), percent(score.analytical_worst_frac))
    console.print(table)
    paths = [str(t.path.parent) for targets in learned.values() for t in targets]
    console.print(f"saved to {escape(', '.join(dict.fromkeys(paths)))}")


def profile_written(console: Console, document: dict, out: Path) -> None:
    """What a profile run measured and where it went."""
    kinds: dict[str, int] = {}
    for row in document["measurements"]:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    counted = ", ".join(f"{n} {kind}" for kind, n in kinds.items()) or "nothing"
    console.print(f"{escape(str(document['device_name']))} ({document['hardware'] or 'not in the catalog'}): "
                  f"{counted} measurements -> {escape(str(out))}")
    console.print(f"software: {escape(document['software'])}")
    console.print(f"next: paraplan ingest {escape(str(out))}")
