"""InferenceX's published deployments for the disaggregated serving rows that state none
(``data/serving/inferencex_deployments.csv``), and the MTP those deployments ran, priced at one fitted acceptance."""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import assert_bad_input
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.errors import InputError
from paraplan.validation.serving_runs import (
    DEPLOYMENT_COLUMNS,
    DEPLOYMENTS_FILE,
    MEMORY_FRACTION,
    MTP_ACCEPTANCE,
    RECV_INTERVAL,
    SPECULATIVE_TOKENS,
    deployment_stated,
    inferencex_twins,
    load_measurements,
    predict_rows,
    speculating,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import inferencex_deployments as inferencex_builder  # noqa: E402  (bench/, on the path above)
from mtp_acceptance import best, tpot_errors  # the fit's own code, so test and benchmark cannot drift

B200_AGG_MTP_ROW = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_agg_1024x1024_c16_tp8_0_ep1_0_1031"
"""DeepSeek-R1 fp8 on one B200 node under TensorRT-LLM, tp 8, 1k/1k at concurrency 16 (TPOT 8.6 ms, image
release:1.2.0rc6.post3): the row states its parallelism, not its MTP."""
B200_FP8_MTP_ROW = "2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_1024x1024_c8_tp8_0_ep8_0_392"
"""DeepSeek-R1 fp8 on B200 under Dynamo + TensorRT-LLM, 1k/1k at concurrency 8 (TPOT 3.52 ms): the row states two
8-GPU pools and nothing else."""
QWEN35_GAP_COPY_ROW = ("qwen3_5_397b_gap_analysis_qwen3_5_397b_gap_analysis_b200_sxm_sglang_fp8_agg_1024x1024_c256_"
                       "tp4_ep1_22")
"""A row of qwen3.5-397b-gap-analysis.csv that repeats an InferenceX API row's measurement."""


@pytest.fixture(scope="module")
def shipped():
    with resources.as_file(resources.files("paraplan.data") / "serving") as folder:
        yield folder


@pytest.fixture(scope="module")
def published(shipped) -> pd.DataFrame:
    return pd.read_csv(shipped / DEPLOYMENTS_FILE)


@pytest.fixture(scope="module")
def rows(shipped) -> pd.DataFrame:
    return load_measurements(shipped)


def test_a_hand_read_deployment(published):
    """InferenceX's nvidia-master.yaml (commit 12ba0ae07, key dsr1-fp8-b200-dynamo-trt, ISL/OSL 1024, conc-list [8],
    read by hand): spec-decoding mtp, recipe ctx1_gen8_tp8_batch1_eplb0_mtp3_8.yaml; prefill 1 worker, tp 8, ep 8,
    dp-attn true; decode 8 workers, tp 8, ep 1, dp-attn false."""
    row = published.set_index("id").loc[B200_FP8_MTP_ROW]
    assert "dsr1-fp8-b200-dynamo-trt" in row["deployment_source"] and "Apache-2.0" in row["licence"]
    assert [int(row[c]) for c in DEPLOYMENT_COLUMNS] == [1, 1, 8, 1, 8,  # prefill: attention DP 8, experts EP 8
                                                         8, 8, 1, 8, 1]  # decode: 8 workers of attention TP 8, MoE TP 8
    assert row[SPECULATIVE_TOKENS] == 3


def test_a_hand_read_aggregated_mtp_run(published):
    """The same file at 12ba0ae07, key dsr1-fp8-b200-trt-mtp (image release:1.2.0rc6.post3), ISL/OSL 1024: tp 8,
    ep 1, conc-start 4 to conc-end 128, spec-decoding mtp; its script dsr1_fp8_b200_trt_mtp.sh sets MTP=3 without
    attention DP. The entry adds the draft count alone: the row's own pools stand (empty here)."""
    row = published.set_index("id").loc[B200_AGG_MTP_ROW]
    assert "dsr1-fp8-b200-trt-mtp" in row["deployment_source"] and row[SPECULATIVE_TOKENS] == 3
    assert all(pd.isna(row[c]) for c in DEPLOYMENT_COLUMNS)


MINIMAX_B200_ROW = "2026_03_25_minimax_m2_5_b200_sxm_vllm_fp8_agg_8192x1024_c16_tp2_0_ep1_0_1359"
"""MiniMax-M2.5 fp8 on two B200s under vLLM (image v0.17.0-cu130, measured 2026-03-11), 8k/1k at concurrency 16."""


def test_a_hand_read_memory_fraction(published, rows, shipped):
    """Key minimaxm2.5-fp8-b200-vllm at 12ba0ae07 runs image v0.17.0-cu130 (tp 2, concurrency 4-64) and its script
    benchmarks/single_node/minimaxm2.5_fp8_b200.sh starts ``vllm serve ... --gpu-memory-utilization 0.95``: the row
    is priced at 0.95, exactly as an engine whose memory fraction is 0.95 prices it."""
    from dataclasses import replace

    from paraplan.cost_models.serving import ENGINE_TRAITS

    entry = published.set_index("id").loc[MINIMAX_B200_ROW]
    assert entry[MEMORY_FRACTION] == 0.95 and entry[SPECULATIVE_TOKENS] == 0
    row = rows[rows["id"] == MINIMAX_B200_ROW]
    assert row[MEMORY_FRACTION].item() == 0.95
    plain = row.assign(**{MEMORY_FRACTION: np.nan})
    engines = {**ENGINE_TRAITS, "vllm": replace(ENGINE_TRAITS["vllm"], memory_frac=0.95)}
    a, b = predict_rows(row, shipped), predict_rows(plain, shipped, engines)
    for column in ("tpot_steady_s", "ttft_steady_s", "ttft_burst_s"):
        assert a[column].item() == b[column].item(), column


def test_every_published_deployment_is_an_unstated_row_with_its_own_gpu_counts(shipped, published):
    """Each id with pools is one disaggregated row without worker counts; each pool keeps the row's GPU count (tp x
    dp = the row's tp_size, moe_tp x moe_ep = the same GPUs). Each id without pools is an aggregated InferenceX row
    that ran MTP, set a memory fraction or an SGLang receive interval (32 of those match several deployments that
    agree on the interval alone, and leave MTP blank: not known). Every row names its source and licence."""
    original = pd.read_csv(shipped / "serving_runs.csv.gz").set_index("id")
    assert published["id"].is_unique and len(published) == 663 + 728
    aggregated = published[published["prefill_num_workers"].isna()]
    assert len(aggregated) == 728 and (original.loc[aggregated["id"], "mode"] == "agg").all()
    assert aggregated[list(DEPLOYMENT_COLUMNS)].isna().all().all()
    assert (aggregated[SPECULATIVE_TOKENS] > 0).sum() == 126 and aggregated[MEMORY_FRACTION].notna().sum() == 630
    assert aggregated[RECV_INTERVAL].notna().sum() == 153 and aggregated[SPECULATIVE_TOKENS].isna().sum() == 32
    assert set(aggregated[RECV_INTERVAL].dropna()) == {10, 30}
    stated = aggregated[[MEMORY_FRACTION, RECV_INTERVAL]].notna().any(axis=1)
    assert ((aggregated[SPECULATIVE_TOKENS] > 0) | stated).all()  # each states one
    published = published[published["prefill_num_workers"].notna()]
    mine = original.loc[published["id"]]
    assert (mine["mode"] == "disagg").all() and mine["prefill_num_workers"].isna().all()
    for pool in ("prefill", "decode"):
        gpus = (published[f"{pool}_tp_size"] * published[f"{pool}_attention_dp_size"]).to_numpy()
        assert np.array_equal(gpus, mine[f"{pool}_tp_size"].to_numpy())
        assert np.array_equal(gpus, (published[f"{pool}_moe_tp_size"] * published[f"{pool}_moe_ep_size"]).to_numpy())
    assert published["deployment_source"].str.startswith("SemiAnalysisAI/InferenceX").all()
    assert (published["licence"].str.len() > 0).all()
    assert sorted(published[SPECULATIVE_TOKENS].unique()) == [0, 1, 2, 3]


def test_loading_puts_the_published_deployment_in_place_of_the_rows_own(rows, published):
    row = rows.set_index("id").loc[B200_FP8_MTP_ROW]
    assert (row["decode_num_workers"], row["decode_moe_ep_size"], row[SPECULATIVE_TOKENS]) == (8, 1, 3)
    listed = rows["id"].isin(published["id"]).to_numpy()
    assert listed.sum() == 663 + 728
    # Rows of other sweeps repeating a listed row's measurement take its deployment (``inferencex_twins``).
    inherited = rows["inferencex_twin"].isin(published["id"]).to_numpy()
    assert not (listed & inherited).any() and inherited.sum() == 285
    has = (rows["deployment_source"] != "").to_numpy()
    assert np.array_equal(has, listed | inherited)
    assert (rows.loc[~has, SPECULATIVE_TOKENS] == 0).all()
    stated = deployment_stated(rows)
    assert stated[has].all()
    assert int(speculating(rows)[listed].sum()) == 240 + 126 and int(speculating(rows)[inherited].sum()) == 1 + 21
    agg = rows.set_index("id").loc[B200_AGG_MTP_ROW]
    assert (agg["tp_size"], agg["moe_ep_size"], agg[SPECULATIVE_TOKENS]) == (8, 1, 3)  # its own pools, MTP added


def test_one_acceptance_explains_one_and_three_draft_tokens():
    """The shipped acceptance is the fit over the disaggregated MTP rows; fitted on the 174 rows with 3 drafts alone
    it is within one grid step of it (0.65), and the 53 rows with 1 draft (expected tokens 1 + A rather than
    (1 - A^4)/(1 - A)) come out within 10% median |error| at the shipped value, with a bias below 3% (measured:
    9.2%, -1.7%)."""
    mtp, errors = tpot_errors()
    drafts = mtp[SPECULATIVE_TOKENS].to_numpy()
    assert best(errors, np.ones(len(mtp), dtype=bool)) == MTP_ACCEPTANCE
    assert abs(best(errors, drafts == 3) - MTP_ACCEPTANCE) <= 0.05 + 1e-9
    one = errors[MTP_ACCEPTANCE][drafts == 1]
    assert np.median(np.abs(one)) < 0.10 and abs(np.median(one)) < 0.03
    assert np.median(np.abs(errors[MTP_ACCEPTANCE])) < 0.10  # the fit itself: 8.6% over the 240 rows


def test_the_acceptance_carries_to_the_aggregated_tensorrt_llm_runs():
    """Out of sample: the 58 single-node DeepSeek-R1 runs on TensorRT-LLM with MTP (not fitted to; 27-40% too slow
    priced without MTP) come out at the acceptance fitted on the disaggregated rows within 12% median |error|
    (measured 8.8%, -8.8% signed; 7.9% before TensorRT-LLM's step overhead refitted to 1.5 ms). SGLang's single-node
    MTP runs do not: DeepSeek-R1's 26 are 45.5% fast and Qwen3.5's 63 27.4% (docs/serving.md; 42 of its own, 21 of a
    gap-analysis file repeating its measurements): bounds on the known gap, so a fix shows here."""
    agg, errors = tpot_errors((MTP_ACCEPTANCE,), mode="agg")
    at = errors[MTP_ACCEPTANCE]
    trt = (agg["backend"] == "trtllm").to_numpy()
    qwen = agg["model_path"].str.contains("Qwen3.5").to_numpy()
    assert trt.sum() == 58 and np.median(np.abs(at[trt])) < 0.12
    assert (~trt & ~qwen).sum() == 26 and np.median(at[~trt & ~qwen]) < -0.3
    assert qwen.sum() == 42 + 21 and np.median(at[qwen]) < -0.15


def test_tpot_falls_as_acceptance_rises_and_drafting_nothing_costs(rows, shipped):
    """Metamorphic: a row's predicted TPOT falls strictly as the acceptance rises (more tokens a step, same verify
    pass), and at acceptance 0 the 3-token drafts and 4-token verify are pure cost over the same deployment without
    MTP."""
    row = rows[rows["id"] == B200_FP8_MTP_ROW]
    tpot = [float(predict_rows(row, shipped, mtp_acceptance=a)["tpot_steady_s"].iloc[0]) for a in (0.0, 0.4, 0.65, 0.9)]
    assert all(a > b for a, b in zip(tpot, tpot[1:], strict=False)), tpot
    plain = row.assign(**{SPECULATIVE_TOKENS: 0.0})
    assert float(predict_rows(plain, shipped)["tpot_steady_s"].iloc[0]) < tpot[0]


def _folder_with(tmp_path: Path, shipped: Path, text: str) -> Path:
    shutil.copy(shipped / "serving_runs.csv.gz", tmp_path / "serving_runs.csv.gz")
    (tmp_path / DEPLOYMENTS_FILE).write_text(text)
    return tmp_path


HEADER = "id,deployment_source," + ",".join(DEPLOYMENT_COLUMNS) + f",{SPECULATIVE_TOKENS}\n"


@pytest.mark.parametrize("text, needle", [
    ("id,deployment_source\nx,y\n", "lacks the columns prefill_num_workers"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 9) + ",x,0\n", "whole number from 1 to 4096"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",-1\n", "whole number from 0 to 16"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",99\n", "whole number from 0 to 16"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",1.5\n", "whole number from 0 to 16"),
    (HEADER[:-1] + ",scheduler_recv_interval\n" + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0,0\n",
     "scheduler_recv_interval must be empty or a whole number from 1 to 1000"),
    (HEADER[:-1] + ",scheduler_recv_interval\n" + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0,2.5\n",
     "scheduler_recv_interval must be empty or a whole number from 1 to 1000"),
    (HEADER[:-1] + ",scheduler_recv_interval\n" + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0,1001\n",
     "scheduler_recv_interval must be empty or a whole number from 1 to 1000"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["0"] * 10) + ",0\n", "whole number from 1 to 4096"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["1.5"] * 10) + ",0\n", "whole number from 1 to 4096"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["inf"] * 10) + ",0\n", "whole number from 1 to 4096"),
    (HEADER + f"{B200_FP8_MTP_ROW},s," + ",".join(["9" * 400] * 10) + ",0\n", "whole number from 1 to 4096"),
    (HEADER[:-1] + ",memory_fraction\n" + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0,1.5\n",
     "memory_fraction must be empty or in"),
    (HEADER[:-1] + ",memory_fraction\n" + f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0,half\n",
     "memory_fraction must be empty or in"),
    (HEADER + (f"{B200_FP8_MTP_ROW},s," + ",".join(["1"] * 10) + ",0\n") * 2, "each id must be listed once"),
    ('a,b\n"1,2\n', "not a CSV of published deployments"),
])
def test_a_bad_deployments_file_is_one_line(tmp_path, shipped, text, needle):
    folder = _folder_with(tmp_path, shipped, text)
    with pytest.raises(InputError, match=needle):
        load_measurements(folder)
    result = CliRunner().invoke(app, ["validate", "--serving", "--serving-data", str(folder)])
    assert_bad_input(result, DEPLOYMENTS_FILE)


def test_a_folders_own_file_replaces_the_shipped_one(tmp_path, shipped):
    """A data folder's own deployments file is read instead of the shipped one: here one disaggregated row, 2 decode
    workers, no MTP, and one aggregated row, 2 draft tokens; every other row keeps its own columns."""
    folder = _folder_with(tmp_path, shipped, HEADER + f"{B200_FP8_MTP_ROW},mine,1,8,1,8,1,2,8,1,8,1,0\n"
                          + f"{B200_AGG_MTP_ROW},mine too,,,,,,,,,,,2\n")
    mine = load_measurements(folder)
    row = mine.set_index("id").loc[B200_FP8_MTP_ROW]
    assert (row["decode_num_workers"], row["deployment_source"], row[SPECULATIVE_TOKENS]) == (2, "mine", 0)
    agg = mine.set_index("id").loc[B200_AGG_MTP_ROW]  # empty pools: the row's own tp 8 stands
    assert (agg["tp_size"], agg["deployment_source"], agg[SPECULATIVE_TOKENS]) == (8, "mine too", 2)
    assert (mine["deployment_source"] != "").sum() == 2


def test_inferencex_rows_carry_their_benchmarks_protocol(rows):
    """The 3,368 InferenceX API rows (its ``wip`` field in the source note), the 882 of its results database
    (``db-dump``) and the 115 rows of two gap-analysis files that repeat InferenceX measurements ran ten waves of
    requests with lengths uniform in [0.8 L, L]: stated waves 10, mean lengths 0.9 x stated; no other row states
    either."""
    source = rows["silicon_data_source"].astype(str)
    api = source.str.contains("wip=", regex=False).to_numpy()
    database = source.str.contains("db-dump/", regex=False).to_numpy()
    twin = (rows["inferencex_twin"] != "").to_numpy()
    inferencex = api | database | twin
    assert (api.sum(), database.sum(), (twin & ~database).sum(), inferencex.sum()) == (3368, 882, 115, 4365)
    assert (rows.loc[inferencex, "stated_waves"] == 10.0).all() and rows.loc[~inferencex, "stated_waves"].isna().all()
    assert (rows.loc[inferencex, "length_scale"] == 0.9).all()
    assert (rows.loc[~inferencex, "length_scale"] == 1.0).all()
    assert rows.loc[rows["id"] == B200_FP8_MTP_ROW, "stated_waves"].item() == 10.0
    assert not rows.loc[inferencex, "fixed_lengths"].any()


def test_a_repeated_measurement_is_priced_as_its_inferencex_deployment(rows):
    """Qwen3.5-397B fp8 on 4 B200s under SGLang 0.5.9, 1024/1024 at concurrency 256: InferenceX's API row (its
    MTP recipe, 3 draft tokens) measured TPOT 47.874849 ms and TTFT 2485.321115 ms; the gap-analysis file lists
    47.87 and 2485.32 at the same point. It is that run, and takes its deployment and protocol."""
    copy = rows[rows["id"] == QWEN35_GAP_COPY_ROW].iloc[0]
    original = rows[rows["id"] == copy["inferencex_twin"]].iloc[0]
    assert "wip=" in original["silicon_data_source"] and original["concurrency"] == 256
    assert (copy[SPECULATIVE_TOKENS], original[SPECULATIVE_TOKENS]) == (3.0, 3.0)
    assert copy["deployment_source"] == original["deployment_source"] != ""
    assert copy["stated_waves"] == 10.0 and copy["length_scale"] == 0.9


def test_twins_need_the_same_measurement_not_the_same_model_name(rows):
    """InferenceX's database names DeepSeek-R1's runs by their architecture: 391 of its rows that repeat an API
    row's measurement say DeepSeek-V3 where the API row says DeepSeek-R1; 485 repeat one in all. A row one hundredth
    of a millisecond off in TPOT is no twin."""
    database = rows["silicon_data_source"].astype(str).str.contains("db-dump/", regex=False)
    twins = rows[database & (rows["inferencex_twin"] != "")]
    originals = rows.set_index("id").loc[twins["inferencex_twin"]]
    assert len(twins) == 485
    assert (twins["model_path"].to_numpy() != originals["model_path"].to_numpy()).sum() == 391
    shifted = rows.assign(silicon_tpot_ms=rows["silicon_tpot_ms"] + database * 0.01)
    assert (inferencex_twins(shifted.copy())["inferencex_twin"][database] != "").sum() == 0


def test_aiconfigurator_sweeps_fix_every_length(rows):
    """aiconfigurator's own gap-analysis sweeps (848 rows under aic-auto-gap-analysis/) ran its benchmark, which
    fixes every length (stddev 0, ignore_eos); their wave count is not stated. The two other gap-analysis files
    repeat InferenceX runs and are not fixed-length."""
    source = rows["silicon_data_source"].astype(str)
    fixed = rows["fixed_lengths"].to_numpy(dtype=bool)
    assert fixed.sum() == 848 == source[fixed].str.contains("aic-auto-gap-analysis/").sum()
    assert rows.loc[fixed, "stated_waves"].isna().all()
    assert (rows.loc[fixed, "inferencex_twin"] == "").all()


def test_a_length_scale_prices_the_mean_lengths(rows, shipped):
    """Exact: a row at length scale 0.9 is priced as the same row stating 0.9 x its lengths at scale 1."""
    row = rows[rows["id"] == B200_FP8_MTP_ROW]
    scaled = row.assign(isl=row["isl"] * 0.9, osl=row["osl"] * 0.9, length_scale=1.0)
    a, b = predict_rows(row, shipped), predict_rows(scaled, shipped)
    for column in ("tpot_steady_s", "tpot_burst_s", "ttft_steady_s", "ttft_burst_s"):
        assert a[column].item() == b[column].item(), column


# --- SGLang's scheduler receive interval, as InferenceX's launch scripts set it -------------------------------------

RECV_SCRIPT = """
# Default: recv every ~10 requests; if CONC >= 16, relax to ~30 requests between scheduler recv polls.
if [[ $TP -eq 8 ]]; then
  if [[ $CONC -ge 16 ]]; then
    SCHEDULER_RECV_INTERVAL=30
  else
    SCHEDULER_RECV_INTERVAL=10
  fi
  MEM_FRAC_STATIC=0.82
elif [[ $TP -eq 4 ]]; then
  if [[ $ISL -ne 8192 ]] || [[ $OSL -ne 1024 ]]; then
    echo "TP=4 not yet supported for ISL=$ISL OSL=$OSL!"
    exit 1
  fi
  SCHEDULER_RECV_INTERVAL=10
else
  echo "Unrecognized TP size $TP!"
fi
python3 -m sglang.launch_server --tensor-parallel-size=$TP --scheduler-recv-interval $SCHEDULER_RECV_INTERVAL
"""
"""The structure of ``benchmarks/single_node/dsr1_fp8_b200.sh`` (InferenceX commit 12ba0ae07), read by hand: tp 8 at
16 or more concurrent requests reads every 30 decode steps, below 16 every 10; tp 4 every 10."""


@pytest.mark.parametrize("env, expected", [
    ({"TP": "8", "CONC": "64", "ISL": "1024", "OSL": "1024"}, 30.0),
    ({"TP": "8", "CONC": "16", "ISL": "1024", "OSL": "1024"}, 30.0),
    ({"TP": "8", "CONC": "8", "ISL": "1024", "OSL": "1024"}, 10.0),
    ({"TP": "4", "CONC": "64", "ISL": "8192", "OSL": "1024"}, 10.0),
    ({"TP": "2", "CONC": "64", "ISL": "8192", "OSL": "1024"}, None),  # no branch assigns it
])
def test_the_receive_interval_is_read_through_the_scripts_branches(env, expected):
    got = inferencex_builder.recv_interval(RECV_SCRIPT, env)
    assert (np.isnan(got) if expected is None else got == expected)


def test_a_branch_on_a_variable_not_known_leaves_the_interval_unknown():
    """Without TP the outer ``if`` cannot be decided: an assignment under it may or may not run."""
    assert np.isnan(inferencex_builder.recv_interval(RECV_SCRIPT, {"CONC": "64"}))
    assert inferencex_builder.recv_interval("sglang.launch_server --tp 8\n", {}) == 1.0  # SGLang's default
    assert inferencex_builder.recv_interval("x --scheduler-recv-interval 20\n", {}) == 20.0  # a literal
    twice = "x --scheduler-recv-interval 20\ny --scheduler-recv-interval 30\n"
    assert np.isnan(inferencex_builder.recv_interval(twice, {}))


def test_shell_conditions_combine_left_to_right():
    test = inferencex_builder._test
    env = {"ISL": "8192", "OSL": "1024", "DP_ATTENTION": "true"}
    assert test("[[ $ISL -ne 8192 ]] || [[ $OSL -ne 1024 ]]", env) is False
    assert test("[[ $ISL -eq 8192 ]] && [[ $OSL -eq 1024 ]]", env) is True
    assert test('[[ "$DP_ATTENTION" == "true" ]]', env) is True
    assert test("[[ $CONC -ge 16 ]] || [[ $ISL -eq 8192 ]]", env) is True  # decided without CONC
    assert test("[[ $CONC -ge 16 ]] && [[ $ISL -eq 8192 ]]", env) is None
    assert test("[ -f /tmp/x ]", env) is None  # a form not read


def test_a_row_takes_the_receive_interval_its_script_set(rows):
    """DeepSeek-R1 fp4 on 8 B200s under SGLang at 32 concurrent requests: ``dsr1_fp4_b200.sh`` reads every 30 decode
    steps from 16 requests up, every 10 below (InferenceX, every version from 2026-03-25 to 2026-05-01)."""
    interval = rows.set_index("id")[RECV_INTERVAL]
    assert interval["2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c32_tp8_0_ep8_0_294"] == 30
    assert interval["2026_03_25_deepseek_r1_b200_sxm_sglang_fp4_agg_1024x1024_c8_tp8_0_ep8_0_248"] == 10
    assert (rows[RECV_INTERVAL] > 1).sum() == 239  # 153 API rows and 86 rows repeating their measurements
    assert rows.loc[rows["backend"] != "sglang", RECV_INTERVAL].isna().all()
