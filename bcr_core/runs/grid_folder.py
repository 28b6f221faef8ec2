"""What a grid's output folder DIR holds, read from disk alone (nothing kept in memory): items done
per cell, whether a cell is finished or locked by a running task, the cells still to run, and the
combined table of every cell's records.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bcr_core.analysis.reports.summary import condition_table
from bcr_core.errors import UsageError
from bcr_core.runs.grid_file import GridCell, GridError
from bcr_core.runs.run_writer import check_folder, read_items


def items_done(grid_cell: GridCell, out: Path) -> int:
    """Item records of the cell's conditions in DIR/NAME (read from disk, nothing kept)."""
    records = read_items(Path(out) / grid_cell.name / "items.jsonl", grid_cell.cell.conditions)
    return len({(r["condition"], r["item_id"]) for r in records})


def is_finished(grid_cell: GridCell, out: Path) -> bool:
    """Every condition has every item in DIR/NAME/items.jsonl."""
    return items_done(grid_cell, out) == grid_cell.items


def combined_table(grid: list[GridCell], out: Path) -> pd.DataFrame:
    """`condition_table` of every cell that has records, read from DIR, with the cell's name and whether
    it is finished in front: per condition accuracy with its interval, Dense-agreement, reuse rate,
    rows per call, and the paired split against the reference with its exact p."""
    tables = []
    for g in grid:
        records = read_items(Path(out) / g.name / "items.jsonl", g.cell.conditions)
        if not records:
            continue
        items = pd.DataFrame(records)
        summary = condition_table(items.sort_values("index", kind="stable"), g.cell.reference)
        summary.insert(0, "finished", len(items.drop_duplicates(["condition", "item_id"])) == g.items)
        summary.insert(0, "cell", g.name)
        tables.append(summary)
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["cell", "finished", "condition"])


def check_folders(grid: list[GridCell], out: Path) -> list[GridCell]:
    """The cells still to run; a folder holding another run's records stops the grid before any work."""
    todo = []
    for g in grid:
        try:
            check_folder(Path(out) / g.name, g.cell)
            finished = is_finished(g, out)  # its records are read, and checked, here
        except UsageError as err:
            raise GridError(f"cell {g.name}: {err}") from None
        if not finished:
            todo.append(g)
    return todo


def lock_holder(folder: Path) -> str | None:
    """The pid in a run folder's lock (its task is writing there), or None."""
    try:
        return (folder / ".lock").read_text().strip()
    except OSError:
        return None
