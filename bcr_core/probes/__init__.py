"""Probes: measurements made directly on a model, outside `bcr run`'s records: the exactness checks
(`verify`), a short demonstration (`demo`), the unit-of-choice curve (`unit_curve`), time to first
token (`latency`) and the work a timed call cannot avoid (`bound`)."""
