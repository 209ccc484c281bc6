"""Hostile input files end in one clean refusal (exit 2, one line of at most 300 characters, within 5 s), never an
internal error, a stall or a message that echoes the hostile value whole."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from conftest import assert_bad_input
from test_learned_steps import ARGS, _log
from test_user_hardware import CLUSTER_ENTRY, GPU_ENTRY
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import MAX_MESSAGE_CHARS
from paraplan.hardware_profiles.user_file import HARDWARE_ENV
from paraplan.validation import stack_profile as sp

LIMIT_S = 5.0
JOB = "model: llama-3.1-8b\nseq-len: 4096\nglobal-batch: 8\ngpu: h100-sxm\ngpus: 8\n"
HUGE = "1" + "0" * 1000


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the command; assert a clean refusal in time; the one line."""
    start = time.perf_counter()
    result = CliRunner(env={"COLUMNS": "200", HARDWARE_ENV: "", **(env or {})}).invoke(app, list(args))
    took = time.perf_counter() - start
    line = assert_bad_input(result)
    assert len(line) - len("error: ") <= MAX_MESSAGE_CHARS, (len(line), line)
    assert took < LIMIT_S, took
    return line


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# -- 1. --config job.yaml: huge and zero counts, infinities, long lists --------------------------------------------
@pytest.mark.parametrize("command", ["plan", "evaluate"])
@pytest.mark.parametrize("extra", [f"tp: {10**400}", f"tp: {HUGE}", f"mbs: {10**30}", f"vpp: {10**25}",
                                   f"offload: {10**40}", f"recompute: {HUGE}", f"recompute: '{HUGE}'",
                                   f"seq-len: {HUGE}", f"gpus: {HUGE}", f"headroom: {HUGE}", "tp: .inf",
                                   f"mbs: {2**62}", f"cp: '{HUGE}'", "tp: " + ",".join(["1"] * 5000),
                                   "ep: [" + ",".join(map(str, range(1, 1001))) + "]\netp: ["
                                   + ",".join(map(str, range(1, 1001))) + "]"])
def test_hostile_config_values_are_refused_in_one_short_line(tmp_path, command, extra):
    axes = "" if command == "plan" else "pp: 1\n" if extra.startswith("tp") else "tp: 1\npp: 1\n"
    lines = [line for line in (JOB + axes).splitlines() if line.split(":")[0] != extra.split(":")[0]]
    config = _write(tmp_path / "job.yaml", "\n".join([*lines, extra]) + "\n")
    _refused(command, "--config", config)


@pytest.mark.parametrize("flags", [["--tp", HUGE], ["--recompute", "x" * 5000], ["--mbs", str(10**30)],
                                   ["--ep", ",".join(map(str, range(1, 100)))], ["--seq-len", HUGE],
                                   ["--gpus", HUGE], ["--global-batch", str(10**400)]])
def test_huge_flags_are_refused(flags):
    given = dict(zip(["--gpu", "--gpus", "--seq-len", "--global-batch"], ["h100-sxm", "8", "4096", "8"]))
    given.update(dict([flags]))
    _refused("plan", "llama-3.1-8b", *[word for pair in given.items() for word in pair])


# -- 2. --from Megatron scripts and logs ---------------------------------------------------------------------------
SCRIPT = ("#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_gpt.py --num-layers {layers} --hidden-size 4096 "
          "--num-attention-heads {heads} --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
          "--global-batch-size 64 --vocab-size 32000 --tensor-model-parallel-size 1 --bf16 {extra}\n")


@pytest.mark.parametrize("fields", [
    {"heads": 0}, {"layers": 0}, {"extra": "--hidden-size 0"}, {"extra": "--num-experts 8 --moe-layer-freq 0"},
    {"extra": "--num-experts 8 --moe-layer-freq '([1]*99999999999999)'"}, {"heads": HUGE}, {"layers": HUGE},
    {"extra": "--kv-channels " + "(" * 5000 + "1" + ")" * 5000}, {"heads": "9" * 30},
    {"extra": "--tokenizer-model " + "m" * 5000}, {"extra": "--load " + "/d" * 3000},
])
def test_hostile_megatron_scripts_are_refused(tmp_path, fields):
    values = {"layers": 32, "heads": 32, "extra": "", **fields}
    script = _write(tmp_path / "train.sh", SCRIPT.format(**values))
    _refused("evaluate", "--from", script)


@pytest.mark.parametrize("name", ["m" * 5000, "org/" + "m" * 5000, "a/" * 3000 + "b"])
def test_a_model_named_thousands_of_characters_long_is_unknown(tmp_path, name):
    script = _write(tmp_path / "train.sh", SCRIPT.format(layers=32, heads=32, extra=f"--tokenizer-model {name}")
                    .replace("--num-layers 32 ", "").replace("--hidden-size 4096 ", ""))
    _refused("evaluate", "--from", script)
    _refused("plan", name, "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096", "--global-batch", "8")


@pytest.mark.parametrize("kind", ["script-lines", "script-line", "log-args", "log-iterations", "script-vars",
                                  "script-doubling", "script-array-doubling", "script-megabytes", "script-braces",
                                  "script-appends", "script-arith"])
def test_long_scripts_and_logs_are_read_or_refused_in_time(tmp_path, kind):
    body = {
        "script-lines": SCRIPT.format(layers=0, heads=32, extra="") + "echo hi\n" * 100_000,
        "script-line": SCRIPT.format(layers=0, heads=32, extra="--foo " * 100_000),
        "script-vars": "".join(f"A{i}=$A{i - 1}x\n" for i in range(1, 20_000)) + SCRIPT.format(layers=0, heads=32,
                                                                                               extra="$A19999"),
        "script-doubling": "A=x\n" + "A=$A$A\n" * 40 + SCRIPT.format(layers=0, heads=32, extra="$A"),
        "script-array-doubling": "A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + SCRIPT.format(layers=0, heads=32,
                                                                                              extra=""),
        "script-megabytes": "echo hi\n" * 1_000_000 + SCRIPT.format(layers=32, heads=32, extra=""),
        "script-braces": SCRIPT.format(layers=0, heads=32, extra='"' + "${" * 120_000 + '"'),
        "script-appends": 'A+=("--foo 1")\n' * 15_000 + SCRIPT.format(layers=0, heads=32, extra='"${A[@]}"'),
        "script-arith": "A=$((" + "(" * 100_000 + "1" + ")" * 100_000 + "))\n" + SCRIPT.format(layers=0, heads=32,
                                                                                             extra=""),
        "log-args": _log({**ARGS, "num_attention_heads": 0, **{f"k{i}": i for i in range(50_000)}}, [1000, 1000]),
        "log-iterations": _log({**ARGS, "num_layers": 0}, [1000.0] * 40_000),
    }[kind]
    path = _write(tmp_path / ("train.log" if kind.startswith("log") else "train.sh"), body)
    _refused("evaluate", "--from", path)


# -- 3. calibrate ----------------------------------------------------------------------------------------------------
@pytest.fixture()
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv(sp.PROFILES_ENV, str(tmp_path / "profiles"))
    monkeypatch.setenv("PARAPLAN_STORE", str(tmp_path / "store.sqlite"))
    return tmp_path / "profiles"


MINIMAL = "id,model,gpu,num_gpus,seq_len,global_batch,precision,engine,tp,pp,measured_step_time_s\n"


@pytest.mark.parametrize("model", ["m" * 5000, "org/" + "m" * 5000, "a/" * 3000 + "b"])
def test_calibrate_refuses_a_thousands_long_model_name_as_unknown(tmp_path, profiles, model):
    runs = _write(tmp_path / "runs.csv", MINIMAL + f"r1,{model},h100-sxm,8,4096,64,bf16,megatron,1,1,5\n")
    line = _refused("calibrate", runs, "--name", "x")
    assert "unknown model" in line or "not cached" in line or "no such" in line, line


@pytest.mark.parametrize("changes", [{"num_attention_heads": 0}, {"tensor_model_parallel_size": 0},
                                     {"num_layers": "abc"}, {"hidden_size": HUGE}, {"world_size": 0},
                                     {"micro_batch_size": "1e999"}, {"pipeline_model_parallel_size": 64},
                                     {"num_layers_per_virtual_pipeline_stage": 64}, {"seq_length": -4}])
def test_calibrate_refuses_hostile_megatron_log_arguments(tmp_path, profiles, changes):
    log = _write(tmp_path / "a.log", _log({**ARGS, **changes}, [5000, 3100, 3000]))
    _refused("calibrate", log, "--hardware", "h100-sxm", "--name", "x")


@pytest.mark.parametrize("name", ["x" * 300, "y" * 5000, "-" * 301, "bad name " * 100])
def test_profile_names_are_refused_in_one_short_line(tmp_path, profiles, name):
    runs = _write(tmp_path / "runs.csv", MINIMAL)
    _refused("calibrate", runs, "--name", name)


# -- 4. user hardware files ------------------------------------------------------------------------------------------
LONG = "g" * 64


def _hardware(tmp_path: Path, gpus: dict, clusters: dict) -> str:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return _write(deep / "site.yaml", yaml.safe_dump({"gpus": gpus, "clusters": clusters}, sort_keys=False))


@pytest.mark.parametrize("case", ["close-names", "device-name", "unknown-key", "bad-source", "builtin", "clash",
                                  "efficiency-from", "cluster-range"])
def test_user_hardware_messages_stay_within_300(tmp_path, case):
    near = {f"{LONG[:-1]}{c}": GPU_ENTRY for c in "abc"}
    cluster = {f"c{LONG[1:]}": CLUSTER_ENTRY}
    gpus, clusters = {
        "close-names": (near, {f"c{LONG[1:]}": {**CLUSTER_ENTRY, "gpu": LONG[:-1] + "d"}}),
        "device-name": (near, {f"c{LONG[1:]}": {**CLUSTER_ENTRY, "gpu": "NVIDIA " + "Z" * 200 + " 80GB HBM3"}}),
        "unknown-key": ({LONG: {**GPU_ENTRY, "k" * 200: 1, "j" * 200: 2}}, {}),
        "bad-source": ({LONG: {**GPU_ENTRY, "sources": {**GPU_ENTRY["sources"], "hbm": "s" * 500}, "hbm_gib": -1}},
                       {}),
        "builtin": ({"h100-sxm": GPU_ENTRY}, {}),
        "clash": ({LONG: GPU_ENTRY}, {LONG: CLUSTER_ENTRY}),
        "efficiency-from": ({LONG: {**GPU_ENTRY, "efficiency_from": "e" * 500}}, {}),
        "cluster-range": ({}, {f"c{LONG[1:]}": {**CLUSTER_ENTRY, "gpu": "h100-sxm", "gpus_per_node": 10**9}}),
    }[case]
    hardware = _hardware(tmp_path, gpus, clusters or cluster)
    _refused("hardware", "list", "--hardware", hardware)
