"""The verdict table of a claims folder, as committed CSVs and as docs/results.md's Markdown.

`bcr report claims results/claims` recomputes every verdict from the folder's records (one family,
on accuracy, the paper's measure; agreement with Dense and KL to Dense beside each row as
description), writes `verdicts.csv` and `grid_table.csv` beside them, and prints the Markdown table
and its list of tests that docs/results.md shows. Given two folders (one per model, on the same
items), each is its own Holm family, and the transfer table reads each claim's transfer from paired
tests (difference and equivalence) of the two models' per-item values (`bcr_core.analysis.claims.transfer`).
`SMOLLM2`, `GEMMA` and `QWEN_CODER` are the folders docs/results.md reads.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from bcr_core.analysis.claims import confirmation, planning, synthetic
from bcr_core.analysis.claims import transfer as transfer_test
from bcr_core.analysis.claims.protocol import LINE_MARGIN, MEASURES, MIN_EFFECT, REPAIR_MARGIN
from bcr_core.analysis.reports import claims_grid
from bcr_core.analysis.reports.summary import GRID, KL_RESAMPLES, condition_table
from bcr_core.analysis.statistics import monte_carlo
from bcr_core.conditions import find
from bcr_core.errors import UsageError
from bcr_core.paths import RESULTS, all_written_whole
from bcr_core.run_folder import RunFolder, run_folders

POINTS = {"agrees_dense", "agrees_code", "correct", "gap share"}
LINE_CLAIM = "the gate only slides along Equation 3's line"
GATE_READ = {  # which gate sweep the line's verdict reads, and whether its rule came first
    claims_grid.GATE_FRESH: f"gate sweep on items of a fresh item seed (`{claims_grid.GATE_FRESH}/`), rule fixed first",
    claims_grid.GATE: f"gate sweep on the grid's items (`{claims_grid.GATE}/`), read after the fact: its margin "
    "was fixed after these records were committed",
}
SMOLLM2 = RESULTS / "claims"
# Gemma's rows: the grid with base caches behind <bos>; the one made before that fix stays, labelled
GEMMA = RESULTS / "claims-gemma-3-270m-bos"
QWEN_CODER = RESULTS / "claims-qwen2.5-coder-0.5b"  # its synthetic grid, and its HumanEval cell in `humaneval/`
FOLDER_NOTES = {"claims-gemma-3-270m": "made before the <bos> fix"}


def compute(
    folder, grid: claims_grid.ClaimsGrid | None = None, seed: int = 0, measure: str = "correct"
) -> dict[str, pd.DataFrame]:
    """The verdicts (one family, on `measure`: accuracy, the paper's) and the grid table, from a claims
    folder (`seed`: the sign-flip resampler's)."""
    grid = grid or claims_grid.ClaimsGrid()
    data = claims_grid.load_claims(folder, grid.benchmark)
    common = dict(
        cacheblend=grid.cacheblend,
        gate_settings=grid.gate(),
        curve=data["curve"],
        verify=data["verify"],
        gate=data["gate"],
        seed=seed,
    )
    verdicts = synthetic.verdicts(data["items"], data["calls"], grid.bcr, measure=measure, **common)
    line = verdicts["claim"] == LINE_CLAIM
    if data["gate_folder"] and line.any():
        verdicts.loc[line, "read_on"] = GATE_READ[data["gate_folder"]]
    return {
        "verdicts": verdicts,
        "grid_table": condition_table(
            data["items"], "kvcomm", conditions=recorded(data["items"], grid), calls=data["calls"], groups=GRID
        ),
    }


def recorded(items: pd.DataFrame, grid: claims_grid.ClaimsGrid) -> list[str]:
    """The grid's conditions this folder recorded (a grid still running, or run in part, has fewer)."""
    labels = list(dict.fromkeys(items["condition"]))
    return [c for c in grid.main() + grid.matched() + grid.budgets() if find(labels, c) in labels]


def write(tables: dict[str, pd.DataFrame], out: Path) -> None:
    """Write a folder's tables into `out` as `<name>.csv`, all of them or none (the committed form)."""
    out.mkdir(parents=True, exist_ok=True)
    with all_written_whole([out / f"{name}.csv" for name in tables]) as partials:
        for partial, table in zip(partials, tables.values()):
            table.to_csv(partial, index=False)


def written_to(out: Path | None, folder: Path, folders: list[Path]) -> Path | None:
    """Where `--out` puts one folder's tables: `out` itself for a single folder, `out/<folder name>` for several
    (None: print only)."""
    if out is None:
        return None
    if len(folders) == 1:
        return out
    if len({f.name for f in folders}) < len(folders):
        raise UsageError(f"--out {out} with several folders writes each into its own name there; two are named alike")
    return out / folder.name


def check_not_arena(folder: Path) -> None:
    """A claims folder holds runs in its subfolders; an arena's run folder is refused, naming its report."""
    try:
        arena = RunFolder(Path(folder)).is_arena
    except UsageError:  # no readable run's settings here: the claims' own reading says what is missing
        return
    if arena:
        raise UsageError(
            f"{folder} is an arena folder (its cell.json names selectors), not a claims folder: "
            f"run `bcr report arena {folder}`"
        )


def effect_text(row) -> str:
    if row.effect is None or (isinstance(row.effect, float) and math.isnan(row.effect)):
        return ""
    if row.measure == "share":
        null = getattr(row, "null", 0.0)
        against = f" (vs {100 * null:.0f}%)" if null and not pd.isna(null) else ""
        return f"{100 * row.effect:.0f}% [{100 * row.ci_lo:.0f}, {100 * row.ci_hi:.0f}]{against}"
    if row.measure in POINTS:
        return f"{100 * row.effect:+.1f} pts [{100 * row.ci_lo:+.1f}, {100 * row.ci_hi:+.1f}]"
    return f"{row.effect:+.4f} [{row.ci_lo:+.4f}, {row.ci_hi:+.4f}]"


def p_text(p) -> str:
    return monte_carlo.p_text(p)


def p_texts(row) -> tuple[str, str]:
    """The raw and Holm p of a row: "< 1/R" at the sign-flip floor, and Holm's then a bound."""
    resamples = getattr(row, "resamples", None)
    resamples = None if resamples is None or pd.isna(resamples) else int(resamples)
    floor = monte_carlo.at_floor(row.p, resamples)
    return monte_carlo.p_text(row.p, resamples), monte_carlo.p_text(row.p_holm, bound=floor)


def power_text(row) -> str:
    """The items 80% power needs, for an undecided row: prospective at the stated effect (a TOST's
    at its margin), and the post-hoc figure at the observed effect, labelled so."""
    if row.verdict != "undecided" or pd.isna(row.items_needed):
        return ""
    if row.kind == "equivalence":
        return f"; the TOST needs {int(row.items_needed):,} items for 80% power at this margin"
    target = f"+{100 * MIN_EFFECT:g} pts" if row.measure != "kl_mean" else "a tenth of KVComm's KL"
    post = getattr(row, "items_needed_post_hoc", None)
    post = "" if post is None or pd.isna(post) else f" (post hoc, at the observed effect: {int(post):,})"
    return f"; 80% power at {target} needs {int(row.items_needed):,} items{post}"


def markdown(table: pd.DataFrame) -> str:
    """The verdict table (one family, on accuracy) and one line per claim naming its test, unit, what
    the verdict is read on and what is printed beside it (agreement with Dense and KL, description)."""
    header = [
        "| claim | measure | effect [95% CI] | p | p Holm | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines, notes = [], []
    for i, row in enumerate(table.itertuples(), start=1):
        measure = MEASURES.get(row.measure, row.measure)
        p, p_holm = p_texts(row)
        lines.append(f"| {row.claim} | {measure} | {effect_text(row)} | {p} | {p_holm} | **{row.verdict}** |")
        extra = f"; read on the {row.read_on}" if isinstance(row.read_on, str) and row.read_on else ""
        rows = f"; rows: {row.rows}" if isinstance(row.rows, str) and row.rows else ""
        said = f" Beside it: {row.evidence}." if isinstance(row.evidence, str) and row.evidence else ""
        notes.append(f"{i}. {row.claim}: {row.test}{extra}{rows}{power_text(row)}.{said}")
    margin = (
        "One family per model, read on accuracy (the paper's measure), each comparison tested once; "
        "agreement with Dense and KL to Dense are printed beside each row as description. Effects are signed "
        "so that + is the paper's direction; shares are of the gap named in the test. Margins, from the "
        f"paper's numbers: ±{100 * LINE_MARGIN:g} points for Equation 3's line and for a repair at or below "
        f"token-matched Dense (§4.2: no policy more than 1.6 points off the line), ±{100 * REPAIR_MARGIN:g} "
        "points for two repairs level (§5: the draft over a coin, the smallest gap between two repairs it "
        "claims). An equivalence verdict is read on the 90% interval (TOST at 0.05, both ways), every printed "
        "interval is 95%. A p at the floor of R sign flips prints as < 1/R."
    )
    return "\n".join(header + lines + ["", margin, ""] + notes)


def number(value, digits: int = 1, scale: float = 1.0) -> str:
    return "" if pd.isna(value) else f"{scale * value:.{digits}f}"


def kl_p_text(p) -> str:
    """The grid's KL p: a sign-flip p, so at its resampling floor a bound ("< 5e-05"), as the verdicts print it."""
    return monte_carlo.p_text(p, KL_RESAMPLES)


def grid_markdown(table: pd.DataFrame) -> str:
    """The grid table as docs/results.md shows it: per-item measures first, per-call ones as description."""
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
            f"{p_text(getattr(r, 'p_exact', None))} | {kl_p_text(getattr(r, 'kl_p_vs_reference', None))} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- across models
MODEL_NAMES = {"default": "SmolLM2-135M", "gemma-3-270m": "Gemma 3 270M", "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B"}


def model_of(folder) -> str:
    """The model a claims folder's runs were served by (every run of it must agree)."""
    models = {run.model for run in run_folders(folder)}
    if len(models) != 1:
        raise UsageError(f"{folder}: runs of {len(models)} models ({', '.join(sorted(models))}); expected one")
    (model,) = models
    return MODEL_NAMES.get(model, model)


def label_of(folder) -> str:
    """The model's name, with what the folder was made under where that matters (`FOLDER_NOTES`)."""
    note = FOLDER_NOTES.get(Path(folder).name)
    return model_of(folder) + (f" ({note})" if note else "")


def transfer(verdicts: dict[str, pd.DataFrame], test_difference: bool = True) -> pd.DataFrame:
    """The transfer table: each model's verdicts (its own Holm family) and one paired test per claim
    of the difference of the two models' per-item values (`bcr_core.analysis.claims.transfer.transfer`)."""
    return transfer_test.transfer(verdicts, test_difference)


def model_effect(row, model: str) -> str:
    shown = SimpleNamespace(**{k: row[f"{model}: {k}"] for k in ("measure", "effect", "ci_lo", "ci_hi")})
    return effect_text(shown) if shown.measure is not None else ""


def transfer_markdown(table: pd.DataFrame, models: list[str]) -> str:
    """The transfer table: a row per claim, each model's verdict and effect, and either the paired tests
    across models (difference and equivalence, Holm) or, where none is run, whether the verdicts are the same.
    With more than two models each later model is read against the first, one column each: whether the claim
    transfers, and the difference with its interval."""
    tested = any(column.endswith("transfers") for column in table)
    if not tested:
        tail = ["same verdict"]
    elif len(models) == 2:
        tail = ["difference, per item [95% CI]", "p Holm", "equivalent within", "TOST p Holm", "transfers"]
    else:
        tail = [f"{other} vs {models[0]}: transfers (difference [95% CI], equivalent within)" for other in models[1:]]
    header = [f"| claim | {' | '.join(models + tail)} |", "| --- |" + " --- |" * (len(models) + len(tail))]
    lines = []
    for _, row in table.iterrows():
        cells = []
        for m in models:
            n = "" if pd.isna(row[f"{m}: n"]) else f", n = {int(row[f'{m}: n'])}"
            effect = model_effect(row, m)
            cells.append(f"**{row[f'{m}: verdict']}**" + (f" ({effect}{n})" if effect else ""))
        if not tested:
            cells.append(row["same verdict"])
        elif len(models) == 2:
            cells += transfer_cells(row, models[0])
        else:
            for other in models[1:]:
                prefix = transfer_test.comparison_prefix(models, other)
                diff, _, margin, _, reading = transfer_cells(row, models[0], prefix)
                said = ", ".join(part for part in (diff, margin) if part)
                cells.append(reading + (f" ({said})" if said else ""))
        lines.append(f"| {row['claim']} | " + " | ".join(cells) + " |")
    return "\n".join(header + lines)


def transfer_cells(row, model: str, prefix: str = "") -> list[str]:
    """The difference with its interval and Holm p, the margin, the TOST's Holm p and the reading (of the
    comparison whose columns carry `prefix`)."""
    diff = ""
    scale, digits = (1, 4) if row[f"{model}: measure"] == "kl_mean" else (100, 1)
    unit = " pts" if scale == 100 else ""

    def get(name: str):
        return row.get(prefix + name)

    if get("diff") is not None and not pd.isna(get("diff")):
        diff = (
            f"{scale * get('diff'):+.{digits}f}{unit} [{scale * get('diff_lo'):+.{digits}f}, "
            f"{scale * get('diff_hi'):+.{digits}f}], n = {int(get('diff_n'))}"
        )
    margin = "" if pd.isna(row.get("margin")) else f"±{scale * row['margin']:g}{unit}"
    holm = "" if pd.isna(get("diff_p_holm")) else monte_carlo.p_text(get("diff_p_holm"))
    tost = "" if pd.isna(get("tost_p_holm")) else monte_carlo.p_text(get("tost_p_holm"))
    return [diff, holm, margin, tost, get("transfers")]


def incomplete_text(table: pd.DataFrame) -> str:
    """An incomplete confirmation: its planned claims, no verdict, and why."""
    lines = ["| claim | verdict |", "| --- | --- |"] + [f"| {c} | **incomplete** |" for c in table["claim"]]
    return (
        "\n".join(lines)
        + f"\n\nIncomplete: the folder {table['evidence'].iloc[0]}; no test is run until it holds them."
    )


def plan_confirmation(pilot: Path, claims: list[str] | None, power: float, max_items: int) -> str:
    """`bcr plan`: the pilot's verdicts read from its records, then the confirmation they call for
    (`claims.planning.plan`), on items no folder under results/ read."""
    planning.find_pilot(pilot)  # a folder that is no pilot: one line, before any record is read
    return planning.plan(pilot, compute(pilot)["verdicts"], claims, power, max_items, RESULTS)


def main(folders: list[Path], out: Path | None = None) -> None:
    """Print each claims folder's verdict and grid tables and its confirmations' families (and, given several
    models, the transfer table); with `out`, also write the tables as the committed CSVs (`written_to`)."""
    for folder in folders:
        check_not_arena(folder)
    verdicts = {}
    for folder in folders:
        tables = compute(folder)
        target = written_to(out, folder, folders)
        if target is not None:
            write(tables, target)
        print(f"{markdown(tables['verdicts'])}\n\n{grid_markdown(tables['grid_table'])}\n")
        verdicts[label_of(folder)] = tables["verdicts"]
        for run in confirmation.confirmations(folder):
            print_confirmation(run, None if target is None else target / run.path.relative_to(folder))
    if len(folders) > 1:
        print(transfer_markdown(transfer(verdicts), list(verdicts)))


def print_confirmation(run: RunFolder, target: Path | None) -> None:
    found = confirmation.confirmation_verdicts(run, root=RESULTS)
    if target is not None:
        write({"verdicts": found}, target)
    planned = f"{len(found)} claims planned, n = {run.settings['n']}"
    print(f"Confirmation {run.path} ({planned}; its own family, beside the pilot's):\n")
    print(markdown(found) if (found["verdict"] != confirmation.INCOMPLETE).all() else incomplete_text(found))
    print()
