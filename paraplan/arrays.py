"""The one type for the cost model's array-or-scalar values.

Every formula in ``cost_models/`` is written with numpy so the same function prices one configuration (plain
floats) or a column of ten million candidates (one array entry per row of the candidate table); ``Column`` names
that contract in signatures. Ground floor: numpy only.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

Column: TypeAlias = float | np.ndarray
"""A float value, or one per candidate row (numpy broadcasts the same formula over both)."""
IntColumn: TypeAlias = int | np.ndarray
"""An integer value (a degree, a count, a code), or one per candidate row."""
