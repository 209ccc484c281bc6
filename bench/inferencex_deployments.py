"""Rebuild ``data/serving/inferencex_deployments.csv``: the deployments InferenceX published for the serving rows
that do not state theirs.

1,328 disaggregated rows of ``data/serving/serving_runs.csv.gz`` (aiconfigurator's ``silicon_sample.csv``, sweeps
``2026-03-25.csv`` and ``2026-04-06.csv``) come from SemiAnalysis' InferenceX benchmark: Dynamo with TensorRT-LLM or
SGLang, DeepSeek-R1 and gpt-oss-120b on H100 to GB300. They state each pool's GPU count but no worker counts, and
their decode columns repeat the prefill pool's expert parallelism. InferenceX publishes what it launched, per GPU,
precision, image, sequence lengths and concurrency, in ``.github/configs/nvidia-master.yaml`` (Apache-2.0): the
worker counts, each pool's tensor/expert parallel degrees and attention DP, and speculative decoding (MTP, with the
draft count in the recipe's name, ``..._mtp3.yaml``).

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
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "serving" / "serving_runs.csv.gz"
OUT = ROOT / "data" / "serving" / "inferencex_deployments.csv"
CONFIG = ".github/configs/nvidia-master.yaml"
SINCE, UNTIL = "2025-11-01", "2026-05-01"
LICENCE = "Apache-2.0 (SemiAnalysisAI/InferenceX, LICENSE)"

RUNNERS = {"b200-multinode": "b200_sxm", "b200": "b200_sxm", "b300": "b300_sxm", "gb200": "gb200", "gb300": "gb300",
           "h100-multinode": "h100_sxm", "h200-multinode": "h200_sxm", "h200": "h200_sxm"}
FRAMEWORKS = {"dynamo-trt": "trtllm", "dynamo-sglang": "sglang", "dynamo-vllm": "vllm"}
MODELS = {"dsr1": "deepseek-ai/DeepSeek-R1", "gptoss": "openai/gpt-oss-120b"}
SINGLE_GPU_FITS = {"dsr1": False, "gptoss": True}
"""Whether one GPU can hold the model: DeepSeek-R1's 671 B parameters are 336 GB even at 4 bits, more than any GPU
here (B300/GB300: 288 GB). The late-2025 SGLang GB200 entries list tp 1, ep 1 as placeholders and name their real
layout only in comments and node counts (``PREFILL_NODES=4``, "DEP4"); a 1-GPU pool of such a model is skipped."""
DEPLOYMENT = ("p_workers", "p_tp", "p_ep", "p_dp", "d_workers", "d_tp", "d_ep", "d_dp", "spec", "draft_tokens")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _draft_tokens(spec: str, settings: list[str]) -> float:
    """0 without speculation; N from a recipe named ``..._mtpN.yaml``; NaN where MTP's draft count is not stated."""
    if spec == "none":
        return 0.0
    found = {int(m) for s in settings for m in re.findall(r"_mtp(\d+)", str(s))}
    return float(found.pop()) if len(found) == 1 else float("nan")


def published_entries(repo: Path) -> pd.DataFrame:
    """One row per (published deployment, concurrency) in any version of the config, with the commits it was in."""
    log = _git(repo, "log", "--format=%h %cd", "--date=short", f"--after={SINCE}", f"--before={UNTIL}", "--", CONFIG)
    records: dict[tuple, dict] = {}
    for line in log.splitlines():
        commit, date = line.split()
        config = yaml.safe_load(_git(repo, "show", f"{commit}:{CONFIG}"))
        for key, entry in config.items():
            if not isinstance(entry, dict) or not entry.get("disagg"):
                continue
            family = str(key).split("-")[0]
            if family not in MODELS or entry.get("runner") not in RUNNERS or entry.get("framework") not in FRAMEWORKS:
                continue
            for seq in entry.get("seq-len-configs", []):
                for point in seq.get("search-space", []):
                    prefill, decode = point.get("prefill", {}), point.get("decode", {})
                    spec = str(point.get("spec-decoding", "none"))
                    settings = (prefill.get("additional-settings") or []) + (decode.get("additional-settings") or [])
                    for conc in point.get("conc-list") or []:
                        row = dict(key=key, model_path=MODELS[family], system=RUNNERS[entry["runner"]],
                                   backend=FRAMEWORKS[entry["framework"]], precision=entry["precision"],
                                   image=str(entry["image"]).replace("#", "/"), isl=seq["isl"], osl=seq["osl"],
                                   concurrency=float(conc), spec=spec, draft_tokens=_draft_tokens(spec, settings),
                                   p_workers=prefill.get("num-worker"), p_tp=prefill.get("tp"), p_ep=prefill.get("ep"),
                                   p_dp=bool(prefill.get("dp-attn")), d_workers=decode.get("num-worker"),
                                   placeholder=not SINGLE_GPU_FITS[family]
                                   and 1 in (prefill.get("tp"), decode.get("tp")),
                                   d_tp=decode.get("tp"), d_ep=decode.get("ep"), d_dp=bool(decode.get("dp-attn")))
                        seen = records.setdefault(tuple(row.items()), {**row, "commits": []})
                        seen["commits"].append((commit, date))
    return pd.DataFrame(list(records.values()))


def _pool(prefix: str, workers: int, gpus: int, ep: int, dp_attention: bool) -> dict[str, float]:
    """A pool in the measurement file's columns: ``gpus`` a worker, attention data parallel over all of them (tp 1)
    or tensor parallel over all (dp 1), the experts split ``ep`` ways and each expert ``gpus / ep`` ways."""
    return {f"{prefix}num_workers": workers, f"{prefix}tp_size": 1 if dp_attention else gpus,
            f"{prefix}attention_dp_size": gpus if dp_attention else 1, f"{prefix}moe_tp_size": gpus // ep,
            f"{prefix}moe_ep_size": ep}


def match(runs: pd.DataFrame, entries: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """(the published deployment of each unstated row that exactly one matches, counts of the outcomes)."""
    unstated = runs[(runs["mode"] == "disagg") & runs["prefill_num_workers"].isna()].copy()
    unstated["image"] = unstated["silicon_data_source"].str.extract(r"image=([^;]+)")[0].str.replace("#", "/")
    unstated["concurrency"] = unstated["silicon_data_source"].str.extract(r"silicon_concurrency=(\d+)")[0].astype(float)
    keys = ["model_path", "system", "backend", "precision", "image", "isl", "osl", "concurrency"]
    joined = unstated.reset_index().merge(entries, on=keys, how="inner")
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
        commits = sorted({c for cs in found["commits"] for c in cs}, key=lambda c: c[1])
        out.append({"id": e["id"],
                    "deployment_source": (f"SemiAnalysisAI/InferenceX {CONFIG} key {e['key']}, "
                                          f"commits {commits[0][0]} ({commits[0][1]}) to {commits[-1][0]} "
                                          f"({commits[-1][1]})"),
                    "licence": LICENCE,
                    **_pool("prefill_", int(e["p_workers"]), int(e["p_tp"]), int(e["p_ep"]), bool(e["p_dp"])),
                    **_pool("decode_", int(e["d_workers"]), int(e["d_tp"]), int(e["d_ep"]), bool(e["d_dp"])),
                    "speculative_tokens": int(e["draft_tokens"])})
    counts["matched"] = len(out)
    counts["none"] = counts["rows"] - joined["index"].nunique()
    return pd.DataFrame(out), counts


def main(repo: str) -> None:
    runs = pd.read_csv(RUNS)
    table, counts = match(runs, published_entries(Path(repo)))
    table.sort_values("id").to_csv(OUT, index=False)
    print(f"{counts['matched']} of {counts['rows']} unstated rows take a published deployment "
          f"({(table['speculative_tokens'] > 0).sum()} with MTP); no match {counts['none']}, several "
          f"{counts['several']}, MTP draft count unstated {counts['mtp draft count unstated']}, placeholder layout "
          f"{counts['placeholder layout']} -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
