"""What every selector of the arena gets, read from its call records, under the claims' protocol
(`bcr_core.analysis.claims.protocol`): the item is the unit, a coin's seeds are one control.

- `arena_frame`: one row per (call, selector, budget) of the records' `arena` fields.
- `per_item`: a measure's per-item mean over the item's assembled calls, items x selectors; the
  coin's seeds averaged per item into one `coin` column (their own columns dropped).
- `selector_table`: per selector at one budget, the mean of per-item KL with its 95% bootstrap
  interval over items, first-token agreement and identical continuations (per call), rows and
  rows wasted per call, and the selector's own cost (passes, ms).
- `gap_share`: the share of the achievable gain, (coin - selector) / (coin - searched), per item
  (items where the ceiling gains nothing over the coin left out) and overall (of the means, with
  a bootstrap interval over items). `searched` is the arena's ceiling; records without it (written
  before it existed) are read against `kv-error`, the K/V-error ranking, which is not a ceiling:
  shares above 100% then say a selector beats it, and the tables name the reference.
- `frontier`: per selector and budget of the sweep, rows per call against per-item KL.
- `verdicts`: every selector against the draft and against the coin, per-item KL differences by a
  sign-flip test over items with a bootstrap interval (`protocol.mean_claim`), the whole table one
  Holm family (`protocol.family`, which refines a p near its Holm threshold) in which each pair is
  asked once ("draft beats coin", never also "coin beats draft": the same test twice would only
  widen the family). `ours` is pre-registered: its rows are read on the second half of the run's
  items (item index >= n / 2, n the run's items) only, whatever they say; the others on every item.
  A run whose items are all of a synthetic item seed other than the one `ours` was designed on
  (seed 0) is its confirmation: there `ours` is read on every item (`fresh_items`).
  `searched` is in no verdict: it is at most every selector's KL by construction.

Stored labels are read under today's names (`registry.current_label`: records written before the
rename call the K/V-error rankings `oracle` and `oracle-attn`); nothing else in them changes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core import spec_grammar
from bcr_core.analysis.claims.protocol import Verdict, family, mean_claim
from bcr_core.analysis.statistics import inference as inf
from bcr_core.arena.copies import PAIRED
from bcr_core.arena.registry import current_label
from bcr_core.errors import UsageError

COIN, DRAFT, KV_ERROR, OURS, SEARCHED = "coin", "draft", "kv-error", "ours", "searched"
HELD_OUT = "second half of the items (pre-registered)"
FRESH = "items of an item seed `ours` was not designed on, every one (confirmation)"
OTHER_BENCHMARK = "items of a benchmark `ours` was not designed on, every one"
DESIGN_SEED = 0  # `ours` was designed on the synthetic task's seed-0 items (the first half of SmolLM2's arena)


def arena_frame(calls: list[dict]) -> pd.DataFrame:
    """The arena's measures, one row per (call, selector, budget), with the call's cost columns."""
    rows = []
    for call in calls:
        arena = call.get("arena")
        if not arena:
            continue
        where = {"item_id": call["item_id"], "node": call["node"], "cached_rows": arena["cached_rows"]}
        where |= {"index": arena["item_index"], "items": arena["items"]}
        for entry in arena["entries"]:
            cost = arena["cost"][entry["selector"]]
            label = {"selector": current_label(entry["selector"])}
            rows.append(where | entry | label | {"passes": cost["passes"], "ms": cost["ms"]})
    if not rows:
        raise UsageError("no call served from an assembled cache holds arena measures")
    return pd.DataFrame(rows)


def is_coin(label: str) -> bool:
    return spec_grammar.is_coin(spec_grammar.split(label)[0])


def is_searched(label: str) -> bool:
    return spec_grammar.split(label)[0] == SEARCHED


def per_item(frame: pd.DataFrame, budget: str = PAIRED, measure: str = "kl") -> pd.DataFrame:
    """Items x selectors: each item's mean of `measure` over its assembled calls; coin seeds as one
    `coin` column (the mean of the seeds per item)."""
    own = frame[frame["budget"] == budget]
    table = own.pivot_table(index="item_id", columns="selector", values=measure, aggfunc="mean", sort=False)
    table = table.astype(float)
    coins = [c for c in table.columns if is_coin(c)]
    if coins:
        table = table.drop(columns=coins).assign(**{COIN: table[coins].mean(axis=1)})
    order = dict.fromkeys(frame["item_id"])
    return table.reindex([i for i in order if i in table.index])


def synthetic_seeds(frame: pd.DataFrame) -> pd.Series:
    """Per row: the synthetic item seed of its item (NaN for another benchmark's item)."""
    return frame["item_id"].astype(str).str.extract(r"^synth-s(\d+)-")[0]


def fresh_items(frame: pd.DataFrame) -> bool:
    """Whether no item of the run is one `ours` was designed on (a synthetic item of `DESIGN_SEED`): items of
    another seed, or of another benchmark (HumanEval's), were never seen in its design, so every one is read."""
    seeds = synthetic_seeds(frame).dropna()
    return not (seeds.astype(int) == DESIGN_SEED).any()


def ours_read_on(frame: pd.DataFrame) -> str:
    """The items `ours` is read on, in words: every item of a fresh seed or another benchmark, else the
    second half."""
    if not fresh_items(frame):
        return HELD_OUT
    return FRESH if synthetic_seeds(frame).notna().all() else OTHER_BENCHMARK


def in_held_out(frame: pd.DataFrame) -> pd.Series:
    """Per row of `frame`: whether its item is one `ours` is read on."""
    return pd.Series(True, index=frame.index) if fresh_items(frame) else frame["index"] >= frame["items"] / 2


def registered(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as pre-registered: `ours` only on the items it is read on (`in_held_out`)."""
    return frame[(frame["selector"] != OURS) | in_held_out(frame)]


def selector_table(frame: pd.DataFrame, budget: str = PAIRED) -> pd.DataFrame:
    """Per selector at `budget`: per-item KL (mean, 95% bootstrap interval), per-call rates, rows, cost;
    `ours` on the second half of the items (`registered`), `items` saying how many each row holds."""
    frame = registered(frame)
    kl = per_item(frame, budget)
    own = frame[frame["budget"] == budget].assign(
        selector=lambda f: f["selector"].map(lambda s: COIN if is_coin(s) else s)
    )
    calls = own.groupby("selector", sort=False).agg(
        first_token_agree=("first_token_agree", "mean"),
        identical=("identical", "mean"),
        rows_per_call=("rows", "mean"),
        rows_wasted_per_call=("rows_wasted", "mean"),
        passes=("passes", "mean"),
        ms_per_call=("ms", "mean"),
    )
    out = []
    for selector in kl.columns:
        values = kl[selector].dropna().to_numpy()
        lo, hi = inf.bootstrap_ci(values)
        out.append(
            {
                "selector": selector,
                "items": len(values),
                "kl_per_item": float(values.mean()),
                "kl_lo": lo,
                "kl_hi": hi,
            }
        )
    table = pd.DataFrame(out).merge(calls, left_on="selector", right_index=True)
    table["wasted_share"] = table["rows_wasted_per_call"] / table["rows_per_call"].where(table["rows_per_call"] > 0)
    return table.sort_values("kl_per_item", kind="stable").reset_index(drop=True)


def find_ceiling(columns) -> str | None:
    """The gap share's reference: `searched` (whatever its options) where the records hold it, else
    `kv-error`, else None (a field without either, such as a confirmation run's)."""
    columns = list(columns)
    found = [c for c in columns if is_searched(c)]
    return found[0] if found else KV_ERROR if KV_ERROR in columns else None


def ceiling_of(columns) -> str:
    """`find_ceiling`, required."""
    ceiling = find_ceiling(columns)
    if ceiling is None:
        raise UsageError("the gap share needs `searched` (or, in older records, `kv-error`) among the selectors")
    return ceiling


def gap_share(frame: pd.DataFrame, budget: str = PAIRED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per item, overall): (coin - selector) / (coin - ceiling), the ceiling `ceiling_of` the
    selectors. Per item only where the ceiling's KL lies below the coin's; overall the ratio of the
    means over items, with a bootstrap 95% interval over items (resampling items, the ratio of the
    resampled means); `ours` on the second half of the items, as pre-registered."""
    kl = per_item(registered(frame), budget)
    if COIN not in kl:
        raise UsageError("the gap share needs the coin among the selectors")
    gain = kl[COIN] - kl[ceiling_of(kl.columns)]
    per = kl.drop(columns=[COIN]).rsub(kl[COIN], axis=0).div(gain.where(gain > 0), axis=0)
    overall = []
    for selector in per.columns:
        pairs = np.column_stack([kl[COIN] - kl[selector], gain])
        pairs = pairs[~np.isnan(pairs).any(axis=1)]
        ratio = lambda v: v[:, 0].mean() / v[:, 1].mean() if v[:, 1].mean() > 0 else np.nan
        draws = inf.bootstrap_draws(pairs, ratio)
        lo, hi = np.nanpercentile(draws, [2.5, 97.5]) if np.isfinite(draws).any() else (np.nan, np.nan)
        overall.append(
            {
                "selector": selector,
                "gap_share": ratio(pairs),
                "lo": float(lo),
                "hi": float(hi),
                "per_item_median": float(per[selector].median()),
                "items_with_a_gap": int(per[selector].notna().sum()),
            }
        )
    return per, pd.DataFrame(overall).sort_values("gap_share", ascending=False, kind="stable").reset_index(drop=True)


def frontier(frame: pd.DataFrame) -> pd.DataFrame:
    """Per selector and budget of the sweep: rows per call and the mean per-item KL, with the
    budget's rho (the paired point left out: its count is the draft's own); `ours` on the second
    half of the items only, as pre-registered (NaN before the run reaches it)."""
    out = []
    for budget in [b for b in dict.fromkeys(frame["budget"]) if b != PAIRED]:
        kl = per_item(frame, budget)
        own = frame[frame["budget"] == budget]
        rows = own.assign(selector=own["selector"].map(lambda s: COIN if is_coin(s) else s))
        rows = rows.groupby("selector")["rows"].mean()
        for selector in kl.columns:
            items = held_out(kl, frame) if selector == OURS else kl  # pre-registered: held-out items only
            out.append(
                {
                    "selector": selector,
                    "rho": float(budget),
                    "rows_per_call": float(rows[selector]),
                    "kl_per_item": float(items[selector].mean()),
                }
            )
    return pd.DataFrame(out)


def held_out(kl: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of `kl` (items x selectors) of the items `ours` is read on: the run's second half
    (index >= n / 2, n the run's items), or every item of a fresh item seed."""
    items = frame.drop_duplicates("item_id")
    return kl[in_held_out(items).set_axis(items["item_id"]).reindex(kl.index).to_numpy()]


PAPER = "§3, App. B and D"  # where the paper says which rows to recompute and how it measures them


def verdicts(frame: pd.DataFrame, budget: str = PAIRED) -> pd.DataFrame:
    """Every selector against the draft and against the coin on per-item KL, Holm over the table."""
    kl = per_item(frame, budget)
    rows: list[Verdict] = []
    for against in (DRAFT, COIN):
        if against not in kl:
            continue
        # each pair is asked once: the draft against the coin, as the paper puts it, not the reverse too
        skip = {DRAFT, COIN} if against == DRAFT else {COIN}
        for selector in [c for c in kl.columns if c not in skip and not is_searched(c)]:
            items = held_out(kl, frame) if selector == OURS else kl
            gain = (items[against] - items[selector]).to_numpy()  # + = the selector leaves less KL
            test = f"{selector} vs {against}: per-item mean KL at the {budget} count, sign-flip over items"
            claim = f"{selector} beats {against}"
            if gain.size < 2:
                rows.append(Verdict(claim, PAPER, "kl_mean", test, "not measured", evidence="fewer than 2 items"))
                continue
            row = mean_claim(claim, PAPER, "kl_mean", test, gain)
            row.evidence = f"mean per-item KL {items[selector].mean():.5f} vs {items[against].mean():.5f}"
            row.read_on = ours_read_on(frame) if selector == OURS else ""
            rows.append(row)
    return family(rows)


def has_records(folder) -> bool:
    """Whether a folder holds a run's calls (`calls.jsonl`, or the committed `calls.jsonl.gz`)."""
    from pathlib import Path

    return any((Path(folder) / name).exists() for name in ("calls.jsonl", "calls.jsonl.gz"))


def read_arena(folder) -> pd.DataFrame:
    """The arena frame of a run folder (`calls.jsonl`, or the committed `calls.jsonl.gz`); in notebook
    11, a folder without records says how to make them there (`bcr report arena` says it its own way)."""
    from pathlib import Path

    from bcr_core.run_folder import RunFolder

    if not has_records(folder):
        raise UsageError(f"no arena records under {folder}: set fresh = True to run the arena into results_dir")
    return arena_frame(RunFolder(Path(folder)).calls())
