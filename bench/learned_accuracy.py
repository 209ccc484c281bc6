"""Held-out accuracy of the learned cost models on the real vidur profiles, against the analytical model.

Ingests every vidur CSV (H100 and A100) into a throw-away store, then for each GPU scores the
learned GEMM model leave-one-model-out and the learned collective models on held-out sizes, with
paraplan's analytical model on exactly the same rows. Prints a Markdown table (for the README).
Run: python bench/learned_accuracy.py [../shared/data/vidur-profiles]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from paraplan.cost_models.learned.evaluate import Score, evaluate_collective, evaluate_gemm
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.store import ingest_parsed, load_measurements

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur-profiles"
HARDWARE = ("h100-sxm", "a100-sxm-80gb")


def _row(score: Score, label: str) -> str:
    return (f"| {score.hardware} | {label} | {score.split if score.group == 'all' else ''} | {score.num_rows:,} | "
            f"{100 * score.learned_mape_frac:.1f} | {100 * score.learned_worst_frac:.0f} | "
            f"{100 * score.analytical_mape_frac:.1f} | {100 * score.analytical_worst_frac:.0f} |")


def main(folder: Path) -> None:
    """Print the held-out table for the profiles under ``folder``."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "vidur.sqlite"
        for path in sorted(folder.rglob("*.csv")):
            ingest_parsed(parse_file(path), store)
        print("| GPU | model | held out | rows | learned MAPE % | learned worst % | analytical MAPE % |"
              " analytical worst % |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for hardware in HARDWARE:
            gemms = load_measurements(store, hardware, "gemm")
            for score in evaluate_gemm(gemms, hardware, "fp16"):
                print(_row(score, "GEMM (all models)" if score.group == "all" else f"GEMM, {score.group}"))
            print(_row(evaluate_gemm(gemms, hardware, "fp16", unseen_shapes_only=True)[0], "GEMM, unseen shapes"))
            collectives = load_measurements(store, hardware, "collective")
            for name in ("all_reduce", "send_recv"):
                frame = collectives[collectives["name"] == name].reset_index(drop=True)
                for score in evaluate_collective(frame, hardware, name):
                    print(_row(score, name))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
