"""The paper's claims as tests on run records, each ending in a verdict (notebook 10).

Each claim names the conditions it compares and hands their per-item outcomes to the protocol of
`bcr_core.analysis.protocol` (the item as the unit, coin seeds as one control, budgets matched
in rows, intervals, equivalence for null claims, Holm over the table). Nothing here tunes
anything: the records are what they are.
"""

from __future__ import annotations

import pandas as pd

from bcr_core.analysis import inference as inf
from bcr_core.analysis import line, tax
from bcr_core.analysis.protocol import (
    KL_MIN_SHARE,
    MIN_EFFECT,
    ROW_TOLERANCE,
    Verdict,
    binary_claim,
    family,
    mean_claim,
    paired,
    rows_differ,
    rows_text,
)
from bcr_core.analysis.summary import with_agreement
from bcr_core.conditions import find, parse

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
    """Two conditions on one measure: McNemar on a binary one, a sign-flip test on KL."""
    table = paired(items, measure, better, worse)
    if measure == "kl_mean":
        row = mean_claim(
            claim, paper, measure, f"{test_name}: per-item mean KL, sign-flip over items", table[worse] - table[better]
        )
        row.evidence = f"mean per-item KL {table[better].mean():.4f} vs {table[worse].mean():.4f}"
    else:
        table = table.astype(bool)
        row = binary_claim(claim, paper, measure, f"{test_name}: per item, exact McNemar", table[better], table[worse])
    row.rows = rows_text(calls, better, worse, table.index)
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
    row.evidence = f"{own}; per seed (description): " + "; ".join(per_seed)
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
    measure: str = "agrees_dense",
    gate: pd.DataFrame | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per claim of the paper, tested on these records, as one Holm family. `measure` is the
    binary outcome the binary claims are read on (`agrees_dense`, primary on a small model, or
    `correct`); KL rows read the per-item mean KL. `gate` holds the gate run's own Dense, KVComm
    and settings (default: `items`)."""
    conditions = list(dict.fromkeys(items["condition"]))
    bcr, kvcomm, dense, matched = (find(conditions, c) for c in (bcr, kvcomm, dense, matched))
    cacheblend = cacheblend and find(conditions, cacheblend)
    items = with_agreement(items, dense)
    rows: list[Verdict] = []

    def have(*names):
        return all(n in conditions for n in names)

    if have(matched, kvcomm):
        rows.append(
            pair_claim(
                items,
                calls,
                "reuse costs Dense-agreement",
                "§1, §4.3 (Table 5a)",
                "agrees_dense",
                matched,
                kvcomm,
                "token-matched Dense vs KVComm",
            )
        )
    if have(dense, kvcomm):
        rows.append(
            pair_claim(items, calls, "reuse costs accuracy", "§1, Table 3", "correct", dense, kvcomm, "Dense vs KVComm")
        )
    if have(dense, matched, kvcomm):
        rows.append(tax.tax_claim(items, dense, matched, kvcomm, measure))
        if have(bcr):
            for value in (measure, "kl_mean"):
                rows.append(tax.untouched_claim(items, dense, matched, kvcomm, bcr, value))
            rows.append(tax.approximation_recovered_claim(items, dense, matched, kvcomm, bcr, measure))
    gate = items if gate is None else line.gate_with_matched(gate, items, matched)
    gate = with_agreement(gate, find(list(gate["condition"].unique()), dense))
    recorded_gate = list(gate["condition"].unique())
    rows.append(
        line.line_claim(
            gate,
            *(find(recorded_gate, c) for c in (dense, matched, kvcomm)),
            [find(recorded_gate, g) for g in gate_settings],
            measure,
        )
    )
    if have(dense, matched, kvcomm, bcr):
        rows.append(line.lift_claim(items, matched, kvcomm, bcr, measure))
        rows.append(line.recovery_claim(items, dense, kvcomm, bcr, measure))
    rows.append(unit_claim(curve))
    for name in [bcr, f"{bcr},rank=predicted" if ":" in bcr else f"{bcr}:rank=predicted"]:
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
        for value, tail in ((measure, ""), ("kl_mean", ", KL per item")):
            rows.append(
                coin_claim(
                    items,
                    calls,
                    "draft beats coin at chunk granularity" + suffix + tail,
                    "§4.3, Table 5a",
                    value,
                    name,
                    coins,
                    nominal,
                )
            )
    if have(bcr, kvcomm):
        for value, tail in ((measure, ""), ("kl_mean", ", KL per item")):
            rows.append(
                pair_claim(
                    items,
                    calls,
                    "BCR-chunk beats KVComm" + tail,
                    "§4.3, Tables 3 and 5a",
                    value,
                    bcr,
                    kvcomm,
                    "BCR-chunk vs KVComm",
                )
            )
    twin = cacheblend and have(bcr) and row_matched(cacheblend, bcr, conditions)
    if cacheblend and have(bcr) and (twin or have(cacheblend)):
        if not have(cacheblend):  # only the row-matched CacheBlend recorded
            read = twin
        else:
            ids = paired(items, measure, bcr, cacheblend).index
            read = twin if twin and rows_differ(calls, bcr, cacheblend, ids) else cacheblend
        for value, tail in ((measure, ""), ("kl_mean", ", KL per item")):
            row = pair_claim(
                items,
                calls,
                "BCR beats CacheBlend at matched cost" + tail,
                "App. D, Tables 3 and 14",
                value,
                bcr,
                read,
                f"BCR-chunk vs {read}",
            )
            if not have(cacheblend):
                row.read_on = f"row-matched CacheBlend (no nominal {cacheblend} recorded)"
            elif read != cacheblend:
                row.read_on = f"row-matched CacheBlend (nominal {cacheblend}: {rows_text(calls, bcr, cacheblend, ids)})"
            rows.append(row)
    if have(dense, matched):
        rows.append(tax.identity_check(items, calls, dense, matched, measure))
    rows.append(exactness_claim(verify))
    kl_cost = float(items.loc[items["condition"] == kvcomm, "kl_mean"].mean()) if "kl_mean" in items else 0.0
    for row in rows:  # prospective power of sign-flip rows: MIN_EFFECT, or on KL a tenth of reuse's own KL
        if row.kind == "superiority" and row.resamples is not None or row.measure == "gap share":
            target = KL_MIN_SHARE * kl_cost if row.measure == "kl_mean" else MIN_EFFECT
            row.items_needed = inf.mean_items_needed_at(row.per_item, target) if target else None
    return family(rows, seed)
