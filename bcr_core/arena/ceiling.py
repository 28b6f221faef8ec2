"""The searched ceiling read from an arena's call records (`bcr_core.arena.search` finds it): what
the search cost, how much of the reachable it reaches, what its sets are made of, and how much each
selector's picks overlap them. The item is the unit: per-call values are averaged per item first.

- `search_cost`: per budget, the share of calls searched exhaustively (a true optimum over the chunk
  layout's sets at that count), locally (a search's best) or not at all (a count of 0), the share of
  local searches that ended at a local optimum (one that spent its whole cap counted as stopped by
  it), evaluations and seconds per call.
- `reach`: per budget, per-item KL of the unrepaired cache, of the searched set and of token-matched
  Dense (the exact cache of the same ids: what repairing every row gives), and the share of the
  reachable the searched set reaches, (unrepaired - searched) / (unrepaired - token-matched), and the
  share of KVComm's own KL it recovers, (unrepaired - searched) / unrepaired (the unrepaired cache is
  KVComm's; the two differ by the tokenization tax, which no choice of rows repairs), each a ratio of
  the means over items with a bootstrap 95% interval.
- `composition`: per selector and budget, the share of its rows in each region of the prompt
  (`REGIONS`: the agent's exact prefix, the question, agents' answers, template text after a
  placeholder; on a code question whose records hold its prose rows, `docstring` split out of the
  question, `region_names`), the share at seams (the first `SEAM_ROWS` rows of a reused segment; overlaps the
  regions), and its runs of consecutive rows per set; `cache` is the cache's own shares.
- `overlap`: per selector and budget, the Jaccard overlap of its rows with the searched set's.
- `violations`: every (call, budget, selector) whose KL lies below the searched set's at the same
  count: none may, by construction; a test holds the records to it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bcr_core.analysis.statistics import inference as inf
from bcr_core.arena.measures import SEARCHED, arena_frame, is_coin, is_searched
from bcr_core.arena.registry import current_label, evals_of
from bcr_core.arena.search import rows_of, stopped_at_cap
from bcr_core.errors import UsageError

REGIONS = ("prefix", "question", "answers", "template")
DOCSTRING = "docstring"  # a code question's prose (its docstrings), where an arena record holds its rows
SEAM_ROWS = 4  # the rows of a reused segment counted as its seam
CACHE = "cache"  # composition's row for the cache itself


def searched_calls(calls: list[dict]) -> list[dict]:
    out = [c for c in calls if c.get("arena", {}).get("search")]
    if not out:
        raise UsageError("these arena records hold no `searched` sets: run the arena with `searched` among --selectors")
    return out


def search_cost(calls: list[dict]) -> pd.DataFrame:
    rows = []
    for call in searched_calls(calls):
        for label, budgets in call["arena"]["search"].items():
            cap = evals_of(label)
            for budget, record in budgets.items():
                capped = stopped_at_cap(record, cap)
                rows.append(
                    {"searcher": label, "budget": budget, "item_id": call["item_id"], "capped": capped} | record
                )
    frame = pd.DataFrame(rows)
    local = frame["case"] == "local"
    frame["local_optimum"] = ~frame["capped"]  # read on local searches only
    return (
        frame.assign(
            exhaustive=frame["case"] == "exhaustive",
            local=local,
            skipped=frame["case"] == "none",
            ended_at_local_optimum=frame["local_optimum"].where(local).astype(float),
        )
        .groupby(["searcher", "budget"], sort=False)
        .agg(
            calls=("case", "size"),
            exhaustive=("exhaustive", "mean"),
            local=("local", "mean"),
            none=("skipped", "mean"),
            local_optimum=("ended_at_local_optimum", "mean"),
            space_median=("space", "median"),
            evaluations=("evaluations", "mean"),
            seconds=("seconds", "mean"),
        )
        .reset_index()
    )


def reach(calls: list[dict]) -> pd.DataFrame:
    frame = arena_frame(searched_calls(calls))
    base = {
        (c["item_id"], c["node"]): (c["arena"]["unrepaired"]["kl"], c["arena"]["token_matched"]["kl"])
        for c in searched_calls(calls)
    }
    found = frame[frame["selector"].map(is_searched)].copy()
    found["unrepaired"] = [base[k][0] for k in zip(found["item_id"], found["node"])]
    found["token_matched"] = [base[k][1] for k in zip(found["item_id"], found["node"])]
    out = []
    for budget, own in found.groupby("budget", sort=False):
        items = own.groupby("item_id")[["unrepaired", "kl", "token_matched"]].mean()
        gained = items["unrepaired"] - items["kl"]
        reachable = np.column_stack([gained, items["unrepaired"] - items["token_matched"]])
        of_kvcomm = np.column_stack([gained, items["unrepaired"]])
        out.append(
            {"budget": budget, "items": len(items), "rows_per_call": own["rows"].mean()}
            | {k: items[k].mean() for k in ("unrepaired", "kl", "token_matched")}
            | ratio_with_interval(reachable, "reached")
            | ratio_with_interval(of_kvcomm, "recovered")
        )
    return pd.DataFrame(out).rename(columns={"kl": SEARCHED, "reached_lo": "lo", "reached_hi": "hi"})


def ratio_of_means(v: np.ndarray) -> float:
    return v[:, 0].mean() / v[:, 1].mean() if v[:, 1].mean() > 0 else np.nan


def ratio_with_interval(pairs: np.ndarray, name: str) -> dict:
    """{name, name_lo, name_hi}: mean(first column) / mean(second) over items, with a bootstrap 95% interval."""
    lo, hi = np.nanpercentile(inf.bootstrap_draws(pairs, ratio_of_means), [2.5, 97.5])
    return {name: ratio_of_means(pairs), f"{name}_lo": float(lo), f"{name}_hi": float(hi)}


def region_names(calls: list[dict]) -> tuple[str, ...]:
    """`REGIONS`, with `docstring` after `question` where the records split a code question's prose out."""
    if any(DOCSTRING in c.get("arena", {}) for c in calls):
        after = REGIONS.index("question") + 1
        return (*REGIONS[:after], DOCSTRING, *REGIONS[after:])
    return REGIONS


def regions(spans: list[dict], m: int, docstring=()) -> tuple[list[str], set[int]]:
    """Each row's region (`REGIONS`) and the seam rows, from a call's segment map; rows of the question in
    `docstring` (runs [start, stop)) are `docstring`'s."""
    where = ["prefix"] * m
    seams = set()
    for span in spans:
        start, stop = span["start"], min(span["stop"], m)
        if span["name"] == "prefix" or stop <= start:
            continue
        region = "template" if span["name"].startswith("after:") else "question"
        region = "answers" if span["placeholder"] and span["name"] != "user_question" else region
        where[start:stop] = [region] * (stop - start)
        seams |= set(range(start, min(start + SEAM_ROWS, stop)))
    for start, stop in docstring:
        where[start:stop] = [DOCSTRING if w == "question" else w for w in where[start:stop]]
    return where, seams


def shares(rows: list[int], where: list[str], seams: set[int], names=REGIONS) -> dict:
    n = max(len(rows), 1)
    runs = sum(1 for i, j in enumerate(rows) if i == 0 or rows[i - 1] != j - 1)
    return {r: sum(where[j] == r for j in rows) / n for r in names} | {
        "seams": sum(j in seams for j in rows) / n,
        "runs": runs,
    }


def composition(calls: list[dict]) -> pd.DataFrame:
    out, names = [], region_names(calls)
    for call in searched_calls(calls):
        m = call["arena"]["cached_rows"]
        where, seams = regions(call["segment_map"], m, call["arena"].get(DOCSTRING, ()))
        key = {"item_id": call["item_id"]}
        out.append(key | {"selector": CACHE, "budget": ""} | shares(list(range(m)), where, seams, names))
        for entry in call["arena"]["entries"]:
            if entry["rows"]:
                row = {"selector": control_label(entry["selector"]), "budget": entry["budget"]}
                out.append(key | row | shares(rows_of(entry["runs"]), where, seams, names))
    frame = pd.DataFrame(out)
    per_item = frame.groupby(["selector", "budget", "item_id"], sort=False).mean()
    return per_item.groupby(["selector", "budget"], sort=False).mean().reset_index()


def control_label(selector: str) -> str:
    """A selector's row in these tables: its label today, the coin's seeds one control."""
    return "coin" if is_coin(selector) else current_label(selector)


def overlap(calls: list[dict]) -> pd.DataFrame:
    out = []
    for call in searched_calls(calls):
        entries = call["arena"]["entries"]
        best = {e["budget"]: set(rows_of(e["runs"])) for e in entries if is_searched(e["selector"])}
        for e in entries:
            if is_searched(e["selector"]) or not e["rows"]:
                continue
            mine = set(rows_of(e["runs"]))
            jaccard = len(mine & best[e["budget"]]) / len(mine | best[e["budget"]])
            selector = control_label(e["selector"])
            out.append({"selector": selector, "budget": e["budget"], "item_id": call["item_id"], "jaccard": jaccard})
    frame = pd.DataFrame(out)
    per_item = frame.groupby(["selector", "budget", "item_id"], sort=False)["jaccard"].mean()
    return per_item.groupby(["selector", "budget"], sort=False).mean().unstack("budget")


def violations(calls: list[dict], tolerance: float = 0.0) -> pd.DataFrame:
    """Selectors' entries with the searched set's row count and less KL than it (beyond `tolerance`)."""
    frame = arena_frame(searched_calls(calls))
    searched = frame["selector"].map(is_searched)
    found = frame[searched].set_index(["item_id", "node", "budget"])
    others = frame[~searched]
    ceiling = found.reindex(pd.MultiIndex.from_frame(others[["item_id", "node", "budget"]]))
    same = others["rows"].to_numpy() == ceiling["rows"].to_numpy()
    below = others["kl"].to_numpy() < ceiling["kl"].to_numpy() - tolerance
    return others[same & below]
