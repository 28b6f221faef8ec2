"""Running one grid cell into `DIR/NAME` exactly as `bcr run --out DIR/NAME` would (records, resume,
summary.csv): the one function both executors call, in this process and as the Ray task.
"""

from __future__ import annotations

from pathlib import Path

from bcr_core.analysis.reports.summary import write_summary
from bcr_core.engine.loading import shared_backbone
from bcr_core.runs.grid_file import GridCell
from bcr_core.runs.runner import run_cell

# ---------------------------------------------------------------- running one cell


def run_grid_cell(grid_cell: GridCell, out: str, progress: bool = False, on_item=None) -> int:
    """Run (or resume) one cell into out/NAME, as `bcr run` would; returns its item records.
    This is also the Ray task: it writes everything itself and returns only a count."""
    folder = Path(out) / grid_cell.name
    items = run_cell(
        shared_backbone(grid_cell.load, grid_cell.cell.dtype),
        grid_cell.cell,
        folder,
        progress=progress,
        batch=grid_cell.batch,
        copies=grid_cell.copies,
        label=grid_cell.name,
        on_item=on_item,
    )
    write_summary(items, grid_cell.cell.reference, folder)
    return len(items)
