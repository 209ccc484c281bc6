"""paraplan: plan distributed training of transformers.

The code lives in one-way layers, installed as sub-packages of this one:
``hardware_profiles`` → ``cost_models`` → ``planner`` → ``exporters`` → ``cli``.
"""

__version__ = "0.1.0"
