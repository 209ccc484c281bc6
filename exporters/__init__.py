"""Launch configurations from plans: Megatron-LM, DeepSpeed, torchtitan, SLURM, Kubernetes and JSON.

The fourth layer: ``hardware_profiles → cost_models → planner → exporters → cli``. Exporters read a
plan document (what ``paraplan plan --json`` writes), never the search, and return file contents;
only ``writer`` touches the output folder.
"""
