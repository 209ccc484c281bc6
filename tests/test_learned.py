"""Learned models on the real vidur profiles: held-out accuracy that can fail, artifacts that round-trip."""

from __future__ import annotations

import json

import joblib
import numpy as np
import pytest
from profiles_factory import H100_ALL_REDUCE, PHI2_H100, h100_files, need_vidur, store_with

from paraplan.cost_models.learned.artifacts import artifact_paths, load_artifact, models_dir
from paraplan.cost_models.learned.evaluate import evaluate_collective, evaluate_gemm, held_out_sizes
from paraplan.cost_models.learned.features import GEMM_FEATURES, baseline_rates
from paraplan.cost_models.learned.learn import learn
from paraplan.cost_models.learned.provider import gemm_predictor
from paraplan.errors import InputError
from paraplan.measurements.store import load_measurements


@pytest.fixture(scope="module")
def h100_store(tmp_path_factory):
    need_vidur()
    return store_with(tmp_path_factory.mktemp("h100"), h100_files())


def test_gemm_leave_one_model_out_beats_analytical(h100_store):
    frame = load_measurements(h100_store, "h100-sxm", "gemm")
    scores = evaluate_gemm(frame, "h100-sxm", "fp16")
    pooled, folds = scores[0], scores[1:]
    assert len(folds) == 6 and pooled.num_rows == len(frame) == sum(f.num_rows for f in folds)
    assert pooled.learned_mape_frac <= 0.08  # the target
    assert pooled.learned_mape_frac < 0.5 * pooled.analytical_mape_frac
    assert all(f.learned_mape_frac < f.analytical_mape_frac for f in folds)


def test_all_reduce_held_out_sizes(h100_store):
    frame = load_measurements(h100_store, "h100-sxm", "collective")
    held = held_out_sizes(frame["size_bytes"])
    assert 0.2 < held.mean() < 0.3
    assert not set(frame.loc[held, "size_bytes"]) & set(frame.loc[~held, "size_bytes"])
    (score,) = evaluate_collective(frame, "h100-sxm", "all_reduce")
    assert score.num_rows == int(held.sum())
    assert score.learned_mape_frac <= 0.10 and score.learned_mape_frac < score.analytical_mape_frac


@pytest.fixture(scope="module")
def small_learned(tmp_path_factory):
    need_vidur()
    store = store_with(tmp_path_factory.mktemp("small"), [PHI2_H100, H100_ALL_REDUCE])
    return store, learn(store)


def test_learn_saves_artifacts_that_round_trip(small_learned):
    store, learned = small_learned
    targets = {t.meta.target: t for t in learned["h100-sxm"]}
    assert set(targets) == {"gemm-16bit", "all_reduce"}
    meta, estimator = load_artifact(models_dir(store), "h100-sxm", "gemm-16bit", GEMM_FEATURES,
                                    targets["gemm-16bit"].meta.data_hash)
    assert meta == targets["gemm-16bit"].meta
    predict = gemm_predictor(estimator, baseline_rates("h100-sxm", "fp16"))
    m = np.array([1.0, 512.0, 4096.0])
    twice = predict(m, 7680.0, 2560.0), predict(m, 7680.0, 2560.0)
    np.testing.assert_array_equal(twice[0], twice[1])
    frame = load_measurements(store, "h100-sxm", "gemm")
    row = frame[(frame["m"] == 4096) & (frame["name"] == "attn_pre_proj")].iloc[0]
    assert predict(4096.0, row["n"], row["k"]) == pytest.approx(row["time_s"], rel=0.1)  # a training row


def test_loading_refuses_other_sklearn_or_data(small_learned):
    store, _ = small_learned
    directory = models_dir(store)
    with pytest.raises(InputError, match="trained on data .* expected 000000000000"):
        load_artifact(directory, "h100-sxm", "all_reduce", load_meta_features(directory), "0" * 64)
    _, meta_path = artifact_paths(directory, "h100-sxm", "all_reduce")
    raw = json.loads(meta_path.read_text())
    raw["sklearn_version"] = "0.0.1"
    meta_path.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="fitted with scikit-learn 0.0.1.*rerun 'paraplan learn'"):
        load_artifact(directory, "h100-sxm", "all_reduce", tuple(raw["features"]))


def load_meta_features(directory):
    _, meta_path = artifact_paths(directory, "h100-sxm", "all_reduce")
    return tuple(json.loads(meta_path.read_text())["features"])


def test_learn_unknown_hardware(small_learned):
    store, _ = small_learned
    with pytest.raises(InputError, match="no measurements for 'a100-sxm-80gb' \\(it has: h100-sxm\\)"):
        learn(store, "a100-sxm-80gb")


def test_loading_refuses_a_model_file_of_other_data(small_learned):
    store, _ = small_learned
    directory = models_dir(store)
    model_path, _ = artifact_paths(directory, "h100-sxm", "gemm-16bit")
    payload = joblib.load(model_path)
    joblib.dump({**payload, "data_hash": "f" * 64}, model_path)
    with pytest.raises(InputError, match="does not match gemm-16bit.json \\(data hash\\)"):
        load_artifact(directory, "h100-sxm", "gemm-16bit", GEMM_FEATURES)
    model_path.write_bytes(b"\x80\x04garbage")
    with pytest.raises(InputError, match="cannot load the learned model"):
        load_artifact(directory, "h100-sxm", "gemm-16bit", GEMM_FEATURES)
