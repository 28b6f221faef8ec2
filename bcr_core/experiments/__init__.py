"""Experiments: named conditions, the runner, statistics, fidelity, the unit curve, latency,
exactness checks, the claims' verdicts and grids of runs."""
