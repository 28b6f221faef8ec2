"""The verdict table of a claims folder, as committed CSVs and as the README's Markdown.

`python -m bcr_core.experiments.claims_report results/claims` recomputes every verdict from the
folder's records (on agreement with Dense, and again on accuracy), writes `verdicts.csv`,
`verdicts_correct.csv` and `grid_table.csv` beside them, and prints the Markdown table and its
list of tests that README shows.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from bcr_core.experiments import claims, claims_grid
from bcr_core.experiments.protocol import MARGIN, MEASURES

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
        "grid_table": claims_grid.grid_table(data["items"], data["calls"], grid.main() + grid.matched()),
    }


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


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "results/claims"
    print(write(folder))
    print()
    print(grid_markdown(pd.read_csv(Path(folder) / "grid_table.csv")))
