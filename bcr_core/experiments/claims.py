"""The paper's claims as tests on run records, each ending in a verdict (notebook 10).

A claim compares two conditions on the same items (or the same agent calls) and reads the paired
test in the claim's direction: **holds** (p < alpha, the claimed direction), **does not hold**
(p < alpha, the other direction), or **undecided**, with the number of items that would decide it
if the observed discordance rates held (`items_needed`). A null claim (no setting off Equation 3's
line) holds when no setting is off the line by a 95% interval. Nothing here tunes anything: the
records are what they are.

Records come from `bcr run` folders (full or compact, `.jsonl` or `.jsonl.gz`); conditions from
several folders on the same items pair by item id.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from bcr_core.experiments.conditions import parse
from bcr_core.experiments.stats import mcnemar_exact, paired_split, wilcoxon
from bcr_core.experiments.summary import with_agreement

ALPHA = 0.05


def paired(items: pd.DataFrame, value: str, *conditions: str) -> pd.DataFrame:
    """`value` per item (rows) and condition (columns), only items every named condition finished."""
    table = items[items["condition"].isin(conditions)].pivot(index="item_id", columns="condition", values=value)
    return table.reindex(columns=list(conditions)).dropna()


def reuse_calls(calls: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Calls both conditions served from an assembled cache at the same item and node, side by side."""

    def side(c):
        own = calls[(calls["condition"] == c) & (calls["mode"] == "reuse")]
        return pd.DataFrame(
            {
                "item_id": own["item_id"],
                "node": own["node"],
                "kl": [f["kl"] for f in own["fidelity"]],
                "first": [f["first_token_agree"] for f in own["fidelity"]],
            }
        ).set_index(["item_id", "node"])

    return side(a).merge(side(b), left_index=True, right_index=True, suffixes=("_a", "_b"))


def find(conditions: list[str], spec: str) -> str:
    """The recorded label with the same settings as `spec` (`kvcomm@0.3` finds `kvcomm`), else `spec`."""
    wanted = parse(spec).settings
    return next((c for c in conditions if parse(c).settings == wanted), spec)


# ------------------------------------------------------------------------------- verdicts
@dataclass
class Verdict:
    claim: str
    paper: str
    test: str
    verdict: str  # holds | does not hold | undecided | not measured
    evidence: str
    p: float | None = None
    n: int | None = None
    items_needed: int | None = None


def items_needed(a_only: int, b_only: int, n: int, alpha: float = ALPHA, limit: int = 1_000_000) -> int | None:
    """Items a paired exact McNemar would need to reach `alpha` if the discordance rates stayed as
    observed (None when they are equal: no number of items decides a zero difference)."""
    if a_only == b_only or n == 0:
        return None
    size = n
    while size <= limit:
        scale = size / n
        if mcnemar_exact(round(a_only * scale), round(b_only * scale)) < alpha:
            return size
        size = int(size * 1.1) + 1
    return None


def binary_verdict(claim: str, paper: str, test: str, better, worse, alpha: float = ALPHA) -> Verdict:
    """`better` is claimed to beat `worse` on paired booleans (True = right / agrees)."""
    split = paired_split(worse, better)
    a_only, b_only, p = split["only_condition_right"], split["only_reference_right"], split["p_exact"]
    n = len(better)
    if p < alpha:
        verdict = "holds" if a_only > b_only else "does not hold"
    else:
        verdict = "undecided"
    return Verdict(
        claim,
        paper,
        test,
        verdict,
        f"{a_only}/{b_only} (only the claimed side / only the other side)",
        p,
        n,
        items_needed(a_only, b_only, n) if verdict == "undecided" else None,
    )


def continuous_verdict(claim: str, paper: str, test: str, lower, higher, alpha: float = ALPHA) -> Verdict:
    """`lower` is claimed to be below `higher`, paired (e.g. KL to Dense per call)."""
    lower, higher = np.asarray(lower, float), np.asarray(higher, float)
    if lower.size == 0:
        return Verdict(claim, paper, test, "not measured", "no paired calls")
    result = wilcoxon(lower, higher)
    diff = float(np.mean(higher - lower))
    verdict = ("holds" if diff > 0 else "does not hold") if result["p"] < alpha else "undecided"
    return Verdict(
        claim,
        paper,
        test,
        verdict,
        f"mean {lower.mean():.4f} vs {higher.mean():.4f} over {lower.size} calls",
        result["p"],
        int(lower.size),
    )


def coin_seeds(condition: str, conditions: list[str]) -> list[str]:
    """The coin conditions matching a BCR condition: same layout, budget and options, any seed."""
    name, value, options = parse(condition).settings
    twin = name.replace("bcr-", "coin-")
    out = []
    for c in conditions:
        other_name, other_value, other_options = parse(c).settings
        if (other_name, other_value) == (twin, value) and tuple(o for o in other_options if o[0] != "seed") == options:
            out.append(c)
    return out


def seeds_verdict(claim: str, paper: str, per_seed: list[Verdict]) -> Verdict:
    """One verdict over coin seeds (never pooled into one test): holds if most seeds' tests hold,
    does not hold if most go the other way, else undecided."""
    if not per_seed:
        return Verdict(claim, paper, "draft vs coin", "not measured", "no matching coin run")
    votes = [v.verdict for v in per_seed]
    half = len(votes) / 2
    verdict = (
        "holds"
        if votes.count("holds") > half
        else "does not hold"
        if votes.count("does not hold") > half
        else "undecided"
    )
    needed = [v.items_needed for v in per_seed if v.items_needed]
    return Verdict(
        claim,
        paper,
        per_seed[0].test + f", {len(per_seed)} coin seeds, one test each",
        verdict,
        "; ".join(f"{v.evidence.split(' ')[0]} p={v.p:.3g}" for v in per_seed),
        min(v.p for v in per_seed),
        per_seed[0].n,
        max(needed) if verdict == "undecided" and needed else None,
    )


def line_verdict(
    items: pd.DataFrame,
    dense: str,
    reuse: str,
    settings: list[str],
    value: str = "correct",
    boot: int = 2000,
    seed: int = 0,
) -> Verdict:
    """Equation 3: every gate setting's accuracy sits on the line through Dense (reuse 0) and KVComm
    (its reuse rate). Each setting's residual gets a paired bootstrap 95% interval over items."""
    claim, paper = "the gate only slides along Equation 3's line", "§4.1, Eq. 3, Tables 7 and 9"
    present = [s for s in settings if s in set(items["condition"])]
    if not present or reuse not in set(items["condition"]):
        return Verdict(claim, paper, "residuals off the line", "not measured", "no gate sweep in these records")
    hit = paired(items, value, dense, reuse, *present).astype(float)
    rate = paired(items, "reuse_rate", dense, reuse, *present)
    rng = np.random.default_rng(seed)
    n = len(hit)
    draws = [np.arange(n)] + [rng.integers(0, n, n) for _ in range(boot)]
    parts, off = [], []
    for s in present:
        residuals = []
        for idx in draws:
            h, r = hit.iloc[idx], rate.iloc[idx]
            slope = (h[dense].mean() - h[reuse].mean()) / max(r[reuse].mean(), 1e-9)
            residuals.append(h[s].mean() - (h[dense].mean() - slope * r[s].mean()))
        lo, hi = np.percentile(residuals[1:], [2.5, 97.5])
        parts.append(f"{s}: {100 * residuals[0]:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}]")
        off.append(lo > 0 or hi < 0)
    verdict = "does not hold" if any(off) else "holds"
    return Verdict(
        claim, paper, f"residual of {value} vs the line, bootstrap 95% CI", verdict, "; ".join(parts), None, n
    )


def tokenization_verdict(items, calls, dense, matched, kvcomm, measure) -> Verdict:
    """Separable: on items whose every call had the same ids both ways, token-matched Dense must BE
    Dense (no tokenization term at all there), so whatever KVComm loses on them is approximation."""
    own = calls[calls["condition"] == matched]
    match = (
        own["ids_match"]
        if "ids_match" in own
        else pd.Series([list(a) == list(b) for a, b in zip(own["dense_ids"], own["merged_ids"])], index=own.index)
    )
    clean = set(own.assign(match=match.to_numpy()).groupby("item_id")["match"].all().loc[lambda s: s].index)
    texts = paired(items, "final_text", dense, matched)
    texts = texts[texts.index.isin(clean)]
    outcome = paired(items, measure, dense, matched, kvcomm).astype(bool)
    tok, approx = paired_split(outcome[dense], outcome[matched]), paired_split(outcome[matched], outcome[kvcomm])
    same = int((texts[dense] == texts[matched]).sum())
    return Verdict(
        "the tokenization term is separable",
        "§4.3, Table 5a",
        "items whose ids coincide on every call: token-matched Dense must equal Dense; the two terms on " + measure,
        "holds" if same == len(texts) else "does not hold",
        f"token-matched Dense = Dense on {same}/{len(texts)} items without a tokenization seam; "
        f"tokenization {tok['only_reference_right']}/{tok['only_condition_right']} (p={tok['p_exact']:.3g}), "
        f"approximation {approx['only_reference_right']}/{approx['only_condition_right']} "
        f"(p={approx['p_exact']:.3g}); ids identical on {100 * float(match.mean()):.0f}% of calls",
        approx["p_exact"],
        len(outcome),
    )


def unit_verdict(per_prompt: pd.DataFrame | None) -> Verdict:
    """Informed choice is worth more at small units: the per-prompt gap (mean random error minus
    informed error) at the smallest unit against the largest, paired t over prompts (`unit_curve`'s
    per-prompt records)."""
    claim, paper = "informed choice loses value as the unit grows", "§4.2, Table 8"
    if per_prompt is None or per_prompt.empty:
        return Verdict(claim, paper, "gap share by unit", "not measured", "no unit-curve records")
    from scipy import stats

    error = per_prompt.groupby(["unit", "prompt", "selection"])["error"].mean().unstack("selection")
    gap = (error["random"] - error["informed"]).unstack("unit")
    unrepaired = per_prompt.groupby("unit")["unrepaired_error"].mean()
    small, large = gap.columns.min(), gap.columns.max()
    t = stats.ttest_rel(gap[small], gap[large])
    verdict = ("holds" if t.statistic > 0 else "does not hold") if t.pvalue < ALPHA else "undecided"
    share = ", ".join(f"unit {u}: {100 * gap[u].mean() / unrepaired[u]:.1f}%" for u in gap.columns)
    return Verdict(
        claim,
        paper,
        f"gap (random - informed error) at unit {small} vs {large}, paired t over prompts",
        verdict,
        "gap share " + share,
        float(t.pvalue),
        len(gap),
    )


def exactness_verdict(report: dict | None) -> Verdict:
    claim, paper = "full repair equals Dense", "App. B, correctness"
    if report is None:
        return Verdict(claim, paper, "greedy tokens at rho = 1", "not measured", "no verify report")
    same = bool(report["full_repair_token_identical"])
    return Verdict(
        claim,
        paper,
        f"greedy tokens at rho = 1 over {report['tokens_compared']} tokens",
        "holds" if same else "does not hold",
        f"token-identical: {same}; largest repaired-vs-dense difference "
        f"{report.get('repair_max_abs_err', float('nan')):.2e}",
    )


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
) -> pd.DataFrame:
    """One row per claim of the paper, tested on these records. `measure` is the per-item outcome
    the binary claims are read on (`agrees_dense`, the primary measure on a small model, or
    `correct`)."""
    conditions = list(dict.fromkeys(items["condition"]))
    bcr, kvcomm, dense, matched = (find(conditions, c) for c in (bcr, kvcomm, dense, matched))
    cacheblend = cacheblend and find(conditions, cacheblend)
    gate_settings = [find(conditions, g) for g in gate_settings]
    items = with_agreement(items, dense)
    rows = []

    def on(value, a, b):
        table = paired(items, value, a, b).astype(bool)
        return table[a], table[b]

    def have(*names):
        return all(n in conditions for n in names)

    if have(matched, kvcomm):
        rows.append(
            binary_verdict(
                "reuse costs Dense-agreement",
                "§1, §4.3 (Table 5a)",
                "token-matched Dense vs KVComm, agreement with Dense per item, exact McNemar",
                *on("agrees_dense", matched, kvcomm),
            )
        )
    if have(dense, kvcomm):
        rows.append(
            binary_verdict(
                "reuse costs accuracy",
                "§1, Table 3",
                "Dense vs KVComm, accuracy, exact McNemar",
                *on("correct", dense, kvcomm),
            )
        )
    rows.append(line_verdict(items, dense, kvcomm, list(gate_settings)))
    if have(dense, matched, kvcomm):
        rows.append(tokenization_verdict(items, calls, dense, matched, kvcomm, measure))
    rows.append(unit_verdict(curve))
    for name in [bcr, f"{bcr},rank=predicted" if ":" in bcr else f"{bcr}:rank=predicted"]:
        name = find(conditions, name)
        if name not in conditions:
            continue
        suffix = "" if parse(name).option("rank") == "all" else " (ranking only predicted rows)"
        per_seed = [
            binary_verdict("", "", f"{measure} per item, exact McNemar", *on(measure, name, coin))
            for coin in coin_seeds(name, conditions)
        ]
        rows.append(seeds_verdict("draft beats coin at chunk granularity" + suffix, "§4.3, Table 5a", per_seed))
        for coin in coin_seeds(name, conditions)[:1]:
            pair = reuse_calls(calls, name, coin)
            rows.append(
                continuous_verdict(
                    "draft beats coin at chunk granularity, per call" + suffix,
                    "§4.3",
                    f"teacher-forced KL to Dense, {name} vs {coin}, Wilcoxon",
                    pair["kl_a"],
                    pair["kl_b"],
                )
            )
    if have(bcr, kvcomm):
        rows.append(
            binary_verdict(
                "BCR-chunk beats KVComm",
                "§4.3, Tables 3 and 5a",
                f"{measure} per item, exact McNemar",
                *on(measure, bcr, kvcomm),
            )
        )
        pair = reuse_calls(calls, bcr, kvcomm)
        rows.append(
            continuous_verdict(
                "BCR-chunk beats KVComm, per call",
                "§4.3",
                "teacher-forced KL to Dense, Wilcoxon",
                pair["kl_a"],
                pair["kl_b"],
            )
        )
    if cacheblend and have(bcr, cacheblend):
        rows.append(
            binary_verdict(
                "BCR beats CacheBlend at matched cost",
                "App. D, Tables 3 and 14",
                f"BCR-chunk vs {cacheblend}, {measure} per item, exact McNemar",
                *on(measure, bcr, cacheblend),
            )
        )
    rows.append(exactness_verdict(verify))
    return pd.DataFrame([asdict(r) for r in rows])
