"""What was measured: readers of profiling files (``ingest``), the profile store, the microbenchmark runner
(``profiler``) and MoE routing statistics. The cost models read from here; nothing here prices anything."""
