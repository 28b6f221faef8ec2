"""`bcr report humaneval FOLDER`: the HumanEval family (`humaneval_claims`) and its seams, from one cell.

Writes `verdicts.csv` into the folder and prints the verdict table with each row's test, measure and the
items 80% power would need. From a run folder (whose calls keep their id lists) it also counts the seams of
token-matched Dense's calls (`seams`, with the model's tokenizer) into `seams.csv`; a committed folder (id
lists replaced by counts) prints the `seams.csv` committed beside its records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bcr_core.analysis.claims import humaneval_selectors, workload
from bcr_core.analysis.claims.factorial import factorial_conditions, factorial_markdown, factorial_table
from bcr_core.analysis.claims.humaneval import HUMANEVAL_MARGIN, PLAN, humaneval_verdicts, with_code_agreement
from bcr_core.analysis.claims.protocol import LINE_MARGIN, MEASURES
from bcr_core.analysis.reports import claims_report, seams
from bcr_core.conditions import parse
from bcr_core.run_folder import RunFolder

SEAMS = "seams.csv"
NO_REUSE_PATH = ("dense", "dense-again")  # conditions that serve the template's ids only
NAMES = MEASURES | {"correct": "pass@1"}  # a HumanEval item is correct when its code passes the unit tests


def markdown(table: pd.DataFrame) -> str:
    header = ["| claim | measure | effect [95% CI] | p | p Holm | verdict |", "| --- | --- | --- | --- | --- | --- |"]
    lines, notes = [], []
    for i, row in enumerate(table.itertuples(), start=1):
        p, p_holm = claims_report.p_texts(row)
        lines.append(
            f"| {row.claim} | {NAMES.get(row.measure, row.measure)} | {claims_report.effect_text(row)} "
            f"| {p} | {p_holm} | **{row.verdict}** |"
        )
        said = f" Beside it: {row.evidence}." if isinstance(row.evidence, str) and row.evidence else ""
        notes.append(f"{i}. {row.claim}: {row.test}{claims_report.power_text(row)}.{said}")
    return "\n".join(header + lines + ["", plan_text(table), ""] + notes)


def plan_text(table: pd.DataFrame) -> str:
    """What the family's rows are read on, as fixed before its cell ran."""
    if set(table["claim"]) <= set(humaneval_selectors.PLAN):
        return (
            f"One family (Holm over {len(table)} rows, {len(humaneval_selectors.PLAN)} planned): each selector "
            "against its row-matched coin and against the paper's whole-cache draft, on per-item teacher-forced KL "
            "to Dense (+: the first leaves less KL), sign-flip over items; every interval 95%."
        )
    return (
        f"One family (Holm over {len(table)} rows), each row read on the measure fixed before the run "
        f"({len(PLAN)} rows planned): pass@1 for the paper's two HumanEval claims, TOST within "
        f"±{100 * HUMANEVAL_MARGIN:g} points (Table 4(d): every condition inside four points); the final code "
        f"identical to Dense's for the tokenization rows (the repair's lead under {100 * LINE_MARGIN:g} points); "
        "per-item teacher-forced KL to Dense for the cache rows. + is the paper's direction; every interval 95%, "
        "an equivalence verdict read on its 90% interval."
    )


def conditions_table(items: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Per condition, as description (the aligned assembly's conditions among them): items, pass@1, final
    code identical to Dense's, mean KL to Dense, reuse rate, share of calls whose ids are Dense's, rows
    recomputed per reuse call and the share of them that were exact already (the agent's own prefix), and the
    median time to first token of its reuse calls (a dense prefill's decode is shared between the
    conditions that made the same one in a batched run, so only an assembled cache's call times itself)."""
    items = with_code_agreement(items, "dense")
    wanted = {
        "items": ("item_id", "size"),
        "pass_at_1": ("correct", "mean"),
        "code_as_dense": ("agrees_code", "mean"),
        "kl_to_dense": ("kl_mean", "mean"),
        "reuse_rate": ("reuse_rate", "mean"),
    }
    table = items.groupby("condition", sort=False).agg(**{k: v for k, v in wanted.items() if v[0] in items})
    by_condition = calls.groupby("condition", sort=False)
    if "ids_match" in calls:  # a condition that never takes the reuse path's ids has no such share
        shares = by_condition["ids_match"].mean()
        table["ids_as_dense"] = shares.where([parse(c).name not in NO_REUSE_PATH for c in shares.index])
    reuse = calls[calls["reason"] == "reuse"].groupby("condition") if "reason" in calls else None
    if reuse is not None and {"rows_recomputed", "rows_wasted"} <= set(calls):
        table["rows_per_reuse_call"] = reuse["rows_recomputed"].mean()
        recomputed = reuse["rows_recomputed"].sum()
        table["exact_share"] = (reuse["rows_wasted"].sum() / recomputed).where(recomputed > 0)
    if reuse is not None and "ttft_s" in calls:
        table["reuse_ttft_s"] = reuse["ttft_s"].median()
    return table.reset_index()


def conditions_markdown(table: pd.DataFrame) -> str:
    """`conditions_table` as docs/results.md shows it: shares in percent, KL to four places, times in seconds."""
    columns = {
        "items": ("items", lambda v: f"{int(v)}"),
        "pass_at_1": ("pass@1 %", lambda v: f"{100 * v:.1f}"),
        "code_as_dense": ("final code = Dense's %", lambda v: f"{100 * v:.1f}"),
        "kl_to_dense": ("KL to Dense per item", lambda v: f"{v:.4f}"),
        "reuse_rate": ("reuse rate %", lambda v: f"{100 * v:.1f}"),
        "ids_as_dense": ("calls whose reuse-path ids are Dense's %", lambda v: f"{100 * v:.1f}"),
        "rows_per_reuse_call": ("rows / reuse call", lambda v: f"{v:.1f}"),
        "exact_share": ("of them exact already %", lambda v: f"{100 * v:.1f}"),
        "reuse_ttft_s": ("median TTFT of reuse calls, s", lambda v: f"{v:.2f}"),
    }
    shown = [c for c in columns if c in table]
    lines = [
        "| condition | " + " | ".join(columns[c][0] for c in shown) + " |",
        "| --- |" + " --- |" * len(shown),
    ]
    for _, row in table.iterrows():
        cells = ["" if pd.isna(row[c]) else columns[c][1](row[c]) for c in shown]
        lines.append(f"| `{row['condition']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def floor_text(items: pd.DataFrame, calls: pd.DataFrame) -> str:
    """The instrument's floor beside the agreement measures: `dense-again`'s agreement with Dense where the cell
    ran it; else what the records can say: first calls other conditions served by a dense prefill of Dense's
    very ids (a gate's fallback under the aligned assembly), whose tokens should be Dense's and are not always."""
    conditions = list(dict.fromkeys(items["condition"]))
    if "dense-again" in conditions:
        agreed = with_code_agreement(items, "dense")
        again = agreed[agreed["condition"] == "dense-again"]
        own = calls[calls["condition"] == "dense-again"]
        identical = own["fidelity"].map(lambda f: bool(f and f.get("identical"))).mean() if "fidelity" in own else None
        said = f"; calls identical to the reference {100 * identical:.1f}%" if identical is not None else ""
        return (
            f"Floor (`dense-again`, Dense recomputed as the serial conditions are served): final code = Dense's on "
            f"{100 * again['agrees_code'].mean():.1f}% of {len(again)} items{said}."
        )
    if not {"output_tokens", "reason", "ids_match"} <= set(calls):
        return "Floor: no `dense-again` in this cell, and its calls keep too little to read one from."
    first = calls.groupby(["condition", "item_id"], sort=False).head(1)  # each condition's first call of an item
    dense = first[first["condition"] == "dense"].set_index("item_id")["output_tokens"]
    same = first[(first["condition"] != "dense") & (first["reason"] != "reuse") & first["ids_match"].astype(bool)]
    same = same[same["item_id"].isin(dense.index)]
    moved = same[[tokens != dense[item] for tokens, item in zip(same["output_tokens"], same["item_id"])]]
    tasks = ", ".join(sorted(set(moved["item_id"]), key=lambda t: (len(t), t)))
    return (
        f"Floor: no `dense-again` in this cell. From its records: of the {len(same)} first calls other conditions "
        f"served by a dense prefill of Dense's very ids, {len(moved)} gave tokens other than Dense's"
        + (f" ({tasks})" if tasks else "")
        + ": the decoder's batch arrangement moved them, and every agreement measure carries that noise."
    )


def seams_markdown(table: pd.DataFrame) -> str:
    """The seam counts (`seams.seam_counts`) as docs/results.md shows them: the template's token, the reuse
    path's pieces (their text, as the model's tokenizer decoded them), seams and calls."""
    lines = [
        "| the template's token | the reuse path's pieces | seams | calls (share) |",
        "| --- | --- | --- | --- |",
    ]
    for _, row in table.iterrows():
        pieces = " + ".join(code_span(repr(piece)) for piece in json.loads(row["reuse_path_split"]))
        lines.append(
            f"| {code_span(row['kind'])} | {pieces} | {int(row['seams'])} "
            f"| {int(row['calls'])} ({100 * row['share_of_calls']:.1f}%) |"
        )
    return "\n".join(lines)


def code_span(text: str) -> str:
    """`text` as a Markdown code span inside a table cell: doubled delimiters around a backtick, pipes escaped."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def seam_table(model: str, calls: pd.DataFrame) -> pd.DataFrame | None:
    """Seam counts over token-matched Dense's calls (`seamed_condition`), from their id lists (None for a
    committed folder, whose calls keep only counts)."""
    if calls.empty or "merged_ids" not in calls:
        return None
    from transformers import AutoTokenizer

    from bcr_core.engine.models import resolve

    chosen = calls[calls["condition"] == seamed_condition(calls)].to_dict("records")
    rows = seams.seam_rows(chosen, AutoTokenizer.from_pretrained(resolve(model)))
    return seams.seam_counts(rows, len(chosen))


def seamed_condition(calls: pd.DataFrame) -> str:
    """The condition whose calls the seams are counted on: token-matched Dense, any other where it did not run."""
    conditions = list(dict.fromkeys(calls["condition"]))
    return "token-matched-dense" if "token-matched-dense" in conditions else conditions[0]


def seams_said(calls: pd.DataFrame) -> str:
    """Whose calls the seam table counts, how many, and on how many the reuse path's ids are Dense's."""
    name = seamed_condition(calls)
    own = calls[calls["condition"] == name]
    return f"{name}'s {len(own)} calls; ids identical to Dense's on {int(own['ids_match'].sum())}"


def partial_text(items: pd.DataFrame, settings: dict) -> str:
    """A line saying the folder holds fewer items than its cell planned, where it does: each row is then read
    on the items both its conditions hold, which is not the planned read."""
    done, planned = items.groupby("condition")["item_id"].nunique(), settings.get("n")
    if planned is None or done.min() >= planned:
        return ""
    counts = ", ".join(f"{c} {k}" for c, k in done.items())
    return (
        f"**Partial**: {done.min()} to {done.max()} of the {planned} planned items ({counts}); each row is "
        "read on the items both its conditions hold, not the planned read.\n\n"
    )


def main(folders: list[Path], out: Path | None = None) -> None:
    """Each HumanEval run folder's family, every condition and its seams; with a synthetic claims folder of the
    same model beside it, also whether the cost of reuse is workload-specific on that model (`workload`). With
    `out`, the family's verdicts.csv and the seams counted from id lists are written too (`written_to`)."""
    humaneval = [f for f in folders if (f / "cell.json").is_file()]
    synthetic = {claims_report.model_of(f): f for f in folders if f not in humaneval}
    for folder in humaneval:
        run = RunFolder(folder)
        items, calls = pd.DataFrame(run.items()), pd.DataFrame(run.calls())
        table = cell_family(items, calls)
        found = seam_table(run.model, calls)
        target = claims_report.written_to(out, folder, humaneval)
        if target is not None:
            claims_report.write({"verdicts": table} | ({} if found is None else {"seams": found}), target)
        print(f"## {folder} ({run.model})\n\n{partial_text(items, run.settings)}{markdown(table)}\n")
        print(f"Every condition (description):\n\n{conditions_markdown(conditions_table(items, calls))}\n")
        print(floor_text(items, calls) + "\n")
        cells = factorial_conditions(list(dict.fromkeys(items["condition"])))
        if cells is not None:
            square = factorial_table(with_code_agreement(items, "dense"), cells)
            print(f"The tax as the 2x2 the cell holds (description):\n\n{factorial_markdown(square)}\n")
        print_seams(folder, calls, found)
        same_model = synthetic.get(claims_report.model_of(folder)) if synthetic else None
        if same_model is not None:
            print(workload.workload_line(claims_report.compute(same_model)["verdicts"], table) + "\n")


def cell_family(items: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """The family a HumanEval cell was planned with: the selectors' (`claims.humaneval_selectors`) for a cell
    serving `ours`, else the paper's HumanEval claims (`claims.humaneval`)."""
    if humaneval_selectors.is_selectors_cell(list(dict.fromkeys(items["condition"]))):
        return humaneval_selectors.selector_verdicts(items, calls)
    return humaneval_verdicts(items, calls)


def print_seams(folder: Path, calls: pd.DataFrame, found: pd.DataFrame | None) -> None:
    """The seams counted from the calls' id lists, or, for a committed folder (counts only), its seams.csv."""
    if found is not None:
        print(f"Seams ({seams_said(calls)}):\n\n{seams_markdown(found)}\n")
    elif (folder / SEAMS).is_file():
        committed = pd.read_csv(folder / SEAMS, keep_default_na=False)
        print(f"Seams ({seams_said(calls)}; committed):\n\n{seams_markdown(committed)}\n")
