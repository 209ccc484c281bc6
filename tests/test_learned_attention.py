"""The learned attention model: held-out sequence lengths, and flash_attention_time_s deferring to it.

No public attention timings come with the project, so the measurements here are constructed: the
analytical flash time times a factor that grows with sequence length (as measured kernels do when
they leave the launch-bound regime), plus ±2% alternating noise. The test checks the mechanism and
that held-out scoring can tell a better model from a worse one, not accuracy on real hardware.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from paraplan.cost_models.compute import flash_attention_time_s
from paraplan.cost_models.learned.features import attention_rates
from paraplan.cost_models.learned.learn import learn
from paraplan.cost_models.learned.provider import compute_rates
from paraplan.errors import InputError
from paraplan.hardware_profiles import load_gpu
from paraplan.measurements.ingest import parse_file
from paraplan.measurements.store import ingest_parsed

SEQ_LENS = [256 * i for i in range(1, 33)]


def _truth(flops: np.ndarray, seq: np.ndarray, backward: bool) -> np.ndarray:
    forward_s, backward_s = flash_attention_time_s(flops, attention_rates("h100-sxm"))
    factor = 0.6 + 0.25 * np.log2(seq / 256.0) / 5.0  # 0.6 at 256 tokens, 0.85 at 8192
    return (backward_s if backward else forward_s) * factor


def _profile(tmp_path) -> object:
    rows = []
    for i, seq in enumerate(SEQ_LENS):
        for heads in (8, 16, 32):
            flops = 2.0 * 1 * heads * seq**2 * 128
            for backward in (False, True):
                noise = 1.02 if (i + heads) % 2 else 0.98
                time_s = float(_truth(np.array(flops), np.array(seq), backward)) * noise
                rows.append({"kind": "attention", "name": "sdpa", "time_s": time_s,
                             "params": {"batch": 1, "heads": heads, "kv_heads": heads, "seq_len": seq, "head_dim": 128,
                                        "pass": "backward" if backward else "forward"}})
    document = {"format": "paraplan-profile", "version": 1, "hardware": "h100-sxm", "software": "synthetic",
                "measurements": rows}
    path = tmp_path / "attention.json"
    path.write_text(json.dumps(document))
    return path


def test_attention_model_held_out_and_used(tmp_path):
    store = tmp_path / "a.sqlite"
    ingest_parsed(parse_file(_profile(tmp_path)), store)
    (target,) = learn(store)["h100-sxm"]
    score = target.scores[0]
    assert target.meta.target == "attention" and score.num_rows == 8 * 3 * 2  # 8 of 32 lengths, both passes
    assert score.learned_mape_frac < 0.05 < score.analytical_mape_frac
    rates = compute_rates("auto", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", store)
    assert rates.attention_time_fn is not None and rates.source.startswith("attention: learned (h100-sxm")
    assert "; element-wise and communication: analytical" in rates.source
    flops = 2.0 * 32 * np.array([3000.0, 5000.0]) ** 2 * 128
    forward, backward = flash_attention_time_s(flops, rates)
    truth_f = _truth(flops, np.array([3000.0, 5000.0]), False)
    truth_b = _truth(flops, np.array([3000.0, 5000.0]), True)
    np.testing.assert_allclose(forward, truth_f, rtol=0.06)
    np.testing.assert_allclose(backward, truth_b, rtol=0.06)
    unfused = compute_rates("auto", load_gpu("h100-sxm"), "bf16", "unfused", "pytorch", store)
    assert unfused.attention_time_fn is None  # the learned model is of flash-family kernels only
    analytical = compute_rates("analytical", load_gpu("h100-sxm"), "bf16", "flash", "pytorch", store)
    assert analytical.attention_time_fn is None


def test_fewer_than_eight_lengths_learns_nothing(tmp_path):
    path = _profile(tmp_path)
    document = json.loads(path.read_text())
    document["measurements"] = [m for m in document["measurements"] if m["params"]["seq_len"] <= 256 * 7]
    path.write_text(json.dumps(document))
    store = tmp_path / "b.sqlite"
    ingest_parsed(parse_file(path), store)
    with pytest.raises(InputError, match="too few measurements to learn from"):
        learn(store)
