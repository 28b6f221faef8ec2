"""The tokenization tax as the paper states it (§4.3, App. F): the reuse gap splits into a
tokenization term (Dense minus token-matched Dense: same computation, the reuse path's ids) and an
approximation term (token-matched Dense minus KVComm: same ids, a predicted cache); repair recovers
part of the second and cannot touch the first. All on accuracy, the paper's measure (it prices the tax
at 6.7 points of MMLU accuracy); agreement with Dense cannot price it, since Dense agrees with itself
on every item and token-matched Dense cannot be ahead of it there.

Each claim is one member of the model's Holm family, over items:

- `tax_claim`: the tokenization term is positive (exact McNemar), with the approximation term and the
  tokenization share of the gap, (Dense - token-matched) / (Dense - KVComm), as evidence;
- `approximation_claim`: the approximation term is positive (token-matched Dense vs KVComm, exact
  McNemar; the paper: 25/48, p = 0.010);
- `untouched_claim`: repair stays at or below token-matched Dense, "whatever its budget": at each
  budget measured (the grid's rho 0.2, and 0.4 where a cell ran it), its accuracy minus token-matched
  Dense's is below `LINE_MARGIN` (1.6 points, the paper's own tolerance), one-sided t-test over items;
  the row is the budget with the largest p (it holds only where every budget holds). It does not hold
  when a budget's 95% interval lies wholly above the margin (a repair that reaches Dense past a tax
  larger than the margin). Full repair (rho = 1) is token-matched Dense by construction, the identity
  `bcr verify` checks;
- `recovered_text`: the share of the approximation term BCR recovers, (BCR - KVComm) /
  (token-matched Dense - KVComm) with a bootstrap interval: description beside BCR vs KVComm, whose
  per-item difference is its numerator.

`identity_check` keeps the separability check outside the family: on items whose reuse-path ids
equal Dense's on every call, token-matched Dense is fed Dense's very ids and must equal it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core.analysis.claims.protocol import LINE_MARGIN, MEASURES, Verdict, beside, binary_claim, paired
from bcr_core.analysis.statistics import inference as inf

PAPER = "§4.3, App. F"


def distance(items: pd.DataFrame, measure: str, *conditions: str) -> pd.DataFrame:
    """Per item and condition, the distance to Dense on `measure`: 1 - agreement or 1 - accuracy
    for a binary outcome, the per-item mean KL itself for `kl_mean`."""
    table = paired(items, measure, *conditions).astype(float)
    return table if measure == "kl_mean" else 1.0 - table


def share_ci(numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float, float]:
    """A ratio of two per-item means and its percentile bootstrap 95% interval over items."""
    both = np.column_stack([numerator, denominator])

    def ratio(rows):
        return rows[:, 0].mean() / rows[:, 1].mean() if rows[:, 1].mean() != 0 else np.nan

    if denominator.mean() == 0:
        return np.nan, np.nan, np.nan
    draws = inf.bootstrap_draws(both, ratio)
    lo, hi = np.nanpercentile(draws, [2.5, 97.5])
    return float(ratio(both)), float(lo), float(hi)


def tax_claim(items, dense, matched, kvcomm, measure="correct") -> Verdict:
    """Reuse pays a tokenization tax: Dense right where token-matched Dense is not (exact McNemar)."""
    far = distance(items, measure, dense, matched, kvcomm)
    tokenization, approximation = far[matched] - far[dense], far[kvcomm] - far[matched]
    claim, test = "reuse pays a tokenization tax", "Dense vs token-matched Dense on every item, exact McNemar"
    table = paired(items, measure, dense, matched).astype(bool)
    row = binary_claim(claim, PAPER, measure, test, table[dense], table[matched])
    lo, hi = inf.bootstrap_ci(approximation.to_numpy())
    share, s_lo, s_hi = share_ci(tokenization.to_numpy(), (tokenization + approximation).to_numpy())
    row.evidence += (
        f"; tokenization term {scaled(tokenization.mean(), measure)}, approximation term "
        f"{scaled(approximation.mean(), measure)} [{scaled(lo, measure)}, {scaled(hi, measure)}]; "
        f"tokenization share of the gap {100 * share:.0f}% [{100 * s_lo:.0f}, {100 * s_hi:.0f}]; "
        + beside(items, dense, matched)
    )
    return row


def approximation_claim(items, matched, kvcomm, measure="correct") -> Verdict:
    """The approximation costs accuracy: token-matched Dense right where KVComm is not (exact McNemar)."""
    table = paired(items, measure, matched, kvcomm).astype(bool)
    test = "token-matched Dense vs KVComm on every item (the same ids, a predicted cache), exact McNemar"
    row = binary_claim("the approximation costs accuracy", PAPER, measure, test, table[matched], table[kvcomm])
    row.evidence += "; " + beside(items, matched, kvcomm)
    return row


def untouched_claim(items, matched, repairs: list[str], measure="correct") -> Verdict:
    """Repair cannot touch the tax, "whatever its budget": each of `repairs` (one repair at the budgets
    measured) at or below token-matched Dense within LINE_MARGIN, by a one-sided t-test over items of
    token-matched Dense minus the repair (+ = the repair below). The claim is each budget's, so it holds
    only where every budget's does: the row is the budget with the largest p (intersection-union),
    every budget's effect beside it."""
    budgets = {r: untouched_at(items, matched, r, measure) for r in repairs}
    repaired, row = max(budgets.items(), key=lambda pair: pair[1].p)
    if len(budgets) > 1:
        each = "; ".join(f"{r}: {signed(b, measure)} below, p {b.p:.2g}" for r, b in budgets.items())
        row.read_on = f"{repaired}, the largest p of {len(budgets)} budgets"
        row.evidence += f"; at each budget measured: {each}"
    else:
        row.evidence += "; read at the grid's budget only"
    row.evidence += "; full repair (rho = 1) is token-matched Dense by construction (the identity `bcr verify` checks)"
    return row


def untouched_at(items, matched, repaired, measure) -> Verdict:
    """The claim at one budget: `repaired` at or below token-matched Dense within LINE_MARGIN."""
    table = paired(items, measure, matched, repaired).astype(float)
    gap = table[matched] - table[repaired]
    lo, hi = inf.t_interval(gap, 0.95)
    test = (
        f"{repaired} at or below token-matched Dense: its lead over it under {100 * LINE_MARGIN:g} pts "
        "(the paper's 1.6-point tolerance), one-sided t-test over items"
    )
    claim = "repair cannot touch the tokenization tax"
    row = Verdict(claim, PAPER, measure, test, "undecided", float(gap.mean()), lo, hi, n=len(gap))
    row.p, row.kind, row.margin = inf.t_noninferior(gap, LINE_MARGIN), "noninferiority", LINE_MARGIN
    row.per_item = gap
    row.evidence = (
        f"{MEASURES.get(measure, measure)}: {repaired} {100 * table[repaired].mean():.1f}%, token-matched "
        f"Dense {100 * table[matched].mean():.1f}%; {beside(items, matched, repaired)}"
    )
    return row


def recovered_text(items, matched, kvcomm, repaired, measure="correct") -> str:
    """The share of the approximation term `repaired` recovers, with its bootstrap interval (description).
    KL is read as a cost (lower is better), so a repair that lowers it recovers a positive amount."""
    y = paired(items, measure, matched, kvcomm, repaired).astype(float)
    y = -y if measure == "kl_mean" else y
    recovered, term = y[repaired] - y[kvcomm], y[matched] - y[kvcomm]
    share, lo, hi = share_ci(recovered.to_numpy(), term.to_numpy())
    return (
        f"recovers {scaled(recovered.mean(), measure)} of the {scaled(term.mean(), measure)} approximation term: "
        f"{100 * share:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] of the approximation term"
    )


def identity_check(items, calls, dense, matched, measure) -> Verdict:
    """Where the reuse path's ids equal Dense's on every call, token-matched Dense is Dense: an
    exactness check (no test, outside the family)."""
    claim = "token-matched Dense is Dense where the ids coincide"
    own = calls[calls["condition"] == matched]
    clean = set(own.groupby("item_id")["ids_match"].all().loc[lambda s: s].index)
    table = paired(items, measure, dense, matched).astype(bool)
    table = table[table.index.isin(clean)]
    test = "every item whose reuse-path ids equal Dense's on every call: identical outcomes, no test"
    share = 100 * float(own["ids_match"].mean()) if len(own) else 0.0
    if table.empty:
        evidence = f"no item with ids alike on every call (identical on {share:.0f}% of calls)"
        return Verdict(claim, "§4.3, Table 5a", measure, test, "not measured", evidence=evidence, kind="exact")
    differ = int((table[dense] != table[matched]).sum())
    evidence = f"{differ} of {len(table)} such items differ; ids identical on {share:.0f}% of calls"
    verdict = "holds" if differ == 0 else "does not hold"
    return Verdict(claim, "§4.3, Table 5a", measure, test, verdict, n=len(table), evidence=evidence, kind="exact")


def signed(row: Verdict, measure: str) -> str:
    """A row's effect and 95% interval, signed: `+0.5 pts [+0.2, +0.8]`."""
    scale, form, unit = (1, "+.4f", "") if measure == "kl_mean" else (100, "+.1f", " pts")
    return f"{scale * row.effect:{form}}{unit} [{scale * row.ci_lo:{form}}, {scale * row.ci_hi:{form}}]"


def scaled(value: float, measure: str) -> str:
    return f"{value:.4f}" if measure == "kl_mean" else f"{100 * value:.1f} pts"
