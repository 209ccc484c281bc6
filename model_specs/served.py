"""The model a serving plan deploys: its spec (mixer shapes included) and what engines are told to load (a
Hugging Face repo id or a local folder)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paraplan.model_specs.hf_checkpoint import REPO_ID, cached_config_path
from paraplan.model_specs.hf_config import load_model, preset_names
from paraplan.model_specs.model_spec import ModelSpec

PRESET_REPOS = {
    # The Hugging Face checkpoints the presets' config.json files describe (same architecture and shapes).
    "llama-2-7b": "meta-llama/Llama-2-7b-hf", "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf", "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B", "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "gpt-oss-120b": "openai/gpt-oss-120b",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1", "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedModel:
    """A model to serve and where engines load it from."""

    spec: ModelSpec
    """The model, its linear-attention and indexer shapes (``spec.mixers``) included."""
    hf_repo: str | None
    """Hugging Face repo id engines download (None for a local config)."""
    path: str | None
    """Local folder holding config.json (and the weights, for the engines), if given as a path."""

    def to_json(self) -> dict[str, object]:
        """Plain JSON for a serving plan: the model's name, repo id, local folder and parameter count."""
        return {"name": self.spec.name, "hf_repo": self.hf_repo, "path": self.path,
                "params": int(self.spec.total_params())}


def _config_file(name_or_path: str) -> Path | None:
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return path
    if name_or_path not in preset_names() and REPO_ID.match(name_or_path):
        return cached_config_path(name_or_path)
    return None


def served_model(name_or_path: str) -> ServedModel:
    """The model under ``name_or_path`` (a preset, a config.json or its folder, a cached repo id)."""
    spec = load_model(name_or_path)
    config_file = _config_file(name_or_path)
    local = Path(name_or_path).exists()
    repo = None if local else PRESET_REPOS.get(name_or_path, name_or_path if REPO_ID.match(name_or_path) else None)
    folder = str(config_file.parent.resolve()) if local and config_file is not None else None
    return ServedModel(spec=spec, hf_repo=repo, path=folder)
