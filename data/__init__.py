"""Files shipped with paraplan: model presets (Hugging Face style config.json) and reference runs."""
