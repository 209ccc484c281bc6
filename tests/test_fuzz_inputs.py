"""Every file a user hands over goes through one guarded reader (paraplan/files.py) and a validation layer: no
input, however hostile, may raise anything but InputError, whose message is one line of at most 300 characters,
and none may take more than a few seconds.

Property tests per parser (tests/fuzz_kit.py lists them with a valid seed each): random bytes, random text,
hostile classics (deep nesting, billion laughs, recursive aliases, huge numbers), and structure-aware mutations
of the seed (one value replaced by an edge value, keys dropped or added, items repeated, branches nested). What a
parser accepts must also be sane: counts within paraplan.limits, times finite. ``bench/fuzz.py`` runs the same
parsers with 10,000 inputs each.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from fuzz_kit import EDGE_VALUES, HOSTILE_TEXTS, NOT_OURS, PARSERS, Parser, make_input, message_problem, write_input
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.errors import InputError
from paraplan.files import (
    MAX_JSON_DEPTH,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    listed,
    one_line,
    parse_user_csv,
    parse_user_json,
    parse_user_yaml,
    shown,
)
from paraplan.limits import MAX_GPUS, MAX_TOPOLOGY_NODES

OURS = sorted(name for name in PARSERS if name not in NOT_OURS)
LIMIT_S = 5
"""Seconds one input may take: every input here is a few KB and parses in milliseconds."""
FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def time_limit(seconds: int):
    def fail(signum, frame):
        raise AssertionError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _accepted_is_sane(name: str, result: object) -> None:
    """What a parser accepted obeys the bounds the validation layer promises."""
    if name == "cluster-yaml":
        assert 1 <= result.num_gpus <= MAX_GPUS
    elif name == "topology-yaml":
        assert 1 <= result.num_nodes <= MAX_TOPOLOGY_NODES
    elif name == "plan-json":
        assert 1 <= result.num_gpus <= MAX_GPUS and len(result.ranks) == result.num_gpus
    elif name.startswith("ingest-"):
        assert result.measurements and all(math.isfinite(m.time_s) and m.time_s >= 0 for m in result.measurements)
    elif name == "routing-csv":
        assert (result.tokens_per_expert >= 0).all()
    elif name == "runs-csv":
        assert len(result) >= 1 and (result.measured_tokens_per_s_per_gpu > 0).all()
    elif name == "stack-profile":
        assert 0.1 <= result.step_time_factor <= 10
    elif name == "serving-plan-json":  # the launch files of the best plan: named, non-empty, bounded
        assert result and all(f.name and f.text and len(f.text) < 50_000_000 for f in result)
    elif name.startswith("arrival-trace"):
        assert result.num_requests >= 2 and result.arrivals.rate_per_s > 0 and math.isfinite(result.arrivals.cv2)


def check(parser: Parser, path: Path) -> None:
    """Parse ``path``: InputError with a good message, or a sane result; never anything else, never slow."""
    with time_limit(LIMIT_S):
        try:
            result = parser.call(path)
        except InputError as exc:
            assert message_problem(exc) is None, f"{message_problem(exc)}: {exc}"
            return
    _accepted_is_sane(parser.name, result)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# -- the seeds are valid: mutations start from files the parsers accept -------------------------------------------
@pytest.mark.parametrize("name", OURS)
def test_each_seed_is_accepted(name, folder):
    parser = PARSERS[name]
    result = parser.call(write_input(parser, parser.seed(), folder / name, random.Random(1)))
    _accepted_is_sane(name, result)


def _input_path(parser: Parser, folder: Path) -> Path:
    """Where ``parser`` reads its input inside the work folder (its own subfolder, created)."""
    path = folder / parser.name / parser.file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# -- random input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OURS)
@FAST
@given(data=st.binary(max_size=600))
def test_random_bytes_are_refused_in_one_line(name, folder, data):
    parser = PARSERS[name]
    if parser.fmt == "sqlite":
        data = b"SQLite format 3\x00" + data  # look like a database, so SQLite reads the rest
    path = _input_path(parser, folder)
    path.write_bytes(data)
    check(parser, path)


@pytest.mark.parametrize("name", OURS)
@FAST
@given(text=st.text(max_size=400))
def test_random_text_is_refused_in_one_line(name, folder, text):
    parser = PARSERS[name]
    path = _input_path(parser, folder)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check(parser, path)


@pytest.mark.parametrize("hostile", range(len(HOSTILE_TEXTS)))
@pytest.mark.parametrize("name", OURS)
def test_hostile_classics_are_refused_in_one_line(name, hostile, folder):
    parser = PARSERS[name]
    path = write_input(parser, HOSTILE_TEXTS[hostile].encode(), folder / name, random.Random(hostile))
    check(parser, path)


# -- mutations of the seed ---------------------------------------------------------------------------------------
def _mutated(name: str, folder: Path, seed: int) -> None:
    parser = PARSERS[name]
    rng = random.Random(seed)
    check(parser, write_input(parser, make_input(parser, rng), folder / name, rng))


@pytest.mark.parametrize("name", OURS)
@FAST
@given(seed=st.integers(0, 2**32))
def test_mutated_seeds_raise_only_one_line_input_errors(name, folder, seed):
    _mutated(name, folder, seed)


@pytest.mark.slow
@pytest.mark.parametrize("name", OURS)
@SLOW
@given(seed=st.integers(0, 2**32))
def test_many_mutated_seeds_raise_only_one_line_input_errors(name, folder, seed):
    _mutated(name, folder, seed)


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(10**400), 10**400),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30),
                        st.sampled_from([v for v in EDGE_VALUES if not isinstance(v, (list, dict))]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=12), inner, max_size=4), max_leaves=12)
STRUCTURED = sorted(name for name in OURS if PARSERS[name].fmt in ("json", "yaml"))


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:8]):
            yield from _paths(item, (*path, index))


@pytest.mark.parametrize("name", STRUCTURED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_anywhere_in_a_valid_file_is_refused_or_sane(name, folder, data):
    """Each key of a valid seed, in turn, takes any JSON value: wrong types, huge and negative numbers, long
    strings, nested containers."""
    parser = PARSERS[name]
    document = json.loads(json.dumps(yaml.safe_load(parser.seed()), default=str))
    path = data.draw(st.sampled_from(list(_paths(document))[1:]))
    value = data.draw(JSON_VALUES)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    text = json.dumps(document) if parser.fmt == "json" else yaml.safe_dump(document)
    check(parser, write_input(parser, text.encode(), folder / name, random.Random(0)))


# -- the guarded readers themselves ------------------------------------------------------------------------------
def test_billion_laughs_is_refused_before_it_expands():
    bomb = HOSTILE_TEXTS[3]
    assert "*a8" in bomb  # 10^9 values once expanded, 1 KB as written
    with time_limit(2), pytest.raises(InputError, match=f"more than {MAX_YAML_NODES:,} values once its aliases"):
        parse_user_yaml(bomb, "bomb.yaml")


@pytest.mark.parametrize("text", ["a: &x [1, *x]\n", "a: &x {b: *x}\n", "- &x [*x]\n"])
def test_recursive_aliases_are_refused(text):
    with pytest.raises(InputError, match="refers to a node that contains it"):
        parse_user_yaml(text, "loop.yaml", top=None)


def test_aliases_and_merges_within_bounds_still_work():
    data = parse_user_yaml("base: &b {gpu: h100-sxm, gpus_per_node: 8}\nsite: {<<: *b, gpus_per_node: 4}\n", "m.yaml")
    assert data["site"] == {"gpu": "h100-sxm", "gpus_per_node": 4}


def test_yaml_depth_and_repeated_keys_are_refused():
    deep = "a: " + "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1)
    with pytest.raises(InputError, match=f"nested more than {MAX_YAML_DEPTH} levels"):
        parse_user_yaml(deep, "deep.yaml")
    assert parse_user_yaml("a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1), "ok.yaml")
    with pytest.raises(InputError, match="key 'gpu' is given twice"):
        parse_user_yaml("gpu: a\ngpu: b\n", "twice.yaml")


def test_json_depth_is_counted_outside_strings():
    assert parse_user_json('{"a": "' + "[" * 500 + '"}', "s.json") == {"a": "[" * 500}
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_user_json(nested, "ok.json", top=list)
    with pytest.raises(InputError, match=f"nested more than {MAX_JSON_DEPTH} levels"):
        parse_user_json("[" + nested + "]", "deep.json", top=list)
    with pytest.raises(InputError, match=f"nested more than {MAX_JSON_DEPTH} levels"):
        parse_user_json("[" * 200_000 + "]" * 200_000, "deeper.json", top=list)
    with pytest.raises(InputError, match="holds NaN"):
        parse_user_json('{"a": NaN}', "nan.json")


def test_csv_bounds_name_the_line():
    assert parse_user_csv("a,b\n1,2\n", "x.csv", max_rows=2) == [["a", "b"], ["1", "2"]]
    with pytest.raises(InputError, match="more than 2 rows"):
        parse_user_csv("a,b\n1,2\n3,4\n", "x.csv", max_rows=2)
    with pytest.raises(InputError, match="line 2: 3 fields"):
        parse_user_csv("a\n1,2,3\n", "x.csv", max_rows=9, max_columns=2)
    with pytest.raises(InputError, match="line 2: a cell of 5,001 characters"):
        parse_user_csv('a\n"' + "x" * 5001 + '"\n', "x.csv", max_rows=9)


def test_messages_echo_values_cut_to_one_short_line():
    assert shown("x" * 1000) == "'" + "x" * 56 + "..."
    assert shown(list(range(10**4))) == "a list of 10,000 items"
    assert shown("a\nb") == "'a\\nb'"
    assert shown(10**5000) == "<an integer of about 5,000 digits>"  # repr() itself would raise past 4,300 digits
    assert shown([[list(range(10**6))]]) == "[[[...]]]"  # nested depth cut, the million items never walked
    assert one_line("a\n  b\tc") == "a b c" and len(one_line("y" * 999)) == 300
    assert listed(["alpha", "beta", "gamma"], 12) == "alpha, beta, ... (3 in all)"
    assert listed(["alpha", "beta"], 40) == "alpha, beta"


def test_the_guarded_readers_load_no_yaml_until_a_yaml_file_is_read():
    code = "import sys, paraplan.files; print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "False"


# -- the CLI: a hostile file is exit 2 and one 'error:' line, for every command that reads one ------------------
BOMB = HOSTILE_TEXTS[3]
JOB = ["--seq-len", "4096", "--global-batch", "64"]


@pytest.mark.parametrize(("file_name", "content", "command", "needle"), [
    ("site.yaml", BOMB, ["plan", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8", *JOB, "--hardware", "{}"],
     "values once its aliases are expanded"),
    ("c.yaml", "a: &x [1, *x]\n", ["plan", "llama-3.1-8b", "--cluster", "{}", "--nodes", "1", *JOB],
     "refers to a node that contains it"),
    ("c.yaml", ("gpu: h100-sxm\ngpus_per_node: 1\nnvlink_domain_gpus: 1\nnic_gb_per_s_per_gpu: 50\n"
     "inter_node_latency_us: 5\nintra_domain_latency_us: 2\nnum_nodes: 1000000000\n"),
     ["plan", "llama-3.1-8b", "--cluster", "{}", *JOB], "num_nodes"),
    ("plan.json", "[" * 100_000, ["export", "{}", "-f", "json", "-o", "{out}"], "nested more than"),
    ("plan.json", '{"schema_version": 1, "plans": [{"rank": "' + "x" * 10_000 + '"}]}',
     ["export", "{}", "-f", "json", "-o", "{out}"], "does not match the plan schema"),
    ("all_reduce_perf.txt", "# nThread 1 nGpus 1\n#  size count type redop root time algbw busbw\n1 1 f s -1 "
     + "9" * 5000 + " 1 1\n", ["ingest", "{}", "--hardware", "h100-sxm", "--store", "{out}.sqlite"], "line 3"),
    ("trace.json", '{"traceEvents": [{"ph": "X", "cat": "kernel", "dur": 1' + "0" * 400 + "}]}",
     ["ingest", "{}", "--kind", "torch-trace", "--hardware", "h100-sxm", "--store", "{out}.sqlite"], "dur"),
])
def test_hostile_files_through_the_cli_are_one_line_and_exit_2(tmp_path, file_name, content, command, needle):
    from conftest import assert_bad_input
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    path = tmp_path / file_name
    path.write_text(content)
    args = [str(path) if arg == "{}" else arg.replace("{out}", str(tmp_path / "out")) for arg in command]
    with time_limit(30):
        line = assert_bad_input(CliRunner().invoke(app, args), needle)
    assert len(line) <= len("error: ") + 300


def test_a_deep_folder_never_pushes_the_fix_off_the_line():
    deep = "/home/someone/projects/cluster-configs/2026/november/experiments/site-a/topology.yaml"
    message = f"{deep}: node_groups[1].gpu: unknown GPU 'h1OO' " + "(a list of what is known) " * 8 + "; fix it"
    assert len(message) > 300
    shortened = str(InputError(message))
    assert shortened.startswith(".../site-a/topology.yaml: node_groups[1].gpu: unknown GPU") and len(shortened) < 300
    assert str(InputError(f"{deep}: short")) == f"{deep}: short"  # a line that fits keeps the whole path
