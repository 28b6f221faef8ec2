"""Whether a claim transfers from one model to another, read from one test per claim.

Each model's verdict table is its own Holm family; no claim crosses the two without this test.
Both models ran the same items, so the test pairs items: per claim, the per-item values its own test
reads on each model (a binary outcome's difference, the draft's gain over the seeds' mean, a
residual off the line, ...), their difference per item, its mean with a bootstrap 95% interval and a
sign-flip p; for a share (a ratio of two per-item means) the difference of the two models' shares,
bootstrapped over items drawn once for both models, its p the doubled smaller tail of the draws at 0.
Beside it, an equivalence test of the same difference: TOST within ±`TRANSFER_MARGIN` of the row's
measure (one-sided t-tests on per-item values; for a share, the bootstrap draws). Holm over the
transfer table, for each of the two tests. A claim

- transfers ("yes") where the two models' effects are equivalent within the margin (Holm TOST p
  below alpha), whatever the verdicts' labels;
- does not transfer ("no") where the difference test rejects (Holm);
- is "not decided" otherwise (including two labels that differ on effects no test tells apart);
- stays "open" while a model has not measured it.

An exactness check (a deterministic identity, no sampling) transfers where both models give the same
result. Without a difference test (`test_difference=False`, the arena's per-item KL on two models' own
scales) nothing is tested across models: the column says only whether the two verdicts are the same
("same verdict").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core.analysis.statistics import inference as inf
from bcr_core.analysis.statistics.monte_carlo import RESAMPLES, exact

NOT_TESTED = "not measured"
# The equivalence margin of a transfer, on the measure both models' rows read (the lab's null-claim
# margin on points; a tenth of the gap on a share). KL has none: its scale is each model's own.
TRANSFER_MARGIN = {"correct": 0.03, "agrees_dense": 0.03, "gap share": 0.03, "share": 0.10}


def difference(first: pd.Series, second: pd.Series, margin: float | None = None) -> dict:
    """The per-item difference first - second on the items both hold: mean, 95% CI, sign-flip p, and
    given a `margin` the TOST p of equivalence within it (one-sided t-tests)."""
    both = first.index.intersection(second.index)
    d = (first.loc[both] - second.loc[both]).to_numpy(float)
    if d.size == 0:
        return {"diff": np.nan, "diff_lo": np.nan, "diff_hi": np.nan, "diff_p": None, "diff_n": 0}
    lo, hi = inf.bootstrap_ci(d)
    p = inf.sign_flip(d)
    resamples = None if exact(d.size, RESAMPLES) else RESAMPLES
    return {
        "diff": float(d.mean()),
        "diff_lo": lo,
        "diff_hi": hi,
        "diff_p": p,
        "diff_n": int(d.size),
        "diff_r": resamples,
        "tost_p": None if margin is None else inf.t_tost(d, margin),
    }


def share_difference(
    first: pd.DataFrame, second: pd.DataFrame, margin: float | None = None, resamples: int = 5_000, seed: int = 0
) -> dict:
    """The difference of two models' shares (numerator mean / denominator mean), paired by item, and
    given a `margin` the TOST p of equivalence within it from the same bootstrap draws."""
    both = first.index.intersection(second.index)
    a, b = first.loc[both].to_numpy(float), second.loc[both].to_numpy(float)
    if len(both) == 0:
        return {"diff": np.nan, "diff_lo": np.nan, "diff_hi": np.nan, "diff_p": None, "diff_n": 0}

    def share(rows):
        return rows[:, 0].mean() / rows[:, 1].mean() if rows[:, 1].mean() else np.nan

    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        pick = rng.integers(0, len(both), len(both))
        draws.append(share(a[pick]) - share(b[pick]))
    draws = np.asarray(draws)
    draws = draws[~np.isnan(draws)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    p = min(1.0, 2 * min((draws <= 0).mean(), (draws >= 0).mean()) + 1 / (len(draws) + 1))
    return {
        "diff": float(share(a) - share(b)),
        "diff_lo": float(lo),
        "diff_hi": float(hi),
        "diff_p": float(p),
        "diff_n": len(both),
        "share": True,
        "tost_p": None if margin is None else inf.bootstrap_tost(draws, margin),
    }


def reading(verdicts: list[str], differs: bool, equivalent: bool) -> str:
    if NOT_TESTED in verdicts:
        return "open"
    return "no" if differs else "yes" if equivalent else "not decided"


def same_verdict(verdicts: list[str]) -> str:
    if NOT_TESTED in verdicts:
        return "open"
    return "yes" if len(set(verdicts)) == 1 else "no"


def held(p) -> bool:
    return p is not None and not pd.isna(p) and p < inf.ALPHA


def transfer(tables: dict[str, pd.DataFrame], test_difference: bool = True) -> pd.DataFrame:
    """Per claim, each model's verdict, effect and n, and for each later model the difference test of its
    per-item values against the first model's (tables from `claims.verdicts`, whose `attrs["per_item"]` hold
    them; none where `test_difference` is off), Holm over every comparison of the table, and whether the
    claim transfers. With two models the comparison's columns are `diff`, ..., `transfers`; with more, each
    is named `"<model> vs <first>: diff"`, ... (`comparison_prefix`)."""
    models = list(tables)
    claims_in_order = list(dict.fromkeys(c for table in tables.values() for c in table["claim"]))
    rows = []
    for claim in claims_in_order:
        row: dict = {"claim": claim}
        for model, table in tables.items():
            mine = next(table[table["claim"] == claim].itertuples(), None)
            row[f"{model}: verdict"] = NOT_TESTED if mine is None else mine.verdict
            for field in ("measure", "effect", "ci_lo", "ci_hi", "n"):
                row[f"{model}: {field}"] = None if mine is None else getattr(mine, field)
        measures = {row[f"{m}: measure"] for m in models} - {None}
        kinds = {getattr(mine, "kind", None) for mine in mine_rows(tables, claim)}
        row["exact"] = "exact" in kinds  # a deterministic check: the same result or not, no test
        row["margin"] = TRANSFER_MARGIN.get(measures.pop()) if len(measures) == 1 and not row["exact"] else None
        if test_difference:
            for other in models[1:]:
                tested = compared(tables, claim, models[0], other, row["margin"])
                row |= {comparison_prefix(models, other) + k: v for k, v in tested.items()}
        rows.append(row)
    out = pd.DataFrame(rows)
    if not test_difference:
        out["same verdict"] = [same_verdict([r[f"{m}: verdict"] for m in models]) for _, r in out.iterrows()]
        return out
    prefixes = [comparison_prefix(models, other) for other in models[1:]]
    for column in ("diff_p", "tost_p"):  # one Holm family per test over every comparison of the table
        names = [prefix + column for prefix in prefixes]
        for name in names:
            if name not in out:
                out[name] = None
        pooled = [None if pd.isna(p) else p for name in names for p in out[name]]
        adjusted = inf.holm(pooled)
        for i, name in enumerate(names):
            out[name + "_holm"] = adjusted[i * len(out) : (i + 1) * len(out)]
    for other, prefix in zip(models[1:], prefixes):
        out[prefix + "transfers"] = [comparison_reading(r, models[0], other, prefix) for _, r in out.iterrows()]
    return out


def comparison_reading(row, first: str, other: str, prefix: str) -> str:
    """Whether one claim transfers from `first` to `other`: an exactness check by its two results, else by the
    comparison's Holm-adjusted difference and equivalence tests."""
    labels = [row[f"{first}: verdict"], row[f"{other}: verdict"]]
    if row["exact"]:
        return same_verdict(labels)
    return reading(labels, held(row[prefix + "diff_p_holm"]), held(row[prefix + "tost_p_holm"]))


def comparison_prefix(models: list[str], other: str) -> str:
    """The prefix of a comparison's columns: none with two models, else `"<other> vs <first>: "`."""
    return "" if len(models) == 2 else f"{other} vs {models[0]}: "


def compared(tables: dict[str, pd.DataFrame], claim: str, first: str, other: str, margin) -> dict:
    """The paired difference of one claim's per-item values on `first` and `other` (a share's by bootstrap)."""
    parts = [tables[m].attrs.get("parts", {}).get(claim) for m in (first, other)]
    values = [tables[m].attrs.get("per_item", {}).get(claim) for m in (first, other)]
    if all(v is not None for v in parts):
        return share_difference(*parts, margin=margin)
    if all(v is not None for v in values):
        return difference(*values, margin=margin)
    return {}


def mine_rows(tables: dict[str, pd.DataFrame], claim: str) -> list:
    return [row for table in tables.values() for row in table[table["claim"] == claim].itertuples()]
