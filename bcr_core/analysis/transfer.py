"""Whether a claim transfers from one model to another, read from one test per claim.

Each model's verdict table is its own Holm family; no claim crosses the two without this test.
Both models ran the same items, so the test pairs items: per claim, the per-item values its own test
reads on each model (a binary outcome's difference, the draft's gain over the seeds' mean, a
residual off the line, ...), their difference per item, its mean with a bootstrap 95% interval and a
sign-flip p; for a share (a ratio of two per-item means) the difference of the two models' shares,
bootstrapped over items drawn once for both models, its p the doubled smaller tail of the draws at 0.
Holm over the transfer table. A claim

- transfers ("yes") where both verdicts decide the same way (both hold, or neither holds) and the
  difference test does not reject;
- is "not decided" where either side is undecided;
- does not transfer ("no") where the verdicts decide differently or the effects differ;
- stays "open" while a model has not measured it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core.analysis import inference as inf
from bcr_core.analysis.precision import RESAMPLES, exact

NOT_TESTED = "not measured"
DECIDED = {"holds", "does not hold"}


def difference(first: pd.Series, second: pd.Series) -> dict:
    """The per-item difference first - second on the items both hold: mean, 95% CI, sign-flip p."""
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
    }


def share_difference(first: pd.DataFrame, second: pd.DataFrame, resamples: int = 5_000, seed: int = 0) -> dict:
    """The difference of two models' shares (numerator mean / denominator mean), paired by item."""
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
    }


def reading(verdicts: list[str], rejects: bool | None) -> str:
    if NOT_TESTED in verdicts:
        return "open"
    if "undecided" in verdicts:
        return "not decided"
    if len(set(verdicts)) > 1:
        return "no"
    return "no: the effects differ" if rejects else "yes"


def transfer(tables: dict[str, pd.DataFrame], test_difference: bool = True) -> pd.DataFrame:
    """Per claim, each model's verdict, effect and n, the difference test of the first two models'
    per-item values (tables from `claims.verdicts`, whose `attrs["per_item"]` hold them; none where
    `test_difference` is off), its Holm p over the table, and whether the claim transfers."""
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
        values = [tables[m].attrs.get("per_item", {}).get(claim) for m in models[:2]]
        parts = [tables[m].attrs.get("parts", {}).get(claim) for m in models[:2]]
        if not test_difference or len(models) < 2:
            pass
        elif all(v is not None for v in parts):
            row |= share_difference(*parts)
        elif all(v is not None for v in values):
            row |= difference(*values)
        rows.append(row)
    out = pd.DataFrame(rows)
    if "diff_p" not in out:
        out["diff_p"] = None
    out["diff_p_holm"] = inf.holm([None if pd.isna(p) else p for p in out["diff_p"]])
    out["transfers"] = [
        reading(
            [r[f"{m}: verdict"] for m in models], None if pd.isna(r["diff_p_holm"]) else r["diff_p_holm"] < inf.ALPHA
        )
        for _, r in out.iterrows()
    ]
    return out
