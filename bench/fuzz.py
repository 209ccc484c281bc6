"""Fuzz every parser of a file a user hands over: no input may raise anything but a one-line InputError
(at most 300 characters), and none may take more than 5 seconds.

Each parser (tests/fuzz_kit.py: hardware, cluster and topology YAML, bandwidth and routing CSV, plan JSON, every
ingest format, runs file, stack profile, memory runs, the profile store, learned-model metadata, model
config.json) gets ``--per-parser`` inputs (default 10,000): random bytes and text, hostile classics (deep nesting,
billion laughs, recursive aliases, huge numbers) and structure-aware mutations of a valid seed file. Each input is
parsed in-process under a SIGALRM timer; per parser it prints tried / rejected cleanly / accepted / crashed /
bad message / over the limit, then the first crashing inputs' exception types. Exit 1 on any crash, bad message
or hang.

    .venv/bin/python bench/fuzz.py                        # every parser, 10,000 inputs each
    .venv/bin/python bench/fuzz.py --per-parser 500 --parsers plan-json,topology-yaml --seed 3
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_kit import PARSERS, Parser, make_input, message_problem, write_input

from paraplan.errors import InputError

LIMIT_S = 5.0
"""Per-input wall-clock limit: every valid input of these sizes parses in milliseconds; 5 s is a hang."""


class Hang(Exception):
    """Raised by the SIGALRM handler when an input runs past LIMIT_S."""


def _alarm(signum, frame):
    raise Hang


def run_parser(parser: Parser, count: int, seed: int, folder: Path, show: int) -> dict:
    """Feed ``count`` inputs to ``parser``; the tally and the first ``show`` failures."""
    rng = random.Random(f"{parser.name}:{seed}")
    tally: Counter = Counter()
    failures: list[str] = []
    slowest, began = 0.0, time.perf_counter()
    for index in range(count):
        data = make_input(parser, rng)
        path = write_input(parser, data, folder, rng)
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            parser.call(path)
            outcome = "accepted"
        except InputError as exc:
            problem = message_problem(exc)
            outcome = "rejected" if problem is None else "bad message"
            if problem:
                failures.append(f"#{index} bad message ({problem}): {str(exc)[:160]!r}")
        except Hang:
            outcome = "over 5 s"
            failures.append(f"#{index} over {LIMIT_S:g} s on {data[:80]!r}")
        except Exception as exc:  # noqa: BLE001 -- what the bench counts
            outcome = "crashed"
            where = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append(f"#{index} {type(exc).__name__} at {Path(where.filename).name}:{where.lineno}: "
                            f"{str(exc)[:100]!r} on {data[:80]!r}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - start)
        tally[outcome] += 1
    return {"tally": tally, "failures": failures[:show], "failures_total": len(failures), "slowest_s": slowest,
            "total_s": time.perf_counter() - began}


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--per-parser", type=int, default=10_000, help="inputs per parser (default 10,000)")
    args.add_argument("--parsers", default="", help=f"comma-separated subset of: {', '.join(PARSERS)}")
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--show", type=int, default=5, help="failures shown per parser")
    options = args.parse_args(argv)
    chosen = [name.strip() for name in options.parsers.split(",") if name.strip()] or list(PARSERS)
    unknown = [name for name in chosen if name not in PARSERS]
    if unknown:
        args.error(f"unknown parser(s) {', '.join(unknown)}")
    signal.signal(signal.SIGALRM, _alarm)
    columns = ("tried", "rejected", "accepted", "crashed", "bad message", "over 5 s")
    print(f"{'parser':<22}" + "".join(f"{c:>12}" for c in columns) + f"{'slowest s':>11}{'total s':>9}")
    bad = 0
    details = []
    with tempfile.TemporaryDirectory(prefix="paraplan-fuzz-") as folder:
        for name in chosen:
            result = run_parser(PARSERS[name], options.per_parser, options.seed, Path(folder), options.show)
            tally = result["tally"]
            row = [options.per_parser, tally["rejected"], tally["accepted"], tally["crashed"], tally["bad message"],
                   tally["over 5 s"]]
            print(f"{name:<22}" + "".join(f"{v:>12,}" for v in row)
                  + f"{result['slowest_s']:>11.2f}{result['total_s']:>9.0f}", flush=True)
            bad += result["failures_total"]
            if result["failures"]:
                types = Counter(f.split(" ")[1] for f in result["failures"])
                details.append((name, result["failures_total"], types, result["failures"]))
    for name, total, _, failures in details:
        print(f"\n{name}: {total} failing input(s); the first {len(failures)}:")
        for line in failures:
            print(f"  {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
