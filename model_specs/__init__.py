"""What the model is: ModelSpec, its readers (Hugging Face config.json, presets, cached checkpoints), the model
families it understands, the inference mixer shapes, and the served model (spec plus where engines load it)."""
