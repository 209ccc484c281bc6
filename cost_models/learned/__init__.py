"""Learned cost models: features, fitting, held-out evaluation, artifacts, and the planner's provider."""
