"""Statistics that know nothing of the lab: paired binary tests and intervals (`binary`), mean, equivalence,
power and multiplicity (`inference`, `power`), Monte-Carlo p values refined near their threshold
(`monte_carlo`). Nothing here imports `bcr_core` beyond this package (a test says so)."""
