"""Learned-model artifacts: the fitted regressor (joblib) beside JSON metadata.

The metadata names the data hash (SHA-256 of the training features and targets), the feature
list, the scikit-learn version and the hardware. Loading refuses an artifact whose scikit-learn
version differs from the running one (pickled trees are not portable across versions), whose
feature list differs from the code's, or whose data hash differs from the one expected.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from paraplan.errors import InputError
from paraplan.files import one_line, read_user_json

MAX_META_BYTES = 1 << 20
"""A metadata file: a few hundred bytes of settings and held-out errors."""

ARTIFACT_VERSION = 1


class Regressor(Protocol):
    """A fitted scikit-learn regressor as paraplan uses one (what ``load_artifact`` returns)."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The predicted target of each row of features ``x``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactMeta:
    """What a learned model was trained on and with."""

    target: str
    """``gemm`` or a collective name such as ``all_reduce``."""
    hardware: str
    """GPU catalog name."""
    dtype: str
    """GEMM operand type of the training data (``fp16`` serves ``bf16`` too); empty for collectives."""
    features: tuple[str, ...]
    """Feature columns in order."""
    data_hash: str
    """SHA-256 of the training features and targets."""
    sklearn_version: str
    """scikit-learn that fitted the model."""
    num_rows: int
    """Training rows."""
    held_out: dict
    """Held-out pooled score at training time (learned and analytical MAPE and worst error)."""
    base: str = ""
    """For the step calibration: the cost model whose predictions it corrects (its ``source``)."""
    domain: dict = field(default_factory=dict)
    """For collectives: the measured range (``min_size_bytes``, ``max_size_bytes``, ``max_group_size``)
    the planner may use the model inside; empty = not used for planning."""
    artifact_version: int = ARTIFACT_VERSION
    """Layout of these files."""


def models_dir(store: Path) -> Path:
    """Where learned models of ``store`` live: beside it, ``<store>.models/<hardware>/``."""
    return Path(store).with_suffix(".models")


def gemm_target(dtype: str) -> str:
    """Artifact name of the GEMM model serving ``dtype`` (16-bit GEMMs share one)."""
    return "gemm-16bit" if dtype in ("bf16", "fp16") else f"gemm-{dtype}"


def training_hash(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the training arrays."""
    digest = hashlib.sha256(np.ascontiguousarray(x, dtype=float).tobytes())
    digest.update(np.ascontiguousarray(y, dtype=float).tobytes())
    return digest.hexdigest()


def artifact_paths(directory: Path, hardware: str, target: str) -> tuple[Path, Path]:
    """(model file, metadata file) of one learned model."""
    base = Path(directory) / hardware / target
    return base.with_suffix(".joblib"), base.with_suffix(".json")


def save_artifact(directory: Path, meta: ArtifactMeta, estimator: object) -> Path:
    """Write the model and its metadata; returns the metadata path."""
    model_path, meta_path = artifact_paths(directory, meta.hardware, meta.target)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    import joblib  # loads with the artifacts that need it, not with every command

    joblib.dump({"data_hash": meta.data_hash, "estimator": estimator}, model_path)
    meta_path.write_text(json.dumps(asdict(meta), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return meta_path


def load_meta(meta_path: Path) -> ArtifactMeta:
    """The metadata at ``meta_path``; InputError when it is unreadable or of another layout."""
    raw = read_user_json(Path(meta_path), MAX_META_BYTES, "learned-model metadata file")
    document: dict[str, Any] = raw if isinstance(raw, dict) else {}  # read_user_json refuses another top level
    problem = _meta_problem(document)
    if problem is None:
        try:
            return ArtifactMeta(**{**document, "features": tuple(document["features"])})
        except TypeError as exc:  # a key ArtifactMeta does not have
            problem = str(exc)
    raise InputError(f"{meta_path}: not a paraplan learned-model metadata file ({one_line(problem, 80)}); rerun "
                     "'paraplan learn'")


def _meta_problem(raw: dict[str, Any]) -> str | None:
    """What is wrong with a metadata document's types, or None."""
    for key, kind in (("target", str), ("hardware", str), ("dtype", str), ("data_hash", str),
                      ("sklearn_version", str), ("num_rows", int), ("held_out", dict), ("features", list)):
        if not isinstance(raw.get(key), kind) or isinstance(raw.get(key), bool):
            return f"{key} must be a {kind.__name__}"
    if not all(isinstance(name, str) for name in raw["features"]):
        return "features must be a list of names"
    for key, kind in (("base", str), ("domain", dict), ("artifact_version", int)):
        if key in raw and not isinstance(raw[key], kind):
            return f"{key} must be a {kind.__name__}"
    return None


def load_artifact(directory: Path, hardware: str, target: str, features: tuple[str, ...],
                  expected_hash: str | None = None) -> tuple[ArtifactMeta, Regressor]:
    """Metadata and fitted estimator, after every check; InputError naming the mismatch."""
    model_path, meta_path = artifact_paths(directory, hardware, target)
    meta = load_meta(meta_path)
    if meta.sklearn_version != sklearn_version():
        raise InputError(f"{meta_path}: fitted with scikit-learn {meta.sklearn_version}, running "
                         f"{sklearn_version()}; rerun 'paraplan learn' to refit")
    if meta.features != tuple(features):
        raise InputError(f"{meta_path}: features {list(meta.features)} differ from this paraplan's "
                         f"{list(features)}; rerun 'paraplan learn'")
    if expected_hash is not None and meta.data_hash != expected_hash:
        raise InputError(f"{meta_path}: trained on data {meta.data_hash[:12]}, expected {expected_hash[:12]}; "
                         "rerun 'paraplan learn'")
    try:
        import joblib

        payload = joblib.load(model_path)
    except (OSError, EOFError, ValueError, TypeError, AttributeError, ImportError, KeyError,
            pickle.UnpicklingError) as exc:  # what a truncated or foreign pickle raises
        raise InputError(f"{model_path}: cannot load the learned model ({exc}); rerun 'paraplan learn'") from None
    if not isinstance(payload, dict) or payload.get("data_hash") != meta.data_hash:
        raise InputError(f"{model_path}: the model file does not match {meta_path.name} (data hash); "
                         "rerun 'paraplan learn'")
    return meta, payload["estimator"]


def sklearn_version() -> str:
    """scikit-learn's version, imported only here (it is most of every command's start-up time)."""
    import sklearn

    return sklearn.__version__
