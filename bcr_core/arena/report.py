"""The arena's tables as docs/results.md shows them, from a run folder or its compact copy.

`bcr report arena results/arena` prints the per-selector table at BCR-chunk's own
count (per-item KL with its interval, the share of the achievable gain, per-call rates, rows and
cost), the rows-vs-KL frontier over the budget sweep, and one line per verdict; a test checks that
every line of it is in docs/results.md. Given several folders (one arena per model), it prints each and
then the transfer table (every verdict per model, each model's table its own Holm family) and which rows to
recompute on each (`answer_table`: the ceiling's reach and each rule's share of its gain).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bcr_core.analysis.reports.claims_report import model_of, p_texts, transfer, transfer_markdown
from bcr_core.arena import ceiling, measures
from bcr_core.arena.copies import PAIRED
from bcr_core.arena.registry import make_entry
from bcr_core.errors import UsageError
from bcr_core.run_folder import RunFolder


def selector_markdown(frame: pd.DataFrame, bound: str = "") -> str:
    """The selector table at BCR-chunk's count; `bound` says, under it, what the ceiling's shares bound."""
    table = measures.selector_table(frame)
    held = table.set_index("selector")["items"].get(measures.OURS, 0)
    reference = measures.find_ceiling(table["selector"])
    shares = measures.gap_share(frame)[1].set_index("selector") if reference else pd.DataFrame()
    if reference is None:  # a field without a ceiling (a confirmation run): no share to read
        share_head = "share of a ceiling's gain (no ceiling in this run)"
    elif measures.is_searched(reference):
        share_head = "share of the best-found set's gain (an upper bound) [95% CI]"
    else:
        share_head = f"gain as a share of `{reference}`'s [95% CI]"
    lines = [
        f"On {table['items'].max()} items, {frame.drop_duplicates(['item_id', 'node']).shape[0]} assembled calls, "
        "every selector at BCR-chunk's own row count on each call "
        f"(`{measures.OURS}` on the {held} items {held_phrase(frame)}):",
        "",
        f"| selector | KL to Dense per item [95% CI] | {share_head} | first-token agree % | "
        "identical continuation % | rows / call | wasted rows / call | passes | ms / call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ours = table["selector"] == measures.OURS
    table = pd.concat([table[~ours], table[ours]])  # read on other items: listed apart, not ranked among them
    for r in table.itertuples():
        share = ""
        if r.selector in shares.index and not pd.isna(shares.loc[r.selector, "gap_share"]):
            s = shares.loc[r.selector]
            share = f"{100 * s.gap_share:.0f}% [{100 * s.lo:.0f}, {100 * s.hi:.0f}]"
        lines.append(
            f"| `{r.selector}` | {r.kl_per_item:.4f} [{r.kl_lo:.4f}, {r.kl_hi:.4f}] | {share} | "
            f"{100 * r.first_token_agree:.1f} | {100 * r.identical:.1f} | {r.rows_per_call:.1f} | "
            f"{r.rows_wasted_per_call:.1f} | {r.passes:.1f} | {r.ms_per_call:.0f} |"
        )
    alone = same_items_line(frame) if held else ""
    return "\n".join(lines + [line for text in (bound, alone) if text for line in ("", text)])


def bound_line(calls: list[dict]) -> str:
    """What the searched ceiling is and why its shares are upper bounds: the best set found over the chunk
    layout's sets and the selectors' own, exhaustive on some paired calls, and on the others a local
    search that may stop at its cap."""
    cost = ceiling.search_cost(calls)
    paired = cost[cost["budget"] == PAIRED].iloc[0]
    capped = "" if pd.isna(paired.local_optimum) else f"{100 * (1 - paired.local_optimum):.0f}%"
    return (
        "The ceiling is the best set found at BCR-chunk's count over the chunk layout's sets and the selectors' "
        f"own, not an optimum: the chunk layout searched exhaustively on {100 * paired.exhaustive:.0f}% of the "
        f"paired calls and locally on {100 * paired.local:.0f}%, of which {capped or 'none'} stopped at the "
        "evaluation cap rather than at a local optimum; row-level sets outside the chunk layout are not searched. "
        "A better ceiling can only widen the gain, so every share against it is an upper bound."
    )


def held_phrase(frame: pd.DataFrame) -> str:
    """Which items `ours` is read on, as the tables say it."""
    read_on = measures.ours_read_on(frame)
    if read_on == measures.OTHER_BENCHMARK:
        return "of a benchmark it was not designed on, every one"
    if read_on == measures.FRESH:
        return "of an item seed it was not designed on (its confirmation)"
    return "of the second half only, as pre-registered"


def same_items_line(frame: pd.DataFrame) -> str:
    """`ours` beside the field on the items it is read on, per-item KL (only where those are not all)."""
    if measures.fresh_items(frame):
        return ""
    kl = measures.held_out(measures.per_item(frame), frame).mean().sort_values()
    shown = ", ".join(f"`{name}` {value:.4f}" for name, value in kl.items())
    return f"On the second half's items alone, KL to Dense per item: {shown}."


def verdict_markdown(frame: pd.DataFrame) -> str:
    """One line per verdict: the claim, its effect and interval (+ = less KL), raw and Holm p."""
    lines = []
    for r in measures.verdicts(frame).itertuples():
        effect = "" if pd.isna(r.effect) else f" ({r.effect:+.4f} [{r.ci_lo:+.4f}, {r.ci_hi:+.4f}]"
        raw, holm = p_texts(r)
        effect += "" if not effect else f", p {raw}, Holm {holm})"
        on = f", read on the {r.read_on}" if isinstance(r.read_on, str) and r.read_on else ""
        lines.append(f"- {r.claim}: **{r.verdict}**{effect}{on}")
    return "\n".join(lines)


def frontier_markdown(frame: pd.DataFrame) -> str:
    """The rows-vs-KL frontier: per-item KL of every selector at each budget of the sweep
    (round(rho x M) rows on an M-row cache), best first at the largest budget."""
    points = measures.frontier(frame)
    if points.empty:
        return ""
    kl = points.pivot(index="selector", columns="rho", values="kl_per_item")
    rows = points.groupby("rho")["rows_per_call"].mean()
    kl = kl.sort_values(kl.columns[-1], kind="stable")
    head = " | ".join(f"rho {rho:g} ({rows[rho]:.1f} rows)" for rho in kl.columns)
    lines = [
        "The rows-vs-KL frontier (the sweep: every selector at round(rho x M) rows of an M-row cache; "
        "KL to Dense per item):",
        "",
        f"| selector | {head} |",
        "| --- |" + " --- |" * len(kl.columns),
    ]
    lines += [f"| `{name}` | " + " | ".join(cell(v) for v in r) + " |" for name, r in kl.iterrows()]
    read = {
        measures.OTHER_BENCHMARK: "every item (a benchmark it was not designed on)",
        measures.FRESH: "every item (an item seed it was not designed on)",
    }.get(measures.ours_read_on(frame), "the second half of the items only, as pre-registered")
    return "\n".join(lines + ["", f"`{measures.OURS}` on {read}."])


def cell(value: float) -> str:
    return "not measured" if pd.isna(value) else f"{value:.4f}"


def ceiling_markdown(calls: list[dict]) -> str:
    """The searched ceiling: what the search cost and which numbers are an optimum, how much of the
    reachable it reaches, what its sets are made of beside every selector's, and their overlap."""
    cost = ceiling.search_cost(calls)
    lines = [
        "The searched ceiling (the chunk layout's best-found set) per budget: calls searched exhaustively (the "
        "true optimum over the chunk layout's sets at that count, where they number at most the cap) or locally "
        "(a search's best, never worse than the best selector's set; stopped at a local optimum or at the cap), "
        "evaluations and seconds per call:",
        "",
        "| budget | calls | exhaustive % | local % | local searches at a local optimum % | sets in the space "
        "(median) | evaluations / call | s / call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in cost.itertuples():
        at = "" if pd.isna(r.local_optimum) else f"{100 * r.local_optimum:.0f}"
        lines.append(
            f"| {r.budget} | {r.calls} | {100 * r.exhaustive:.0f} | {100 * r.local:.0f} | {at} | "
            f"{r.space_median:.0f} | {r.evaluations:.1f} | {r.seconds:.2f} |"
        )
    lines += [
        "",
        "How much of the reachable the searched set reaches: per-item KL of the unrepaired cache, the searched "
        "set and token-matched Dense (every row repaired), and (unrepaired - searched) / (unrepaired - "
        "token-matched) [95% CI], and the share of KVComm's own KL (the unrepaired cache's) it recovers, "
        "(unrepaired - searched) / unrepaired [95% CI]:",
        "",
        "| budget | rows / call | unrepaired | searched | token-matched Dense | reached [95% CI] "
        "| of KVComm's KL [95% CI] |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in ceiling.reach(calls).itertuples():
        lines.append(
            f"| {r.budget} | {r.rows_per_call:.1f} | {r.unrepaired:.4f} | {r.searched:.4f} | "
            f"{r.token_matched:.4f} | {100 * r.reached:.0f}% [{100 * r.lo:.0f}, {100 * r.hi:.0f}] | "
            f"{100 * r.recovered:.0f}% [{100 * r.recovered_lo:.0f}, {100 * r.recovered_hi:.0f}] |"
        )
    made, names = ceiling.composition(calls), ceiling.region_names(calls)
    made = made[made["budget"].isin(["", PAIRED])]
    question = "question" if ceiling.DOCSTRING not in names else "question's code, in its docstrings"
    lines += [
        "",
        f"What the sets are made of at the paired count: share of their rows on the agent's exact prefix, in the "
        f"{question}, in agents' answers, in template text, at seams (a reused segment's first {ceiling.SEAM_ROWS} "
        "rows), runs of consecutive rows per set, and the Jaccard overlap with the searched set (`cache`: the "
        "cache's own shares):",
        "",
        f"| selector | {' | '.join(f'{n} %' for n in names)} | seams % | runs / set | Jaccard with searched |",
        "| --- " * (len(names) + 4) + "|",
    ]
    jaccard = ceiling.overlap(calls).get(PAIRED, pd.Series(dtype=float))
    for r in made.itertuples():
        shares = " | ".join(f"{100 * getattr(r, k):.0f}" for k in (*names, "seams"))
        overlap = "" if r.selector not in jaccard.index else f"{jaccard[r.selector]:.2f}"
        lines.append(f"| `{r.selector}` | {shares} | {r.runs:.1f} | {overlap} |")
    return "\n".join(lines)


def markdown(folder) -> str:
    frame = measures.read_arena(folder)
    searched = frame["selector"].map(measures.is_searched).any()
    calls = RunFolder(Path(folder)).calls() if searched else []
    parts = [selector_markdown(frame, bound_line(calls) if searched else ""), frontier_markdown(frame)]
    parts += [ceiling_markdown(calls) if searched else "", verdict_markdown(frame)]
    return "\n\n".join(p for p in parts if p)


def transfer_table(folders) -> pd.DataFrame:
    """Every arena verdict on each folder's model side by side, and whether the verdicts are the same
    (no test across models); the folders' models must differ and their task must be one."""
    tasks = {benchmark_of(f) for f in folders}
    if len(tasks) > 1:
        raise UsageError(
            f"the arena folders hold several tasks ({', '.join(sorted(tasks))}): a transfer table "
            "compares models on one task"
        )
    verdicts = {model_of(f): measures.verdicts(measures.read_arena(f)) for f in folders}
    if len(verdicts) < len(folders):
        raise UsageError("two arena folders hold the same model: a transfer table compares models")
    # no difference test: a per-item KL effect is on its model's own scale (Gemma's ~8x SmolLM2's)
    return transfer(verdicts, test_difference=False)


def benchmark_of(folder) -> str:
    return RunFolder(Path(folder)).settings["benchmark"]


def transfer_lines(folders) -> str:
    return transfer_markdown(transfer_table(folders), [model_of(f) for f in folders])


NAMED = ("draft", "draft:rank=predicted", measures.OURS)  # the lab's rules, read on every arena beside the best


def answer_table(folders) -> pd.DataFrame:
    """Which rows to recompute, one row per arena (model and task) at BCR-chunk's own count: how much of the
    reachable the searched set reaches and how much of KVComm's own KL it recovers, the deployable selector
    (reading no exact cache) that takes the largest share of the searched set's gain over the coin, and the
    shares of the whole-cache draft, the predicted-row draft and `ours` (each with its 95% interval; `ours` has its
    own column and is not a candidate for the best, since on SmolLM2's arena it is read on half the items)."""
    rows = []
    for folder in folders:
        calls = RunFolder(Path(folder)).calls()
        frame = measures.arena_frame(calls)
        reach = ceiling.reach(calls).set_index("budget").loc[PAIRED]
        shares = measures.gap_share(frame)[1].set_index("selector")
        share = shares[["gap_share", "lo", "hi"]].apply(tuple, axis=1)
        deployable = [s for s in shares.index if not make_entry(s).reads_exact and s != measures.OURS]
        best = shares.loc[deployable, "gap_share"].idxmax()
        rows.append(
            {
                "arena": f"{model_of(folder)}, {benchmark_of(folder)}",
                "items": int(reach["items"]),
                "unrepaired": reach["unrepaired"],
                "searched": reach["searched"],
                "reached": (reach["reached"], reach["lo"], reach["hi"]),
                "of_kvcomm": (reach["recovered"], reach["recovered_lo"], reach["recovered_hi"]),
                "best": best,
                "best_share": share[best],
            }
            | {selector: share[selector] for selector in NAMED}
        )
    return pd.DataFrame(rows)


def answer_lines(folders) -> str:
    """`answer_table` as docs/results.md shows it."""
    percent = lambda v: f"{100 * v[0]:.0f}% [{100 * v[1]:.0f}, {100 * v[2]:.0f}]"
    lines = [
        "| arena | items | KL unrepaired | KL searched | searched reaches [95% CI] | of KVComm's KL [95% CI] "
        "| best deployable: share of the searched gain [95% CI] | whole-cache draft | predicted-row draft | `ours` |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in answer_table(folders).to_dict("records"):
        lines.append(
            f"| {r['arena']} | {r['items']} | {r['unrepaired']:.4f} | {r['searched']:.4f} | {percent(r['reached'])} "
            f"| {percent(r['of_kvcomm'])} | `{r['best']}` {percent(r['best_share'])} | "
            + " | ".join(percent(r[s]) for s in NAMED)
            + " |"
        )
    return "\n".join(lines)


def main(folders: list) -> None:
    """Print each folder's tables, then (given several) the transfer table across the models of each task that
    several hold and which rows to recompute on each arena (`answer_lines`)."""
    for folder in folders:
        if not measures.has_records(folder):
            raise UsageError(
                f"{folder} holds no arena records (no calls.jsonl): make them with `bcr arena --n N --out {folder}`, "
                "then report again"
            )
    by_task: dict[str, list] = {}
    for folder in folders:
        by_task.setdefault(benchmark_of(folder), []).append(folder)
    across = [transfer_lines(group) for group in by_task.values() if len(group) > 1]
    across += [answer_lines(folders)] if len(folders) > 1 else []
    print("\n\n".join([*map(markdown, folders), *across]))
