"""Fuzz every parser of a file a user hands over: no input may raise anything but a one-line InputError
(at most 300 characters), and none may take more than 5 seconds.

Each parser (tests/fuzz_kit.py: hardware, cluster and topology YAML, bandwidth and routing CSV, plan JSON, every
ingest format (aiconfigurator's parquet tables where pyarrow is installed), runs file, stack profile, memory runs,
the profile store, learned-model metadata, model config.json) gets ``--per-parser`` inputs (default 10,000): random
bytes and text, hostile classics (deep nesting, billion laughs, recursive aliases, huge numbers) and
structure-aware mutations of a valid seed file. Each input is
parsed in-process under a SIGALRM timer; per parser it prints tried / rejected cleanly / accepted / crashed /
bad message / over the limit, then the first crashing inputs' exception types. Exit 1 on any crash, bad message
or hang.

The ``hostile-*`` targets feed generated inputs of the kinds that reach past the parsers (``--parsers hostile``):
job.yaml options, Megatron launch scripts and logs, model and stack-profile names and user hardware files holding
huge, zero, negative or infinite counts, names thousands of characters long, and scripts or logs that are long or
expand without bound; each through the command or reader a user's file takes.

    .venv/bin/python bench/fuzz.py                        # every parser, 10,000 inputs each
    .venv/bin/python bench/fuzz.py --per-parser 40 --parsers hostile
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import yaml
from fuzz_kit import PARSERS, Parser, _catalog_yaml, make_input, message_problem, write_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.hardware_profiles.user_file import load_user_catalog
from paraplan.job_files import read_job_file
from paraplan.model_specs.hf_config import load_model
from paraplan.validation import stack_profile as sp

# -- hostile inputs of the kinds that reach the planner: huge and zero counts, infinities, very long names, long
# scripts and logs, each through the command or reader a user's file takes (``--parsers hostile`` picks them all)
HUGE_VALUES: tuple[object, ...] = (10**400, int("1" + "0" * 1000), 2**63, 2**62, 10**12, 0, -1, float("inf"),
                                   float("-inf"), float("nan"), "x" * 5000, "1," * 3000, list(range(1, 2000)))
JOB_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero", "offload", "recompute", "sp", "seq-len",
            "global-batch", "gpus", "gpus-per-node", "headroom", "model", "gpu", "expert-imbalance")
JOB_YAML = "model: llama-3.1-8b\nseq-len: 4096\nglobal-batch: 8\ngpu: h100-sxm\ngpus: 8\ntp: 1\npp: 1\n"
MEGATRON_ARGS = {"num-layers": "32", "hidden-size": "4096", "num-attention-heads": "32", "seq-length": "4096",
                 "max-position-embeddings": "4096", "micro-batch-size": "1", "global-batch-size": "64",
                 "vocab-size": "32000", "tensor-model-parallel-size": "1", "num-query-groups": "8"}
HOSTILE_ARGS = ("0", "-1", "1" + "0" * 1000, "9" * 30, "1e999", "inf", "nan", "(" * 5000 + "1" + ")" * 5000,
                "m" * 5000, "/d" * 3000, "'([1]*99999999999999)'")
LONG_SCRIPTS = ("A=x\n" + "A=$A$A\n" * 40, "A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40, "echo hi\n" * 200_000,
                "echo " + "${" * 120_000 + "\n", 'A+=("--x 1")\n' * 15_000, "A=$((" + "(" * 100_000 + "))\n")
LONG_NAME = "g" * 64


def _hostile_value(rng: random.Random) -> object:
    return rng.choice(HUGE_VALUES)


def _job_yaml(rng: random.Random) -> bytes:
    """The job.yaml of a valid evaluate with one to three keys set to a huge, zero, infinite or long value."""
    lines = dict(line.split(": ", 1) for line in JOB_YAML.splitlines())
    for key in rng.sample(JOB_KEYS, rng.randint(1, 3)):
        lines[key] = yaml.safe_dump(_hostile_value(rng), default_flow_style=True, width=10**9).strip()
        lines[key] = lines[key].removesuffix("\n...").strip()
    return "".join(f"{k}: {v}\n" for k, v in lines.items()).encode()


def _megatron_script(rng: random.Random) -> bytes:
    """A Megatron launch script with hostile arguments, behind a long or exploding prefix now and then."""
    args = dict(MEGATRON_ARGS)
    for key in rng.sample([*args, "kv-channels", "moe-layer-freq", "tokenizer-model", "load"], rng.randint(1, 3)):
        args[key] = rng.choice(HOSTILE_ARGS)
    if "moe-layer-freq" in args:
        args["num-experts"] = "8"
    prefix = rng.choice(LONG_SCRIPTS) if rng.random() < 0.3 else ""
    words = " ".join(f"--{k} {v}" for k, v in args.items())
    return f"#!/bin/bash\n{prefix}torchrun pretrain_gpt.py {words} --bf16 ${{A[@]}}\n".encode()


def _megatron_log(rng: random.Random) -> bytes:
    """A Megatron log whose arguments block holds hostile counts, with many iteration lines now and then."""
    args = {k.replace("-", "_"): v for k, v in MEGATRON_ARGS.items()}
    args.update(world_size="8", pipeline_model_parallel_size="1", padded_vocab_size="32000")
    for key in rng.sample(sorted(args), rng.randint(1, 3)):
        args[key] = rng.choice(HOSTILE_ARGS)
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * max(1, 48 - len(k))} {v}" for k, v in args.items()]
    lines += ["-------------------- end of arguments ---------------------"]
    steps = rng.choice((3, 3, 100_000))
    lines += [f" iteration {i:8d}/ 100 | elapsed time per iteration (ms): 1000.0 |" for i in range(1, steps)]
    return ("\n".join(lines) + "\n").encode()


def _long_name(rng: random.Random) -> bytes:
    """A model or profile name thousands of characters long (or path-like, or just past a limit)."""
    return rng.choice(("m" * rng.randint(60, 6000), "org/" + "m" * 5000, "a/" * 3000 + "b", "x" * 65,
                       "bad name " * 100, "-" * 301)).encode()


def _hardware_yaml(rng: random.Random) -> bytes:
    """A user hardware file whose 64-character names sit near each other, with long keys and values."""
    gpu = dict(_catalog_yaml("gpus.yaml")["gpus"]["h100-sxm"])
    cluster = dict(_catalog_yaml("clusters.yaml")["clusters"]["dgx-h100"])
    gpus = {f"{LONG_NAME[:-1]}{c}": gpu for c in "abc"}
    cluster["gpu"] = rng.choice((LONG_NAME[:-1] + "d", "NVIDIA " + "Z" * 200 + " 80GB HBM3", "x" * 5000))
    if rng.random() < 0.5:
        gpus[LONG_NAME] = {**gpu, rng.choice(("k" * 200, "efficiency_from")): "e" * 500}
    if rng.random() < 0.3:
        cluster["gpus_per_node"] = _hostile_value(rng)
    return yaml.safe_dump({"gpus": gpus, "clusters": {f"c{LONG_NAME[1:]}": cluster}}, sort_keys=False).encode()


def _cli(*args: str) -> None:
    """Run a command in-process: an InputError for a clean refusal (exit 2), the exception for anything else."""
    result = CliRunner().invoke(app, list(args))
    if result.exit_code == 2 and "Traceback" not in result.output:
        raise InputError(result.stderr.strip().removeprefix("error: "))
    if result.exit_code not in (0, 2):  # the CLI turned the defect into exit 70: name it by its last line
        raise RuntimeError(f"exit {result.exit_code}: {result.output.strip().splitlines()[-1][:200]}")


def _read_and_predict_log(path: Path) -> None:
    read_job_file(path)
    sp.predict_megatron_logs([path], "h100-sxm")


def _user_hardware(path: Path) -> None:
    catalog = load_user_catalog(path)
    for name in catalog.cluster_origins:
        if catalog.cluster_origins[name] == str(path):
            catalog.cluster(name, num_nodes=1)


def _target(name: str, file_name: str, call: Callable[[Path], object]) -> Parser:
    return Parser(name=name, file_name=file_name, call=call, fmt="text", seed=lambda: b"")


HOSTILE = {
    "hostile-job-yaml": (_target("hostile-job-yaml", "job.yaml", lambda p: _cli("evaluate", "--config", str(p))),
                         _job_yaml),
    "hostile-megatron-sh": (_target("hostile-megatron-sh", "train.sh", read_job_file), _megatron_script),
    "hostile-megatron-log": (_target("hostile-megatron-log", "train.log", _read_and_predict_log), _megatron_log),
    "hostile-model-name": (_target("hostile-model-name", "name.txt", lambda p: load_model(p.read_text())),
                           _long_name),
    "hostile-profile-name": (_target("hostile-profile-name", "name.txt", lambda p: sp.check_name(p.read_text())),
                             _long_name),
    "hostile-hardware": (_target("hostile-hardware", "d" * 60 + "/" + "e" * 60 + "/site.yaml", _user_hardware),
                         _hardware_yaml),
}
"""Name -> (the target, its input generator)."""

LIMIT_S = 5.0
"""Per-input wall-clock limit: every valid input of these sizes parses in milliseconds; 5 s is a hang."""


TARGETS: dict[str, Parser] = {**PARSERS, **{name: target for name, (target, _) in HOSTILE.items()}}


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
    generate = HOSTILE[parser.name][1] if parser.name in HOSTILE else lambda rng: make_input(parser, rng)
    for index in range(count):
        data = generate(rng)
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
    args.add_argument("--parsers", default="", help=f"comma-separated subset of: {', '.join(TARGETS)}; 'hostile' "
                      "for every hostile-* target")
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--show", type=int, default=5, help="failures shown per parser")
    options = args.parse_args(argv)
    chosen = [name.strip() for name in options.parsers.split(",") if name.strip()] or list(TARGETS)
    chosen = [n for name in chosen for n in (list(HOSTILE) if name == "hostile" else [name])]
    unknown = [name for name in chosen if name not in TARGETS]
    if unknown:
        args.error(f"unknown parser(s) {', '.join(unknown)}")
    signal.signal(signal.SIGALRM, _alarm)
    columns = ("tried", "rejected", "accepted", "crashed", "bad message", "over 5 s")
    print(f"{'parser':<22}" + "".join(f"{c:>12}" for c in columns) + f"{'slowest s':>11}{'total s':>9}")
    bad = 0
    details = []
    with tempfile.TemporaryDirectory(prefix="paraplan-fuzz-") as folder:
        for name in chosen:
            result = run_parser(TARGETS[name], options.per_parser, options.seed, Path(folder), options.show)
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
