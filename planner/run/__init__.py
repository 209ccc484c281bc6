"""The whole run over a plan's step time: days, dollars and goodput with failures and checkpoints, and sweeps."""
