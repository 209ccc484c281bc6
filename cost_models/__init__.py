"""The cost model: step time, memory and serving latency of candidate configurations, as numpy formulas over
the candidate table (one code path prices one configuration or ten million), with learned refinements."""
