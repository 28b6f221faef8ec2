"""The verdict table of a claims folder, as committed CSVs and as the README's Markdown.

`python -m bcr_core.analysis.claims_report results/claims` recomputes every verdict from the
folder's records (on agreement with Dense, and again on accuracy), writes `verdicts.csv`,
`verdicts_correct.csv` and `grid_table.csv` beside them, and prints the Markdown table and its
list of tests that README shows. Given two or more folders (one per model), each is its own Holm
family, and the transfer table puts every claim's verdict on each model side by side.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bcr_core.analysis import claims, claims_grid
from bcr_core.analysis.protocol import MARGIN, MEASURES

POINTS = {"agrees_dense", "correct", "gap share"}


def compute(folder, grid: claims_grid.ClaimsGrid | None = None) -> dict[str, pd.DataFrame]:
    """The verdicts on agreement and on accuracy, and the grid table, from a claims folder."""
    grid = grid or claims_grid.ClaimsGrid()
    data = claims_grid.load_claims(folder)
    common = dict(
        cacheblend=grid.cacheblend,
        gate_settings=grid.gate(),
        curve=data["curve"],
        verify=data["verify"],
        gate=data["gate"],
    )
    return {
        "verdicts": claims.verdicts(data["items"], data["calls"], grid.bcr, measure="agrees_dense", **common),
        "verdicts_correct": claims.verdicts(data["items"], data["calls"], grid.bcr, measure="correct", **common),
        "grid_table": claims_grid.grid_table(data["items"], data["calls"], recorded(data["items"], grid)),
    }


def recorded(items: pd.DataFrame, grid: claims_grid.ClaimsGrid) -> list[str]:
    """The grid's conditions this folder recorded (a grid still running, or run in part, has fewer)."""
    labels = list(dict.fromkeys(items["condition"]))
    return [c for c in grid.main() + grid.matched() if claims.find(labels, c) in labels]


def write(folder) -> str:
    """Write the three tables into `folder`; return the README's Markdown."""
    tables = compute(folder)
    for name, table in tables.items():
        table.to_csv(Path(folder) / f"{name}.csv", index=False)
    return markdown(tables["verdicts"], tables["verdicts_correct"])


def effect_text(row) -> str:
    if row.effect is None or (isinstance(row.effect, float) and math.isnan(row.effect)):
        return ""
    if row.measure in POINTS:
        return f"{100 * row.effect:+.1f} pts [{100 * row.ci_lo:+.1f}, {100 * row.ci_hi:+.1f}]"
    return f"{row.effect:+.4f} [{row.ci_lo:+.4f}, {row.ci_hi:+.4f}]"


def p_text(p) -> str:
    return "" if p is None or (isinstance(p, float) and math.isnan(p)) else f"{p:.2g}"


def markdown(agree: pd.DataFrame, correct: pd.DataFrame) -> str:
    """The verdict table (agreement with Dense, the accuracy verdict beside it) and one line per
    claim naming its test, unit and what the verdict is read on."""
    header = [
        "| claim | measure | effect [95% CI] | p | p Holm | verdict | verdict on accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines, notes = [], []
    on_accuracy = dict(zip(correct["claim"], correct["verdict"]))
    for i, row in enumerate(agree.itertuples(), start=1):
        measure = MEASURES.get(row.measure, row.measure)
        lines.append(
            f"| {row.claim} | {measure} | {effect_text(row)} | {p_text(row.p)} | {p_text(row.p_holm)} | "
            f"**{row.verdict}** | {on_accuracy.get(row.claim, '')} |"
        )
        extra = f"; read on the {row.read_on}" if isinstance(row.read_on, str) and row.read_on else ""
        rows = f"; rows: {row.rows}" if isinstance(row.rows, str) and row.rows else ""
        needed = ""
        if row.verdict == "undecided" and not pd.isna(row.items_needed):
            needed = f"; 80% power needs {int(row.items_needed):,} items"
        notes.append(f"{i}. {row.claim}: {row.test}{extra}{rows}{needed}.")
    margin = (
        "Effects are signed so that + is the paper's direction. Equivalence margin of the null claims: "
        f"±{100 * MARGIN:g} points, fixed before the runs."
    )
    return "\n".join(header + lines + ["", margin, ""] + notes)


def number(value, digits: int = 1, scale: float = 1.0) -> str:
    return "" if pd.isna(value) else f"{scale * value:.{digits}f}"


def grid_markdown(table: pd.DataFrame) -> str:
    """The grid table as README shows it: per-item measures first, per-call ones as description."""
    lines = [
        "| condition | accuracy % [95% CI] | agrees with Dense % | KL to Dense per item | reuse calls | "
        "first-token agree % | KL on reuse calls | rows / reuse call (share of cached) | wasted rows / reuse call | "
        "vs KVComm: only KVComm / only this | p | KL p vs KVComm |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table.itertuples():
        split = "" if pd.isna(getattr(r, "only_reference_right", None)) else f"{r.only_reference_right:.0f} / "
        split += "" if not split else f"{r.only_condition_right:.0f}"
        lines.append(
            f"| `{r.condition}` | {100 * r.accuracy:.1f} [{100 * r.wilson_lo:.1f}, {100 * r.wilson_hi:.1f}] | "
            f"{number(r.agrees_dense, 1, 100)} | {number(r.kl_per_item, 4)} | {r.reuse_calls} | "
            f"{number(r.first_token_agree, 1, 100)} | {number(r.kl_reuse_calls, 4)} | "
            f"{r.rows_per_reuse_call:.1f} ({100 * r.rows_share:.1f}%) | {r.rows_wasted_per_call:.1f} | {split} | "
            f"{p_text(getattr(r, 'p_exact', None))} | {p_text(getattr(r, 'kl_p_vs_reference', None))} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- across models
MODEL_NAMES = {"default": "SmolLM2-135M", "gemma-3-270m": "Gemma 3 270M"}
NOT_TESTED = "not measured"


def model_of(folder) -> str:
    """The model a claims folder's runs were served by (every run of it must agree)."""
    models = {json.loads(p.read_text()).get("model", "default") for p in sorted(Path(folder).rglob("cell.json"))}
    if len(models) != 1:
        raise ValueError(f"{folder}: runs of {len(models)} models ({', '.join(sorted(models))}); expected one")
    (model,) = models
    return MODEL_NAMES.get(model, model)


def transfer(verdicts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every claim's verdict, effect and items per model (each table its own Holm family), and whether
    the claim transfers: "yes" for the same verdict on every model, "no" for different ones, "open"
    while any model has not measured it."""
    claims_in_order = list(dict.fromkeys(c for table in verdicts.values() for c in table["claim"]))
    rows = []
    for claim in claims_in_order:
        row = {"claim": claim}
        for model, table in verdicts.items():
            found = table[table["claim"] == claim]
            mine = next(found.itertuples(), None)
            row[f"{model}: verdict"] = NOT_TESTED if mine is None else mine.verdict
            row[f"{model}: effect"] = "" if mine is None else effect_text(mine)
            row[f"{model}: n"] = np.nan if mine is None else mine.n
        shown = [row[f"{m}: verdict"] for m in verdicts]
        row["transfers"] = "open" if NOT_TESTED in shown else ("yes" if len(set(shown)) == 1 else "no")
        rows.append(row)
    return pd.DataFrame(rows)


def transfer_markdown(table: pd.DataFrame, models: list[str]) -> str:
    header = ["| claim | " + " | ".join(models) + " | transfers |", "| --- |" + " --- |" * (len(models) + 1)]
    lines = []
    for _, row in table.iterrows():
        cells = []
        for m in models:
            n = "" if pd.isna(row[f"{m}: n"]) else f", n = {int(row[f'{m}: n'])}"
            effect = f" ({row[f'{m}: effect']}{n})" if row[f"{m}: effect"] else ""
            cells.append(f"**{row[f'{m}: verdict']}**{effect}")
        lines.append(f"| {row['claim']} | " + " | ".join(cells) + f" | {row['transfers']} |")
    return "\n".join(header + lines)


def main(folders: list[str]) -> None:
    verdicts = {}
    for folder in folders:
        print(write(folder))
        print()
        print(grid_markdown(pd.read_csv(Path(folder) / "grid_table.csv")))
        print()
        verdicts[model_of(folder)] = pd.read_csv(Path(folder) / "verdicts.csv")
    if len(folders) > 1:
        print(transfer_markdown(transfer(verdicts), list(verdicts)))


if __name__ == "__main__":
    main(sys.argv[1:] or ["results/claims"])
