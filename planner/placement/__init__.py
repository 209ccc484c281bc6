"""Placement optimizers: ranks on GPUs, layers on stages, experts on ranks, mixed GPU types.

Each is an integer program (CP-SAT or a PuLP MILP) with a stated heuristic baseline that is passed
to the solver as a hint and returned when the solver finds nothing in its time limit.
"""
