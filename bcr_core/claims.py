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

import gzip
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bcr_core.conditions import parse
from bcr_core.runner import read_jsonl
from bcr_core.stats import mcnemar_exact, paired_split, wilcoxon, wilson_ci

ALPHA = 0.05
ID_LISTS = ("served_ids", "dense_ids", "merged_ids", "repaired_rows")


# ------------------------------------------------------------------------------- records
def read_records(path: Path) -> list[dict]:
    """A JSONL file, or its `.gz` twin when only that exists."""
    path = Path(path)
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix != ".gz":
        return read_jsonl(path)  # a run still being written may end in a torn line
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_runs(folder) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Items and calls of every run folder (one holding `cell.json`) under `folder`. Each
    comparison pairs its own conditions by item id (`paired`), so folders may hold different items."""
    items, calls = [], []
    for settings in sorted(Path(folder).rglob("cell.json")):
        run = settings.parent.relative_to(folder).as_posix()
        items += [r | {"run": run} for r in read_records(settings.parent / "items.jsonl")]
        calls += [c for c in read_records(settings.parent / "calls.jsonl")]
    if not items:
        raise ValueError(f"no run records under {folder}")
    items = pd.DataFrame(items)
    twice = items.groupby(["condition", "item_id"])["run"].unique().map(len) > 1
    if twice.any():
        condition, item = twice[twice].index[0]
        raise ValueError(f"{folder} holds {condition} on item {item} in more than one run "
                         f"({', '.join(items[(items.condition == condition) & (items.item_id == item)]['run'])}): "
                         "point it at one grid's runs")
    return items, pd.DataFrame(calls)


def compact_call(call: dict) -> dict:
    """A call record without its id lists (the compact form committed under results/): what the
    tables need stays (cached rows, whether the two tokenizations matched, rows repaired)."""
    out = {k: v for k, v in call.items() if k not in ID_LISTS}
    out["cached_rows"] = len(call["merged_ids"]) - 1
    out["ids_match"] = call["dense_ids"] == call["merged_ids"]
    return out


def export_compact(run: Path, target: Path) -> int:
    """Write a run folder's records in compact form (gzip) beside its settings; returns items written."""
    target.mkdir(parents=True, exist_ok=True)
    items = read_records(run / "items.jsonl")
    calls = read_records(run / "calls.jsonl")
    (target / "cell.json").write_text((run / "cell.json").read_text())
    for name, rows in (("items.jsonl.gz", items), ("calls.jsonl.gz", [compact_call(c) for c in calls])):
        with gzip.open(target / name, "wt", compresslevel=9) as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(items)


def with_agreement(items: pd.DataFrame, dense: str = "dense") -> pd.DataFrame:
    """Adds `agrees_dense` (the final text is Dense's on the same item; missing where Dense has no record)."""
    reference = items[items["condition"] == dense].set_index("item_id")["final_text"].reindex(items["item_id"])
    agrees = pd.Series(items["final_text"].to_numpy() == reference.to_numpy(), index=items.index, dtype=object)
    return items.assign(agrees_dense=agrees.where(reference.notna().to_numpy(), None))


def paired(items: pd.DataFrame, value: str, *conditions: str) -> pd.DataFrame:
    """`value` per item (rows) and condition (columns), only items every named condition finished."""
    table = items[items["condition"].isin(conditions)].pivot(index="item_id", columns="condition", values=value)
    return table.reindex(columns=list(conditions)).dropna()


def reuse_calls(calls: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Calls both conditions served from an assembled cache at the same item and node, side by side."""
    def side(c):
        own = calls[(calls["condition"] == c) & (calls["mode"] == "reuse")]
        return pd.DataFrame({"item_id": own["item_id"], "node": own["node"],
                             "kl": [f["kl"] for f in own["fidelity"]],
                             "first": [f["first_token_agree"] for f in own["fidelity"]]}).set_index(["item_id", "node"])
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
    return Verdict(claim, paper, test, verdict, f"{a_only}/{b_only} (only the claimed side / only the other side)", p, n,
                   items_needed(a_only, b_only, n) if verdict == "undecided" else None)


def continuous_verdict(claim: str, paper: str, test: str, lower, higher, alpha: float = ALPHA) -> Verdict:
    """`lower` is claimed to be below `higher`, paired (e.g. KL to Dense per call)."""
    lower, higher = np.asarray(lower, float), np.asarray(higher, float)
    if lower.size == 0:
        return Verdict(claim, paper, test, "not measured", "no paired calls")
    result = wilcoxon(lower, higher)
    diff = float(np.mean(higher - lower))
    verdict = ("holds" if diff > 0 else "does not hold") if result["p"] < alpha else "undecided"
    return Verdict(claim, paper, test, verdict,
                   f"mean {lower.mean():.4f} vs {higher.mean():.4f} over {lower.size} calls", result["p"], int(lower.size))


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
    verdict = ("holds" if votes.count("holds") > half else
               "does not hold" if votes.count("does not hold") > half else "undecided")
    needed = [v.items_needed for v in per_seed if v.items_needed]
    return Verdict(claim, paper, per_seed[0].test + f", {len(per_seed)} coin seeds, one test each", verdict,
                   "; ".join(f"{v.evidence.split(' ')[0]} p={v.p:.3g}" for v in per_seed),
                   min(v.p for v in per_seed), per_seed[0].n, max(needed) if verdict == "undecided" and needed else None)


def line_verdict(items: pd.DataFrame, dense: str, reuse: str, settings: list[str], value: str = "correct",
                 boot: int = 2000, seed: int = 0) -> Verdict:
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
    return Verdict(claim, paper, f"residual of {value} vs the line, bootstrap 95% CI", verdict, "; ".join(parts), None, n)


def tokenization_verdict(items, calls, dense, matched, kvcomm, measure) -> Verdict:
    """Separable: on items whose every call had the same ids both ways, token-matched Dense must BE
    Dense (no tokenization term at all there), so whatever KVComm loses on them is approximation."""
    own = calls[calls["condition"] == matched]
    match = own["ids_match"] if "ids_match" in own else pd.Series(
        [list(a) == list(b) for a, b in zip(own["dense_ids"], own["merged_ids"])], index=own.index)
    clean = set(own.assign(match=match.to_numpy()).groupby("item_id")["match"].all().loc[lambda s: s].index)
    texts = paired(items, "final_text", dense, matched)
    texts = texts[texts.index.isin(clean)]
    outcome = paired(items, measure, dense, matched, kvcomm).astype(bool)
    tok, approx = paired_split(outcome[dense], outcome[matched]), paired_split(outcome[matched], outcome[kvcomm])
    same = int((texts[dense] == texts[matched]).sum())
    return Verdict("the tokenization term is separable", "§4.3, Table 5a",
                   "items whose ids coincide on every call: token-matched Dense must equal Dense; the two terms on "
                   + measure, "holds" if same == len(texts) else "does not hold",
                   f"token-matched Dense = Dense on {same}/{len(texts)} items without a tokenization seam; "
                   f"tokenization {tok['only_reference_right']}/{tok['only_condition_right']} (p={tok['p_exact']:.3g}), "
                   f"approximation {approx['only_reference_right']}/{approx['only_condition_right']} "
                   f"(p={approx['p_exact']:.3g}); ids identical on {100 * float(match.mean()):.0f}% of calls",
                   approx["p_exact"], len(outcome))


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
    return Verdict(claim, paper, f"gap (random - informed error) at unit {small} vs {large}, paired t over prompts",
                   verdict, "gap share " + share, float(t.pvalue), len(gap))


def exactness_verdict(report: dict | None) -> Verdict:
    claim, paper = "full repair equals Dense", "App. B, correctness"
    if report is None:
        return Verdict(claim, paper, "greedy tokens at rho = 1", "not measured", "no verify report")
    same = bool(report["full_repair_token_identical"])
    return Verdict(claim, paper, f"greedy tokens at rho = 1 over {report['tokens_compared']} tokens",
                   "holds" if same else "does not hold",
                   f"token-identical: {same}; largest repaired-vs-dense difference "
                   f"{report.get('repair_max_abs_err', float('nan')):.2e}")


def verdicts(items: pd.DataFrame, calls: pd.DataFrame, bcr: str, kvcomm: str = "kvcomm", dense: str = "dense",
             matched: str = "token-matched-dense", cacheblend: str | None = None, gate_settings: tuple = (),
             curve: pd.DataFrame | None = None, verify: dict | None = None,
             measure: str = "agrees_dense") -> pd.DataFrame:
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
        rows.append(binary_verdict("reuse costs Dense-agreement", "§1, §4.3 (Table 5a)",
                                   "token-matched Dense vs KVComm, agreement with Dense per item, exact McNemar",
                                   *on("agrees_dense", matched, kvcomm)))
    if have(dense, kvcomm):
        rows.append(binary_verdict("reuse costs accuracy", "§1, Table 3", "Dense vs KVComm, accuracy, exact McNemar",
                                   *on("correct", dense, kvcomm)))
    rows.append(line_verdict(items, dense, kvcomm, list(gate_settings)))
    if have(dense, matched, kvcomm):
        rows.append(tokenization_verdict(items, calls, dense, matched, kvcomm, measure))
    rows.append(unit_verdict(curve))
    for name in [bcr, f"{bcr},rank=predicted" if ":" in bcr else f"{bcr}:rank=predicted"]:
        name = find(conditions, name)
        if name not in conditions:
            continue
        suffix = "" if parse(name).option("rank") == "all" else " (ranking only predicted rows)"
        per_seed = [binary_verdict("", "", f"{measure} per item, exact McNemar", *on(measure, name, coin))
                    for coin in coin_seeds(name, conditions)]
        rows.append(seeds_verdict("draft beats coin at chunk granularity" + suffix, "§4.3, Table 5a", per_seed))
        for coin in coin_seeds(name, conditions)[:1]:
            pair = reuse_calls(calls, name, coin)
            rows.append(continuous_verdict("draft beats coin at chunk granularity, per call" + suffix,
                                           "§4.3", f"teacher-forced KL to Dense, {name} vs {coin}, Wilcoxon",
                                           pair["kl_a"], pair["kl_b"]))
    if have(bcr, kvcomm):
        rows.append(binary_verdict("BCR-chunk beats KVComm", "§4.3, Tables 3 and 5a",
                                   f"{measure} per item, exact McNemar", *on(measure, bcr, kvcomm)))
        pair = reuse_calls(calls, bcr, kvcomm)
        rows.append(continuous_verdict("BCR-chunk beats KVComm, per call", "§4.3", "teacher-forced KL to Dense, Wilcoxon",
                                       pair["kl_a"], pair["kl_b"]))
    if cacheblend and have(bcr, cacheblend):
        rows.append(binary_verdict("BCR beats CacheBlend at matched cost", "App. D, Tables 3 and 14",
                                   f"BCR-chunk vs {cacheblend}, {measure} per item, exact McNemar",
                                   *on(measure, bcr, cacheblend)))
    rows.append(exactness_verdict(verify))
    return pd.DataFrame([asdict(r) for r in rows])


# ------------------------------------------------------------------------------- the grid's table
def grid_table(items: pd.DataFrame, calls: pd.DataFrame, conditions: list[str], reference: str = "kvcomm",
               dense: str = "dense") -> pd.DataFrame:
    """Per condition, on the items every one of `conditions` finished: accuracy (Wilson 95%),
    Dense-agreement, per-call first-token agreement and KL on the condition's reuse calls, rows
    repaired and wasted per call, calls skipped, and the paired split against `reference` with
    exact p (and a Wilcoxon p on the per-call KL of calls both served from cache)."""
    recorded = list(dict.fromkeys(items["condition"]))
    conditions = [find(recorded, c) for c in conditions]
    reference, dense = find(recorded, reference), find(recorded, dense)
    hit = paired(items, "correct", *conditions).astype(bool)
    items = with_agreement(items[items["item_id"].isin(hit.index)], dense)
    calls = calls[calls["item_id"].isin(hit.index)]
    rows = []
    for c in conditions:
        mine_calls = calls[calls["condition"] == c]
        reused = mine_calls[mine_calls["mode"] == "reuse"]
        fid = [f for f in reused["fidelity"] if f]
        k, n = int(hit[c].sum()), len(hit)
        lo, hi = wilson_ci(k, n)
        row = {"condition": c, "n": n, "accuracy": k / n, "wilson_lo": lo, "wilson_hi": hi,
               "agrees_dense": float(items[items["condition"] == c]["agrees_dense"].astype(float).mean()),
               "reuse_rate": float(items[items["condition"] == c]["reuse_rate"].mean()),
               "reuse_calls": len(reused),
               "first_token_agree": float(np.mean([f["first_token_agree"] for f in fid])) if fid else np.nan,
               "kl_mean": float(np.mean([f["kl"] for f in fid])) if fid else np.nan,
               "rows_per_call": float(mine_calls["rows_recomputed"].mean()),
               "rows_wasted_per_call": float(mine_calls["rows_wasted"].mean()) if "rows_wasted" in mine_calls else np.nan,
               "skipped_calls": int(mine_calls["skipped"].sum()) if "skipped" in mine_calls else 0}
        if c != reference and reference in hit:
            row |= paired_split(hit[reference], hit[c])
            pair = reuse_calls(calls, c, reference) if len(reused) else pd.DataFrame()
            row["kl_p_vs_reference"] = wilcoxon(pair["kl_a"], pair["kl_b"])["p"] if len(pair) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------- the grid itself
@dataclass(frozen=True)
class ClaimsGrid:
    """The headline grid of issue 10 and the runs its other claims read. Chunks of 16 rows on the
    CPU-sized synthetic prompts (~110-250 cached rows) keep about as many chunks per call as the
    paper's 64-row chunks on its ~1000-row GSM8K prompts, and let Algorithm 1 repair at all
    (with B = 64 every call is under rho M = 64 and skipped); every repair condition carries the
    same B so the skip rule skips the same calls for all of them."""

    benchmark: str = "synthetic"
    agents: int = 3
    n: int = 200
    max_new_tokens: int = 8
    chunk: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    gammas: tuple[float, ...] = (0.5, 1.0)
    theta: float = 0.5
    item_seed: int = 0

    def label(self, name: str, **options) -> str:
        text = ",".join([f"chunk={self.chunk}"] + [f"{k}={v}" for k, v in options.items()])
        return f"{name}:{text}"

    @property
    def bcr(self) -> str:
        return self.label("bcr-chunk")

    @property
    def cacheblend(self) -> str:
        return self.label("cacheblend-cost")

    def main(self) -> list[str]:
        coins = lambda name, **o: [self.label(name, **o, seed=s) for s in self.seeds]  # noqa: E731
        return ["dense", "token-matched-dense", "kvcomm", self.bcr, *coins("coin-chunk"),
                self.label("bcr-chunk", rank="predicted"), *coins("coin-chunk", rank="predicted"),
                self.label("bcr-single"), *coins("coin-single"), self.cacheblend]

    def gate(self) -> list[str]:
        return [f"kvcomm@{g:g}" for g in self.gammas] + [f"opengate@{self.theta:g}"]

    def cell(self, conditions: list[str], fidelity: bool):
        from bcr_core.runner import Cell

        return Cell(self.benchmark, self.agents, tuple(conditions), self.n, self.max_new_tokens,
                    extra={"seed": self.item_seed} if self.benchmark == "synthetic" else {}, fidelity=fidelity)


def run_fresh(bb, grid: ClaimsGrid, out, unit_config=None, batch: int = 8, progress: bool = True) -> Path:
    """Every run the verdicts read, on `bb`, into `out` (resumable like any `bcr run`): the main
    cell with fidelity, the gate sweep, the unit curve (per-prompt records) and `bcr verify`."""
    from bcr_core.runner import run_cell
    from bcr_core.unit_curve import UnitCurveConfig, default_texts, unit_curve
    from bcr_core.verify import verify

    out = Path(out)
    run_cell(bb, grid.cell(grid.main(), fidelity=True), out / "main", progress=progress, batch=batch)
    run_cell(bb, grid.cell(grid.gate(), fidelity=False), out / "gate", progress=progress, batch=batch)
    curve_path = out / "unit_curve.csv"
    if not curve_path.exists():
        config = unit_config or UnitCurveConfig(segment_tokens=512, units=(1, 16, 64, 256))
        unit_curve(bb, default_texts(), config, progress=progress).to_csv(curve_path, index=False)
    (out / "verify.json").write_text(json.dumps(verify(bb).to_dict(), indent=2))
    return out


def load_claims(folder) -> dict:
    """Everything the verdicts read from a folder `run_fresh` (or the committed results) wrote."""
    folder = Path(folder)
    items, calls = load_runs(folder)
    curve = folder / "unit_curve.csv"
    report = folder / "verify.json"
    return {"items": items, "calls": calls,
            "curve": pd.read_csv(curve) if curve.exists() else None,
            "verify": json.loads(report.read_text()) if report.exists() else None}
