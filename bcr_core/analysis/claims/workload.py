"""Whether the cost of reuse depends on the workload, on one model: the paper finds it on GSM8K and MMLU and
not on HumanEval. Two claims, each tested in its own family on its own benchmark's paired items (the item as
the unit; no test pairs items across benchmarks, which share none): the synthetic family's "reuse costs
accuracy" and the HumanEval family's "reuse costs nothing on HumanEval". The line reads their two verdicts.
"""

from __future__ import annotations

import pandas as pd

COST = "reuse costs accuracy"  # the synthetic family's row (`analysis.claims.synthetic`)
NULL = "reuse costs nothing on HumanEval"  # the HumanEval family's row (`analysis.claims.humaneval`)

READINGS = {
    ("holds", "holds"): "workload-specific: a cost on the synthetic task, none on HumanEval (as the paper finds)",
    ("holds", "does not hold"): "not workload-specific: a cost on both benchmarks",
    ("does not hold", "holds"): "no cost on either benchmark",
    ("does not hold", "does not hold"): "a cost on HumanEval only",
}


def verdict_of(table: pd.DataFrame, claim: str) -> str:
    found = table.loc[table["claim"] == claim, "verdict"]
    return found.iloc[0] if len(found) else "not measured"


def workload_line(synthetic: pd.DataFrame, humaneval: pd.DataFrame) -> str:
    """One line: the two verdicts and what they say together ("undecided" unless both are decided)."""
    cost, null = verdict_of(synthetic, COST), verdict_of(humaneval, NULL)
    said = READINGS.get((cost, null), "undecided: a verdict it needs is not decided")
    verdicts = f"synthetic: {COST} **{cost}**; HumanEval: {NULL} **{null}**"
    return f"Is the cost of reuse workload-specific? {said} ({verdicts})"
