"""Shared solver settings and the statistics every placement solve reports (CONVENTIONS rule 9).

An optimizer takes an instance (integer cost tables scaled by a named quantum), a
:class:`SolverConfig` and returns its own solution type that carries a :class:`SolveStats`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: OR-Tools loads where a solver runs
    from ortools.sat.python import cp_model


# A solve whose model building used up the whole limit still gets this long to return its warm start (the
# baseline hint) as a feasible answer rather than nothing.
MIN_SOLVE_S = 0.01

Status = Literal["optimal", "feasible", "heuristic"]
"""optimal: proven within the gap; feasible: a solver answer without proof; heuristic: the solver
found nothing in its time limit and the stated baseline heuristic is returned instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverConfig:
    """How long and how hard a solver may work."""

    time_limit_s: float = 10.0
    """Wall-clock limit of one whole call (building the model and solving it), seconds; a decomposed
    problem shares it among its parts."""
    relative_gap_frac: float = 0.0
    """Stop when (objective − bound) / objective is at most this (0 = prove optimality)."""
    num_workers: int = 1
    """Solver threads (1 keeps runs deterministic for a given seed)."""
    seed: int = 0
    """Random seed of the solver's search."""
    deadline: float | None = None
    """``time.monotonic()`` by which the call must end; set by :meth:`started` where the call begins, so the
    time spent building the model counts against ``time_limit_s``."""

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ValueError(f"solver time limit must be positive seconds, got {self.time_limit_s}")
        if not 0 <= self.relative_gap_frac < 1:
            raise ValueError(f"relative gap must be in [0, 1), got {self.relative_gap_frac}")
        if self.num_workers < 1:
            raise ValueError(f"solver workers must be >= 1, got {self.num_workers}")

    def started(self, now: float | None = None) -> SolverConfig:
        """A copy of the config with its deadline set, where a call begins (itself when an outer call already set
        it)."""
        if self.deadline is not None:
            return self
        return replace(self, deadline=(time.monotonic() if now is None else now) + self.time_limit_s)

    def restarted(self, time_limit_s: float | None = None, now: float | None = None) -> SolverConfig:
        """A config for a new call of its own (``time_limit_s``, default this one's), timed from ``now``."""
        return replace(self, deadline=None, time_limit_s=time_limit_s or self.time_limit_s).started(now)

    def share(self, parts: int, now: float | None = None) -> SolverConfig:
        """A config for one of ``parts`` parts still to solve: an equal share of the time left."""
        now = time.monotonic() if now is None else now
        whole = self.started(now)
        return replace(whole, deadline=now + whole.remaining_s(now) / max(parts, 1))

    def remaining_s(self, now: float | None = None) -> float:
        """Seconds the solver may still run: the limit less what the call has spent (at least MIN_SOLVE_S)."""
        if self.deadline is None:
            return self.time_limit_s
        return max(MIN_SOLVE_S, self.deadline - (time.monotonic() if now is None else now))


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveStats:
    """What a solve achieved, in the instance's own objective unit."""

    status: Status
    objective: float
    """Objective of the returned answer."""
    bound: float
    """Proven lower bound on the optimum (minimisation)."""
    wall_s: float
    """Solver wall time, seconds."""

    @property
    def gap_frac(self) -> float:
        """(objective − bound) / objective; 0 when proven optimal or the objective is 0."""
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


def run_cp_sat(model: cp_model.CpModel, config: SolverConfig, *,
               keep_hint_feasible: bool = False) -> tuple[cp_model.CpSolver, Status | None]:
    """Solve ``model``; the status is None when no solution was found in time (caller falls back).

    ``keep_hint_feasible``: forbid presolve reductions that drop feasible solutions. Without it, dual
    reductions can make a feasible hint infeasible (seen on the 256 x 64 replica model, which then
    found nothing in 20 s); with it, presolve is weaker and bounds come slower, so only models that
    need it ask.
    """
    from ortools.sat.python import cp_model  # imported where a solver runs: start-up time
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = config.remaining_s()
    solver.parameters.relative_gap_limit = config.relative_gap_frac
    solver.parameters.num_workers = config.num_workers
    solver.parameters.random_seed = config.seed
    solver.parameters.keep_all_feasible_solutions_in_presolve = keep_hint_feasible
    code = solver.solve(model)
    if code == cp_model.OPTIMAL:
        return solver, "optimal"
    if code == cp_model.FEASIBLE:
        return solver, "feasible"
    return solver, None
