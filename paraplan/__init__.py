"""paraplan: plan distributed training of transformers.

The code lives in one-way layers, installed as sub-packages of this one:
``hardware_profiles`` → ``cost_models`` → ``planner`` → ``exporters`` → ``cli``.
The library entry points (``paraplan/api.py``) load on first use, so ``import paraplan`` stays light:
``paraplan.plan``, ``paraplan.evaluate``, ``paraplan.plan_document``, ``paraplan.PlanResult``, ``paraplan.InputError``,
and ``paraplan.evaluate_file`` / ``paraplan.plan_file`` for a job a launch script, log or engine config describes;
``paraplan.serve`` plans a serving deployment (``paraplan/serving_api.py``).
"""

from __future__ import annotations

import os
from typing import Any

from paraplan.version import __version__

# Run from a source checkout without installing, the sub-packages sit beside this folder under their own names
# (pyproject's package-dir maps them into the package on install): let them be found there as well. An install
# has no such folders beside the package, so this adds nothing there.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_CHECKOUT, "cost_models", "__init__.py")) and _CHECKOUT not in __path__:
    __path__.append(_CHECKOUT)

__all__ = ["InputError", "PlanResult", "ServeResult", "__version__", "evaluate", "evaluate_file", "plan",
           "plan_document", "plan_file", "serve"]


def __getattr__(name: str) -> Any:
    """The API on first use (PEP 562): importing it pulls in numpy, pandas and the cost model."""
    if name == "InputError":
        from paraplan.errors import InputError

        return InputError
    if name in ("plan", "evaluate", "plan_document", "PlanResult", "evaluate_file", "plan_file"):
        from paraplan import api

        return getattr(api, name)
    if name in ("serve", "ServeResult"):
        from paraplan import serving_api

        return getattr(serving_api, name)
    raise AttributeError(f"module 'paraplan' has no attribute {name!r}")
