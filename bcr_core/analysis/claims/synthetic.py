"""The paper's claims as tests on run records, each ending in a verdict (notebook 10).

Each claim names the conditions it compares and hands their per-item outcomes to the protocol of
`bcr_core.analysis.claims.protocol` (the item as the unit, coin seeds as one control, budgets matched
in rows, intervals, equivalence for null claims, Holm over the table). One family per model, on
accuracy (the paper's measure); each distinct comparison is tested once, and agreement with Dense
and KL to Dense are printed beside it. Nothing here tunes anything: the records are what they are.
"""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis.claims import line, tax
from bcr_core.analysis.claims.protocol import (
    MIN_EFFECT,
    REPAIR_MARGIN,
    ROW_TOLERANCE,
    Verdict,
    beside,
    binary_claim,
    family,
    mean_claim,
    paired,
    ran,
    read_by_tango,
    rows_differ,
    rows_text,
    with_agreement,
)
from bcr_core.analysis.statistics import inference as inf
from bcr_core.analysis.statistics import power
from bcr_core.analysis.statistics.binary import mcnemar_exact
from bcr_core.conditions import find, parse, with_options

EXACT_TOLERANCE = 1e-4  # the largest repaired-vs-Dense cache difference full repair may leave (fp32)


def gate_points(items: pd.DataFrame, conditions: list[str]) -> pd.DataFrame:
    """Equation 3's points: for each of `conditions` recorded in `items` (each found by its settings,
    in the order given; Dense and the line's reuse endpoint first), its mean reuse rate and its
    accuracy in percent, both over the items every one of them ran (paired)."""
    recorded = list(items["condition"].unique())
    on_line = [found for found in (find(recorded, c) for c in conditions) if found in recorded]
    return pd.DataFrame(
        {
            "condition": on_line,
            "reuse_rate": paired(items, "reuse_rate", *on_line).mean().values,
            "accuracy": 100 * paired(items, "correct", *on_line).astype(float).mean().values,
        }
    )


def coin_seeds(condition: str, conditions: list[str], match: str = "none") -> list[str]:
    """The coins paired with a BCR condition: the same layout, budget and options, any seed, and
    `match` (`none`: the layout's own budget; `bcr-chunk`: the draft's rows on each call)."""
    name, value, options = parse(condition).settings
    twin = name.replace("bcr-", "coin-")
    own = dict(options)
    out = []
    for c in conditions:
        other, other_value, other_options = parse(c).settings
        rest = {k: v for k, v in other_options if k not in ("seed", "match")}
        if (other, other_value) == (twin, value) and rest == own and dict(other_options)["match"] == match:
            out.append(c)
    return out


def budgets_of(conditions: list[str], repair: str) -> list[str]:
    """`repair` and every recorded condition that runs the same repair at another budget, by budget."""
    name, _, options = parse(repair).settings
    same = [c for c in conditions if parse(c).settings[::2] == (name, options)]
    return sorted(same, key=lambda c: parse(c).settings[1])


def row_matched(condition: str, bcr: str, conditions: list[str]) -> str | None:
    """The recorded twin of `condition` that recomputes exactly `bcr`'s rows on each call."""
    name, value, options = parse(condition).settings
    layout = parse(bcr).name
    for c in conditions:
        other, other_value, other_options = parse(c).settings
        same = {k: v for k, v in other_options if k != "match"} == {k: v for k, v in options if k != "match"}
        if (other, other_value) == (name, value) and same and dict(other_options).get("match") == layout:
            return c
    return None


# ------------------------------------------------------------------------------- the claims
def pair_claim(items, calls, claim, paper, measure, better, worse, test_name) -> Verdict:
    """Two conditions on a binary measure: exact McNemar, the other measures beside it."""
    table = paired(items, measure, better, worse).astype(bool)
    row = binary_claim(claim, paper, measure, f"{test_name}: per item, exact McNemar", table[better], table[worse])
    row.evidence += "; " + beside(items, better, worse)
    row.rows = rows_text(calls, better, worse, table.index)
    return row


def level_claim(items, calls, paper, measure, bcr, other, test_name) -> Verdict:
    """BCR-chunk level with another repair at matched cost: TOST within ±REPAIR_MARGIN on the per-item
    difference, by Tango's score tests where both are pass/fail per item (a t-test on a few discordant items
    reads their rarity as precision) and one-sided t-tests otherwise; the two-sided exact McNemar beside it."""
    table = paired(items, measure, bcr, other).astype(float)
    d = table[bcr] - table[other]
    both, b_only, o_only, neither = inf.table_of(table[bcr] == 1, table[other] == 1)
    binary = bool(table[[bcr, other]].isin([0.0, 1.0]).all().all())
    test = (
        f"{test_name}: per-item difference within ±{100 * REPAIR_MARGIN:g} pts (the paper's smallest claimed "
        "gap between two repairs, the draft over a coin), TOST by "
        + ("Tango's score tests on the paired items" if binary else "one-sided t-tests over items")
    )
    lo, hi = inf.paired_difference_ci(both, b_only, o_only, neither)
    evidence = (
        f"{b_only}/{o_only} (items only BCR-chunk / only the other gets); two-sided exact McNemar p "
        f"{mcnemar_exact(b_only, o_only):.2g}; " + beside(items, bcr, other)
    )
    row = Verdict("BCR is level with CacheBlend at matched cost", paper, measure, test, "undecided", float(d.mean()))
    row.ci_lo, row.ci_hi, row.n, row.evidence, row.kind = lo, hi, len(d), evidence, "equivalence"
    if binary:
        read_by_tango(row, b_only, o_only, REPAIR_MARGIN)
    else:
        row.p, row.margin = inf.t_tost(d, REPAIR_MARGIN), REPAIR_MARGIN
        row.tost_lo, row.tost_hi = inf.t_interval(d, 0.90)
        row.items_needed = power.tost_items_needed(d, REPAIR_MARGIN)
    row.per_item = d
    row.rows = rows_text(calls, bcr, other, table.index)
    return row


def coin_claim(items, calls, claim, paper, measure, draft, coins, nominal: list[str]) -> Verdict:
    """The draft against its coin's seeds as one control: per item the draft minus the seeds' mean."""
    table = paired(items, measure, draft, *coins).astype(float)
    mean_coin = table[coins].mean(axis=1)
    gain = (mean_coin - table[draft]) if measure == "kl_mean" else (table[draft] - mean_coin)
    # per seed, the items only the draft gets and only the coin gets (binary outcomes)
    splits = {c: inf.table_of(table[draft] == 1, table[c] == 1)[1:3] for c in coins} if measure != "kl_mean" else {}
    test = f"draft vs the mean of {len(coins)} coin seeds per item, sign-flip over items"
    row = mean_claim(claim, paper, measure, test, gain)
    per_seed = [
        f"seed {parse(c).option('seed')}: " + (f"{splits[c][0]}/{splits[c][1]}" if splits else f"{table[c].mean():.4f}")
        for c in coins
    ]
    own = f"draft {table[draft].mean():.4f}" if measure == "kl_mean" else f"draft {100 * table[draft].mean():.1f}%"
    row.evidence = f"{own}; per seed (description): " + "; ".join(per_seed) + "; " + beside(items, draft, *coins)
    row.rows = rows_text(calls, draft, coins[0], table.index)
    if nominal and nominal != coins:
        row.read_on = f"row-matched coin (the chunk-count coin: {rows_text(calls, draft, nominal[0], table.index)})"
    elif not nominal:
        row.read_on = "row-matched coin (no chunk-count coin recorded)"
    return row


def unit_claim(per_prompt: pd.DataFrame | None) -> Verdict:
    """Informed choice is worth more at small units (Table 8), at budget-matched units only: the
    per-prompt gap (random error minus informed error, as a share of the unrepaired error) at the
    smallest unit minus at the largest unit whose realised budget is within 5% of the smallest's;
    sign-flip over prompts (exact at a few prompts)."""
    claim, paper, measure = "informed choice loses value as the unit grows", "§4.2, Table 8", "gap share"
    if per_prompt is None or per_prompt.empty:
        return Verdict(claim, paper, measure, "gap share by unit", "not measured", evidence="no unit-curve records")
    budget = per_prompt.groupby("unit")["budget_realised"].mean()
    small = budget.index.min()
    matched = [u for u in budget.index if abs(budget[u] - budget[small]) <= ROW_TOLERANCE * budget[small]]
    printed = ", ".join(f"unit {u}: {100 * b:.1f}%" for u, b in budget.items())
    if len(matched) < 2:
        return Verdict(
            claim,
            paper,
            measure,
            "gap share by unit",
            "not measured",
            evidence=f"no two units at a matched realised budget ({printed})",
        )
    error = per_prompt.groupby(["unit", "prompt", "selection"])["error"].mean().unstack("selection")
    unrepaired = per_prompt.groupby(["unit", "prompt"])["unrepaired_error"].mean()
    share = ((error["random"] - error["informed"]) / unrepaired).unstack("unit")
    large = max(matched)
    test = f"gap share at unit {small} minus unit {large} (budget-matched), sign-flip over prompts"
    row = mean_claim(claim, paper, measure, test, share[small] - share[large])
    means = ", ".join(f"unit {u}: {100 * share[u].mean():.1f}%" for u in share.columns)
    row.evidence = f"gap share {means}; realised budgets {printed}; matched units {matched}"
    return row


def exactness_claim(report: dict | None) -> Verdict:
    """Full repair equals Dense (App. B): a deterministic identity, so no sampling, no p and no Holm;
    its margin is every greedy token identical and the repaired cache within EXACT_TOLERANCE."""
    claim, paper = "full repair equals Dense", "App. B, correctness"
    if report is None:
        return Verdict(claim, paper, "greedy tokens", "greedy tokens at rho = 1", "not measured", kind="exact")
    same = bool(report["full_repair_token_identical"])
    error = float(report.get("repair_max_abs_err", float("nan")))
    test = (
        f"greedy tokens at rho = 1 over {report['tokens_compared']} tokens all identical and the repaired cache "
        f"within {EXACT_TOLERANCE:g} of Dense's: a deterministic identity, no test"
    )
    evidence = f"token-identical: {same}; largest repaired-vs-dense cache difference {error:.2e}"
    verdict = "holds" if same and error <= EXACT_TOLERANCE else "does not hold"
    return Verdict(claim, paper, "greedy tokens", test, verdict, evidence=evidence, kind="exact")


# ------------------------------------------------------------------------------- the table
def verdicts(
    items: pd.DataFrame,
    calls: pd.DataFrame,
    bcr: str,
    kvcomm: str = "kvcomm",
    dense: str = "dense",
    matched: str = "token-matched-dense",
    cacheblend: str | None = None,
    gate_settings: tuple = (),
    curve: pd.DataFrame | None = None,
    verify: dict | None = None,
    measure: str = "correct",
    gate: pd.DataFrame | None = None,
    seed: int = 0,
    unconditional: str = "kvcomm@1",
) -> pd.DataFrame:
    """One row per distinct comparison the paper claims, tested once on these records, as one Holm
    family. `measure` is the binary outcome every row is read on (`correct`, the paper's; agreement
    with Dense and KL are printed beside it). `gate` holds the gate run's own Dense, unconditional
    reuse and settings (default: `items`); `gate_settings` names the settings between them."""
    conditions = list(dict.fromkeys(items["condition"]))
    bcr, kvcomm, dense, matched = (find(conditions, c) for c in (bcr, kvcomm, dense, matched))
    cacheblend = cacheblend and find(conditions, cacheblend)
    items = with_agreement(items, dense)
    rows = cost_claims(items, calls, conditions, measure, dense=dense, kvcomm=kvcomm, matched=matched, bcr=bcr)
    rows.append(gate_claim(items if gate is None else gate, dense, unconditional, [kvcomm, *gate_settings], measure))
    rows.append(unit_claim(curve))
    rows += coin_claims(items, calls, bcr, conditions, measure)
    rows += cacheblend_claims(items, calls, bcr, cacheblend, conditions, measure)
    if ran(conditions, dense, matched):
        rows.append(tax.identity_check(items, calls, dense, matched, measure))
    rows.append(exactness_claim(verify))
    for row in rows:  # prospective power of sign-flip rows at MIN_EFFECT
        if row.kind == "superiority" and row.resamples is not None or row.measure == "gap share":
            row.items_needed = power.mean_items_needed_at(row.per_item, MIN_EFFECT)
    return family(rows, seed)


def cost_claims(items, calls, conditions: list[str], measure: str, *, dense, kvcomm, matched, bcr) -> list[Verdict]:
    """What reuse costs and what repair gives back: reuse costs accuracy, its two terms (the tax and
    the approximation), repair cannot touch the tax, BCR-chunk beats KVComm (its share recovered and
    its lift off the line described beside it), and repair recovers most of the cost."""
    rows: list[Verdict] = []
    if ran(conditions, dense, kvcomm):
        rows.append(
            pair_claim(items, calls, "reuse costs accuracy", "§1, Table 3", measure, dense, kvcomm, "Dense vs KVComm")
        )
    if ran(conditions, dense, matched, kvcomm):
        rows.append(tax.approximation_claim(items, matched, kvcomm, measure))
        rows.append(tax.tax_claim(items, dense, matched, kvcomm, measure))
        if ran(conditions, bcr):
            rows.append(tax.untouched_claim(items, matched, budgets_of(conditions, bcr), measure))
    if ran(conditions, bcr, kvcomm):
        row = pair_claim(
            items, calls, "BCR-chunk beats KVComm", "§4.3, Tables 3 and 5a", measure, bcr, kvcomm, "BCR-chunk vs KVComm"
        )
        if ran(conditions, dense, matched):  # the same per-item difference, read as a share and as a lift: description
            row.evidence += (
                f"; {tax.recovered_text(items, matched, kvcomm, bcr, measure)}; "
                f"{line.lift_text(items, dense, kvcomm, bcr, measure)}"
            )
        rows.append(row)
    if ran(conditions, dense, kvcomm, bcr):
        rows.append(line.recovery_claim(items, dense, kvcomm, bcr, measure))
    return rows


def coin_claims(items, calls, bcr: str, conditions: list[str], measure: str) -> list[Verdict]:
    """Draft beats coin at chunk granularity, for BCR-chunk and for its ranking of only predicted rows:
    against the coin that spends the draft's rows on each call where one ran and its rows differ from
    the chunk-count coin's, else against the chunk-count coin."""
    rows = []
    for name in [bcr, with_options(bcr, rank="predicted")]:
        name = find(conditions, name)
        nominal = coin_seeds(name, conditions)
        coins = coin_seeds(name, conditions, parse(name).name) if name in conditions else []
        if name not in conditions or not (nominal or coins):
            continue
        if nominal and (
            not coins or not rows_differ(calls, name, nominal[0], paired(items, measure, name, *nominal).index)
        ):
            coins = nominal  # the chunk-count coin already spends the draft's rows (or is all there is)
        suffix = "" if parse(name).option("rank") == "all" else " (ranking only predicted rows)"
        claim = "draft beats coin at chunk granularity" + suffix
        rows.append(coin_claim(items, calls, claim, "§4.3, Table 5a", measure, name, coins, nominal))
    return rows


def gate_claim(gate: pd.DataFrame, dense: str, unconditional: str, settings: list[str], measure: str) -> Verdict:
    """Equation 3's line on the gate run, its conditions found by their settings."""
    gate = with_agreement(gate, find(list(gate["condition"].unique()), dense))
    recorded = list(gate["condition"].unique())
    found = [find(recorded, c) for c in settings]
    return line.line_claim(gate, find(recorded, dense), find(recorded, unconditional), found, measure)


def cacheblend_claims(items, calls, bcr, cacheblend, conditions, measure) -> list[Verdict]:
    """BCR-chunk level with CacheBlend at matched cost (App. D, Table 14: "neither pairing separates"),
    read on the row-matched CacheBlend where the nominal one spends other rows."""
    twin = cacheblend and bcr in conditions and row_matched(cacheblend, bcr, conditions)
    if not (cacheblend and bcr in conditions and (twin or cacheblend in conditions)):
        return []
    if cacheblend not in conditions:  # only the row-matched CacheBlend recorded
        read = twin
    else:
        ids = paired(items, measure, bcr, cacheblend).index
        read = twin if twin and rows_differ(calls, bcr, cacheblend, ids) else cacheblend
    row = level_claim(items, calls, "App. D, Tables 3 and 14", measure, bcr, read, f"BCR-chunk vs {read}")
    if cacheblend not in conditions:
        row.read_on = f"row-matched CacheBlend (no nominal {cacheblend} recorded)"
    elif read != cacheblend:
        row.read_on = f"row-matched CacheBlend (nominal {cacheblend}: {rows_text(calls, bcr, cacheblend, ids)})"
    return [row]
