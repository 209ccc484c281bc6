"""The serving search: worker shardings, per-pool pricing, load and queueing, ranking, fleets and the plan document."""
