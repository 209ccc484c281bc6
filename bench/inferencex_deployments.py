"""Rebuild ``data/serving/inferencex_deployments.csv``: the deployments InferenceX published for the serving rows
that do not state theirs.

1,328 disaggregated rows of ``data/serving/serving_runs.csv.gz`` (aiconfigurator's ``silicon_sample.csv``, sweeps
``2026-03-25.csv`` and ``2026-04-06.csv``) come from SemiAnalysis' InferenceX benchmark: Dynamo with TensorRT-LLM or
SGLang, DeepSeek-R1 and gpt-oss-120b on H100 to GB300. They state each pool's GPU count but no worker counts, and
their decode columns repeat the prefill pool's expert parallelism. InferenceX publishes what it launched, per GPU,
precision, image, sequence lengths and concurrency, in ``.github/configs/nvidia-master.yaml`` (Apache-2.0): the
worker counts, each pool's tensor/expert parallel degrees and attention DP, and speculative decoding (MTP, with the
draft count in the recipe's name, ``..._mtp3.yaml``).

The same file publishes its single-node (aggregated) runs, some with MTP: 2,040 aggregated rows of those sweeps state
their parallelism but not that they drafted tokens. An aggregated row that exactly one published single-node
deployment matches (model, GPU, engine, precision, image, ISL/OSL, concurrency in the entry's range, tensor
parallelism) and that ran MTP gains its draft count (``AGGREGATED_MTP_DRAFTS``); its own columns stand.

Every version of that file from November 2025 to April 2026 is read; a row takes a published deployment when exactly
one matches its model, GPU, engine, precision, image, ISL/OSL and concurrency, its pools' GPU counts and its prefill
expert parallelism. Rows that match none, or several that differ (most often the same point run with and without MTP),
or MTP whose draft count no recipe name states, or a placeholder layout (``SINGLE_GPU_FITS``), keep the columns they
have and stay unstated.

    python bench/inferencex_deployments.py /path/to/InferenceX   # a clone of SemiAnalysisAI/InferenceX (or bare git)

prints the rows matched and writes the file.
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "serving" / "serving_runs.csv.gz"
OUT = ROOT / "data" / "serving" / "inferencex_deployments.csv"
CONFIG = ".github/configs/nvidia-master.yaml"
SINCE, UNTIL = "2025-11-01", "2026-05-01"
LICENCE = "Apache-2.0 (SemiAnalysisAI/InferenceX, LICENSE)"

RUNNERS = {"b200-multinode": "b200_sxm", "b200": "b200_sxm", "b300": "b300_sxm", "gb200": "gb200", "gb300": "gb300",
           "h100-multinode": "h100_sxm", "h200-multinode": "h200_sxm", "h200": "h200_sxm", "h100": "h100_sxm",
           "b200-trt": "b200_sxm", "b200-nvs": "b200_sxm", "h200-trt": "h200_sxm"}
FRAMEWORKS = {"dynamo-trt": "trtllm", "dynamo-sglang": "sglang", "dynamo-vllm": "vllm", "trt": "trtllm",
              "sglang": "sglang", "vllm": "vllm"}
MODELS = {"dsr1": "deepseek-ai/DeepSeek-R1", "gptoss": "openai/gpt-oss-120b", "minimaxm2.5": "MiniMaxAI/MiniMax-M2.5",
          "kimik2.5": "moonshotai/Kimi-K2.5", "glm5": "zhipuai/GLM-5", "qwen3.5": "Qwen/Qwen3.5-397B-A17B"}
"""The model families matched (``model-prefix`` of InferenceX's config keys)."""
MEMORY_FRACTION = re.compile(r"(?:--gpu-memory-utilization|--mem-fraction-static)[= ]+(\S+)"
                             r"|free_gpu_memory_fraction:\s*(\S+)")
"""The engine's memory fraction in a launch script: vLLM ``--gpu-memory-utilization``, SGLang
``--mem-fraction-static``, TensorRT-LLM ``kv_cache_config.free_gpu_memory_fraction`` (each under that engine's own
rule: ``EngineTraits.budget``)."""
RECV_INTERVAL = re.compile(r"--scheduler-recv-interval[= ]+(\S+)")
"""SGLang's ``--scheduler-recv-interval`` in a launch script (a literal or a variable the script assigns)."""
CONDITION = re.compile(r'\[\[\s*"?\$\{?(\w+)\}?"?\s+(-eq|-ne|-lt|-le|-gt|-ge|==|!=)\s+"?([\w.]+)"?\s*\]\]')
"""One test of a launch script's ``if``: ``[[ $VAR -op VALUE ]]`` (numbers) or ``[[ "$VAR" == "text" ]]``."""
AGGREGATED_MTP_DRAFTS = {("trtllm", "dsr1", False): 3, ("trtllm", "dsr1", True): 1, ("sglang", "dsr1", False): 2,
                         ("sglang", "qwen3.5", False): 3}
"""MTP draft tokens of the single-node runs, (engine, model, attention DP) -> N, as their launch scripts state them in
every version from January to April 2026 (``benchmarks/single_node/``): ``dsr1_fp{4,8}_b200_trt_mtp.sh`` and
``dsr1_fp8_h200_trt_mtp.sh`` set ``num_nextn_predict_layers`` to 3, or 1 with attention DP; ``dsr1_fp8_b200_mtp.sh``
runs SGLang's EAGLE with ``--speculative-num-steps 2`` (top-k 1, 3 draft tokens verified: two drafted a step) and
``qwen3.5_fp8_b200_mtp.sh`` with 3 (4 verified)."""
SINGLE_GPU_FITS = {"dsr1": False, "gptoss": True, "minimaxm2.5": False, "kimik2.5": False, "glm5": False,
                   "qwen3.5": False}
"""Whether one GPU can hold the model: DeepSeek-R1's 671 B parameters are 336 GB even at 4 bits, more than any GPU
here (B300/GB300: 288 GB). The late-2025 SGLang GB200 entries list tp 1, ep 1 as placeholders and name their real
layout only in comments and node counts (``PREFILL_NODES=4``, "DEP4"); a 1-GPU pool of such a model is skipped."""
DEPLOYMENT = ("p_workers", "p_tp", "p_ep", "p_dp", "d_workers", "d_tp", "d_ep", "d_dp", "spec", "draft_tokens")
AGGREGATED = ("tp", "ep", "dp", "spec", "draft_tokens")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _draft_tokens(spec: str, settings: list[str]) -> float:
    """0 without speculation; N from a recipe named ``..._mtpN.yaml``; NaN where MTP's draft count is not stated."""
    if spec == "none":
        return 0.0
    found = {int(m) for s in settings for m in re.findall(r"_mtp(\d+)", str(s))}
    return float(found.pop()) if len(found) == 1 else float("nan")


def _concurrencies(point: dict) -> list[float]:
    """A search-space point's concurrencies: its ``conc-list``, else ``conc-start`` doubling up to ``conc-end``."""
    if point.get("conc-list"):
        return [float(c) for c in point["conc-list"]]
    start, end = point.get("conc-start"), point.get("conc-end")
    out = []
    while isinstance(start, int) and isinstance(end, int) and 0 < start <= end:
        out.append(float(start))
        start *= 2
    return out


def _configs(repo: Path) -> list[tuple[tuple[int, str, str], dict]]:
    """((age rank, commit, date), parsed config) of every version in the window, oldest first: the rank orders
    commits of one day as git does."""
    log = _git(repo, "log", "--format=%h %cd", "--date=short", f"--after={SINCE}", f"--before={UNTIL}", "--", CONFIG)
    versions = [line.split() for line in reversed(log.splitlines())]
    return [((rank, commit, date), yaml.safe_load(_git(repo, "show", f"{commit}:{CONFIG}")))
            for rank, (commit, date) in enumerate(versions)]


def _base(key: str, entry: dict, family: str, seq: dict) -> dict:
    return dict(key=key, model_path=MODELS[family], system=RUNNERS[entry["runner"]],
                backend=FRAMEWORKS[entry["framework"]], precision=entry["precision"],
                image=str(entry["image"]).replace("#", "/"), isl=seq["isl"], osl=seq["osl"])


def _family(key: str, entry: object) -> str | None:
    """The model family of a config entry paraplan matches, or None."""
    family = str(key).split("-")[0]
    ok = isinstance(entry, dict) and family in MODELS and entry.get("runner") in RUNNERS \
        and entry.get("framework") in FRAMEWORKS
    return family if ok else None


def _script(entry: dict, spec: str) -> str:
    """The launch script a single-node entry runs, as InferenceX's runners name it (``runners/launch_b200-nb.sh``):
    ``benchmarks/single_node/<model-prefix>_<precision>_<gpu>[_trt][_mtp].sh``."""
    gpu = str(entry["runner"]).split("-")[0]
    suffix = ("_trt" if entry["framework"] == "trt" else "") + ("" if spec == "none" else f"_{spec}")
    return f"benchmarks/single_node/{entry.get('model-prefix')}_{entry['precision']}_{gpu}{suffix}.sh"


def memory_fraction(script: str) -> float:
    """The one memory fraction a launch script sets (a literal, or a variable with one assigned value); NaN where it
    sets none or several (a fraction chosen by concurrency or attention DP)."""
    values = set()
    for literal, trtllm in MEMORY_FRACTION.findall(script):
        value = (literal or trtllm).strip("\"'")
        name = re.fullmatch(r"\$\{?(\w+)\}?", value)
        if name:
            values |= set(re.findall(rf"^\s*{name.group(1)}=([0-9.]+)\s*$", script, flags=re.MULTILINE))
        else:
            values.add(value)
    numbers = {float(v) for v in values if re.fullmatch(r"[0-9]*\.?[0-9]+", v)}
    return numbers.pop() if len(numbers) == 1 and len(values) == 1 and 0.0 < min(numbers | {1.0}) else float("nan")


def _test(condition: str, env: dict[str, str]) -> bool | None:
    """A launch script's ``if`` condition under ``env`` (``[[ ... ]]`` tests joined by ``||`` or ``&&``, left to
    right); None where it reads a variable ``env`` lacks or has a form this does not read."""
    tests = CONDITION.findall(condition)
    joins = re.findall(r"\]\]\s*(\|\||&&)\s*\[\[", condition)
    if not tests or len(joins) != len(tests) - 1 or condition.count("[[") != len(tests):
        return None
    values: list[bool | None] = []
    for name, op, literal in tests:
        if name not in env:
            values.append(None)
            continue
        left, right = env[name], literal
        if op in ("==", "!="):
            values.append((left == right) == (op == "=="))
            continue
        try:
            a, b = float(left), float(right)
        except ValueError:
            values.append(None)
            continue
        values.append({"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op])
    result = values[0]
    for join, value in zip(joins, values[1:]):
        if join == "||":
            result = True if True in (result, value) else (None if None in (result, value) else False)
        else:
            result = False if False in (result, value) else (None if None in (result, value) else True)
    return result


def shell_assignment(script: str, name: str, env: dict[str, str]) -> str | None:
    """The value a launch script assigns to ``name`` when run with ``env``, reading its ``if``/``elif``/``else``/``fi``
    blocks of plain ``NAME=value`` lines (the form InferenceX's scripts choose settings in: by TP, CONC, ISL, OSL);
    None where no assignment runs or one sits under a condition that cannot be read."""
    frames: list[list] = []  # [active (True/False/None), some branch taken (True/False/None)]
    value: str | None = None
    for raw in script.splitlines():
        line = raw.split("#", 1)[0].strip()
        outer = frames[-1][0] if frames else True
        head = re.match(r"(if|elif)\s+(.*?);?\s*then\s*$", line)
        if head and head.group(1) == "if":
            test = _test(head.group(2), env)
            frames.append([None if outer is None or test is None else outer and test, test])
        elif head and frames:
            test, taken = _test(head.group(2), env), frames[-1][1]
            grand = frames[-2][0] if len(frames) > 1 else True
            known = None not in (grand, test, taken)
            frames[-1] = [grand and not taken and test if known else None,
                          (taken or test) if None not in (taken, test) else None]
        elif line == "else" and frames:
            grand = frames[-2][0] if len(frames) > 1 else True
            taken = frames[-1][1]
            frames[-1] = [grand and not taken if None not in (grand, taken) else None, True]
        elif line == "fi" and frames:
            frames.pop()
        else:
            assigned = re.fullmatch(rf"{name}=(\S+)", line)
            if assigned and outer is None:
                return None  # it may or may not run
            if assigned and outer:
                value = assigned.group(1).strip("\"'")
    return value


def recv_interval(script: str, env: dict[str, str]) -> float:
    """The ``--scheduler-recv-interval`` an SGLang launch script runs with under ``env``: 1 (SGLang's default) where it
    sets none, the literal or the value its ``if`` blocks assign (``shell_assignment``); NaN where that cannot be
    read or the script sets it more than once."""
    found = RECV_INTERVAL.findall(script)
    if not found:
        return 1.0
    if len(found) > 1:
        return float("nan")
    literal = found[0].strip("\"'")
    name = re.fullmatch(r"\$\{?(\w+)\}?", literal)
    value = shell_assignment(script, name.group(1), env) if name else literal
    return float(value) if value is not None and re.fullmatch(r"[0-9]+", value) else float("nan")


def aggregated_entries(configs: list[tuple[tuple[int, str, str], dict]]) -> pd.DataFrame:
    """One row per (published single-node deployment, concurrency) in any version, with the commits it was in."""
    records: dict[tuple, dict] = {}
    for version, config in configs:
        for key, entry in config.items():
            family = _family(key, entry)
            if family is None or entry.get("disagg") or entry.get("multinode"):
                continue
            for seq in entry.get("seq-len-configs", []):
                for point in seq.get("search-space", []):
                    spec, dp = str(point.get("spec-decoding", "none")), bool(point.get("dp-attn", False))
                    backend = FRAMEWORKS[entry["framework"]]
                    drafts = 0.0 if spec == "none" else float(AGGREGATED_MTP_DRAFTS.get((backend, family, dp), np.nan))
                    for conc in _concurrencies(point):
                        row = {**_base(key, entry, family, seq), "concurrency": conc, "tp": point.get("tp"),
                               "ep": point.get("ep", 1), "dp": dp, "spec": spec, "draft_tokens": drafts,
                               "script": _script(entry, spec)}
                        records.setdefault(tuple(row.items()), {**row, "commits": []})["commits"].append(version)
    return pd.DataFrame(list(records.values()))


def published_entries(configs: list[tuple[tuple[int, str, str], dict]]) -> pd.DataFrame:
    """One row per (published disaggregated deployment, concurrency) in any version, with the commits it was in."""
    records: dict[tuple, dict] = {}
    for version, config in configs:
        for key, entry in config.items():
            family = _family(key, entry)
            if family is None or not entry.get("disagg"):
                continue
            for seq in entry.get("seq-len-configs", []):
                for point in seq.get("search-space", []):
                    prefill, decode = point.get("prefill", {}), point.get("decode", {})
                    spec = str(point.get("spec-decoding", "none"))
                    settings = (prefill.get("additional-settings") or []) + (decode.get("additional-settings") or [])
                    for conc in _concurrencies(point):
                        row = dict(**_base(key, entry, family, seq),
                                   concurrency=float(conc), spec=spec, draft_tokens=_draft_tokens(spec, settings),
                                   p_workers=prefill.get("num-worker"), p_tp=prefill.get("tp"), p_ep=prefill.get("ep"),
                                   p_dp=bool(prefill.get("dp-attn")), d_workers=decode.get("num-worker"),
                                   placeholder=not SINGLE_GPU_FITS[family]
                                   and 1 in (prefill.get("tp"), decode.get("tp")),
                                   d_tp=decode.get("tp"), d_ep=decode.get("ep"), d_dp=bool(decode.get("dp-attn")))
                        seen = records.setdefault(tuple(row.items()), {**row, "commits": []})
                        seen["commits"].append(version)
    return pd.DataFrame(list(records.values()))


def _pool(prefix: str, workers: int, gpus: int, ep: int, dp_attention: bool) -> dict[str, float]:
    """A pool in the measurement file's columns: ``gpus`` a worker, attention data parallel over all of them (tp 1)
    or tensor parallel over all (dp 1), the experts split ``ep`` ways and each expert ``gpus / ep`` ways."""
    return {f"{prefix}num_workers": workers, f"{prefix}tp_size": 1 if dp_attention else gpus,
            f"{prefix}attention_dp_size": gpus if dp_attention else 1, f"{prefix}moe_tp_size": gpus // ep,
            f"{prefix}moe_ep_size": ep}


def _source(key: str, found: pd.DataFrame) -> str:
    commits = sorted({c for cs in found["commits"] for c in cs})  # (age rank, commit, date): oldest first
    (_, first, first_date), (_, last, last_date) = commits[0], commits[-1]
    return f"SemiAnalysisAI/InferenceX {CONFIG} key {key}, commits {first} ({first_date}) to {last} ({last_date})"


KEYS = ["model_path", "system", "backend", "precision", "image", "isl", "osl", "concurrency"]
"""What a row and a published entry must share to match (beside each mode's parallel degrees)."""


def _keyed(rows: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``rows`` with the image and concurrency their source notes state, as ``KEYS`` name them."""
    rows = rows.copy()
    rows["image"] = rows["silicon_data_source"].str.extract(r"image=([^;]+)")[0].str.replace("#", "/")
    rows["concurrency"] = rows["silicon_data_source"].str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
    return rows


def _inferencex_rows(runs: pd.DataFrame, mode: str) -> pd.DataFrame:
    return _keyed(runs[(runs["mode"] == mode) & runs["silicon_data_source"].str.contains("wip=", regex=False)])


def _in_every_version(repo: Path, found: pd.DataFrame, read: Callable[[str], float],
                      texts: dict[tuple[str, str], str | None]) -> float:
    """The value ``read`` finds in the entry's launch script in every version of the config it ran under, or NaN where
    they differ or a version lacks the script (``texts``: each (commit, script) read from git once)."""
    script = str(found["script"].iloc[0])
    values = set()
    for _, commit, _ in {c for cs in found["commits"] for c in cs}:
        if (commit, script) not in texts:
            try:
                texts[commit, script] = _git(repo, "show", f"{commit}:{script}")
            except subprocess.CalledProcessError:  # no such script in that version
                texts[commit, script] = None
        text = texts[commit, script]
        values.add(float("nan") if text is None else read(text))
    return values.pop() if len(values) == 1 else float("nan")


def _script_interval(repo: Path, found: pd.DataFrame, texts: dict[tuple[str, str], str | None]) -> float:
    """The SGLang scheduler receive interval (``recv_interval``) the entry's script ran with at its TP, EP, attention
    DP, lengths and concurrency in every version it ran under (``_in_every_version``)."""
    e = found.iloc[0]
    env = {"TP": str(int(e["tp"])), "EP_SIZE": str(int(e["ep"])), "DP_ATTENTION": str(bool(e["dp"])).lower(),
           "CONC": str(int(e["concurrency"])), "ISL": str(int(e["isl"])), "OSL": str(int(e["osl"]))}
    return _in_every_version(repo, found, lambda text: recv_interval(text, env), texts)


def _shared_interval(repo: Path, found: pd.DataFrame, texts: dict[tuple[str, str], str | None]) -> float:
    """The receive interval above 1 that every SGLang deployment matching a row ran with (``_script_interval``), or
    NaN where one is not SGLang's or they differ: the interval a row ran with even where which deployment is not
    known (most often the same point run with and without MTP)."""
    intervals = set()
    for _, same in found.groupby(list(AGGREGATED), dropna=False):
        sglang = same["backend"].iloc[0] == "sglang"
        intervals.add(_script_interval(repo, same, texts) if sglang else float("nan"))
    value = intervals.pop() if len(intervals) == 1 else float("nan")
    return value if value > 1 else float("nan")


def _sources(distinct: pd.DataFrame, found: pd.DataFrame) -> str:
    """The source of a row several published deployments match: each candidate's (``_source``), joined."""
    return " or ".join(_source(key, found[found["key"] == key]) for key in sorted(distinct["key"].unique()))


def match_aggregated(runs: pd.DataFrame, entries: pd.DataFrame, repo: Path) -> tuple[pd.DataFrame, dict[str, int]]:
    """(for each aggregated row that exactly one published single-node deployment matches: its MTP draft count and
    the memory fraction its launch script set, where either is known; counts of the outcomes)."""
    rows = _inferencex_rows(runs, "agg")
    joined = rows.reset_index().merge(entries, on=KEYS, how="inner")
    joined = joined[joined["tp"] == joined["tp_size"]]
    out, counts = [], {"rows": len(rows), "one": 0, "several": 0, "mtp": 0, "fraction": 0, "interval": 0}
    texts: dict[tuple[str, str], str | None] = {}
    for _, found in joined.groupby("index"):
        distinct = found.drop_duplicates(list(AGGREGATED))
        if len(distinct) > 1:
            counts["several"] += 1
            shared = _shared_interval(repo, found, texts)
            if np.isfinite(shared):  # every candidate ran SGLang with this interval: it is known, MTP is not
                counts["interval"] += 1
                out.append({"id": distinct["id"].iloc[0], "deployment_source": _sources(distinct, found),
                            "licence": LICENCE, "speculative_tokens": np.nan, "memory_fraction": np.nan,
                            "scheduler_recv_interval": shared})
            continue
        counts["one"] += 1
        e = distinct.iloc[0]
        if e["spec"] != "none" and pd.isna(e["draft_tokens"]):
            continue  # MTP with a draft count paraplan cannot state: the row stays as it is
        fraction = _in_every_version(repo, found, memory_fraction, texts)
        interval = _script_interval(repo, found, texts) if e["backend"] == "sglang" else float("nan")
        interval = interval if interval > 1 else float("nan")  # SGLang's default (1) needs no entry
        if e["draft_tokens"] == 0 and np.isnan(fraction) and np.isnan(interval):
            continue
        counts["mtp"] += int(e["draft_tokens"] > 0)
        counts["fraction"] += int(np.isfinite(fraction))
        counts["interval"] += int(np.isfinite(interval))
        out.append({"id": e["id"], "deployment_source": _source(e["key"], found), "licence": LICENCE,
                    "speculative_tokens": int(e["draft_tokens"]), "memory_fraction": fraction,
                    "scheduler_recv_interval": interval})
    return pd.DataFrame(out), counts


def match(runs: pd.DataFrame, entries: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """(the published deployment of each unstated row that exactly one matches, counts of the outcomes)."""
    unstated = _keyed(runs[(runs["mode"] == "disagg") & runs["prefill_num_workers"].isna()])
    joined = unstated.reset_index().merge(entries, on=KEYS, how="inner")
    joined = joined[(joined["d_tp"] == joined["decode_tp_size"]) & (joined["p_tp"] == joined["prefill_tp_size"])
                    & (joined["p_ep"] == joined["prefill_moe_ep_size"])]
    out, counts = [], {"rows": len(unstated), "none": 0, "several": 0, "mtp draft count unstated": 0,
                       "placeholder layout": 0, "matched": 0}
    for _, found in joined.groupby("index"):
        distinct = found.drop_duplicates(list(DEPLOYMENT))
        if len(distinct) > 1:
            counts["several"] += 1
            continue
        e = distinct.iloc[0]
        if e["placeholder"]:
            counts["placeholder layout"] += 1
            continue
        if pd.isna(e["draft_tokens"]):
            counts["mtp draft count unstated"] += 1
            continue
        out.append({"id": e["id"], "deployment_source": _source(e["key"], found), "licence": LICENCE,
                    **_pool("prefill_", int(e["p_workers"]), int(e["p_tp"]), int(e["p_ep"]), bool(e["p_dp"])),
                    **_pool("decode_", int(e["d_workers"]), int(e["d_tp"]), int(e["d_ep"]), bool(e["d_dp"])),
                    "speculative_tokens": int(e["draft_tokens"])})
    counts["matched"] = len(out)
    counts["none"] = counts["rows"] - joined["index"].nunique()
    return pd.DataFrame(out), counts


def main(repo: str) -> None:
    runs = pd.read_csv(RUNS)
    configs = _configs(Path(repo))
    table, counts = match(runs, published_entries(configs))
    aggregated, agg_counts = match_aggregated(runs, aggregated_entries(configs), Path(repo))
    pd.concat([table, aggregated]).sort_values("id").to_csv(OUT, index=False)
    print(f"{counts['matched']} of {counts['rows']} unstated disaggregated rows take a published deployment "
          f"({(table['speculative_tokens'] > 0).sum()} with MTP); no match {counts['none']}, several "
          f"{counts['several']}, MTP draft count unstated {counts['mtp draft count unstated']}, placeholder layout "
          f"{counts['placeholder layout']}")
    print(f"{agg_counts['one']} of {agg_counts['rows']} aggregated rows match one published deployment, "
          f"{agg_counts['several']} several; {agg_counts['mtp']} of them ran MTP, {agg_counts['fraction']} state "
          f"their memory fraction; {agg_counts['interval']} (of one or several) an SGLang scheduler receive interval "
          f"above 1 -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
