"""Grids: many `bcr run` cells named in one TOML file, run in this process or on Ray.

A grid file has a `[defaults]` table (any `bcr run` setting) and one `[cells.NAME]` table per cell
overriding it. Each cell runs into `DIR/NAME/` exactly as `bcr run --out DIR/NAME` would write it
(same records, same resume, same summary.csv), so a cell can be inspected, resumed or rerun on its
own. The executors only decide where cells run:

- in this process, one cell after another (the default; nothing else to install or start);
- on Ray, one task per cell (`--ray` starts a local instance for the run, `--ray ADDRESS` joins a
  cluster). The task writes the records itself, to DIR (shared storage on a cluster), and the
  driver only watches DIR, so it holds no results; a task that dies is reported, and the next
  invocation reruns its cell, resuming its items.

The whole file is checked before any work, and the combined table is built from DIR alone.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.runs.grid_file import GridCell, GridError
from bcr_core.runs.grid_folder import check_folders, items_done
from bcr_core.runs.grid_task import run_grid_cell


def run_in_process(grid: list[GridCell], out: Path, progress: bool = True) -> list[str]:
    """Every unfinished cell, one after another in this process (one bar per running cell and one
    for the grid's items); returns the names of cells that failed, each reported on stderr."""
    from tqdm.auto import tqdm

    todo = check_folders(grid, out)
    total = sum(g.items for g in grid)
    overall = tqdm(total=total, initial=sum(items_done(g, out) for g in grid), desc="grid items", disable=not progress)
    failed = []
    with overall:  # closed on ^C too, so the interruption's line is the last
        for g in todo:
            try:
                run_grid_cell(g, str(out), progress=progress, on_item=lambda: overall.update(1))
            except Exception as err:  # the cell cannot run (a usage error) or hit a bug: it fails, the rest run
                print(f"bcr grid: cell {g.name} failed: {failure(err)}", file=sys.stderr, flush=True)
                failed.append(g.name)
    return failed


def failure(err: BaseException) -> str:
    """A failed cell's reason for its log: a usage error's one line, or a bug's whole traceback."""
    if isinstance(err, UsageError):
        return str(err)
    trace = "".join(traceback.format_exception(err)).rstrip()
    return f"internal error (a bug, not a setting to fix): {type(err).__name__}: {err}\n{trace}"


def run_grid(
    grid: list[GridCell], out: Path, ray: str | None = None, progress: bool = True, quiet: bool = False
) -> list[str]:
    """Run every unfinished cell in this process (`ray` None) or on Ray (`ray` LOCAL or an address)."""
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = "it is a file" if Path(out).is_file() else err.strerror or err
        raise GridError(f"--out {out} cannot hold a grid: {reason}; give a folder") from None
    if ray is None:
        return run_in_process(grid, out, progress=progress)
    from bcr_core.runs.grid_ray import run_on_ray  # loaded when asked for; it reads the grid_* modules, not this one

    return run_on_ray(grid, out, ray, quiet=quiet)


def run_grid_file(file: Path, out: Path, model: str, dtype: str, ray: str | None = None, quiet: bool = False):
    """`bcr grid`: the file read into cells (`--model`/`--dtype` where given), every unfinished cell run, and the
    combined table of what DIR holds, written as DIR/grid.csv; returns it with the cells that did not finish."""
    from bcr_core.paths import write_text_whole
    from bcr_core.runs.grid_file import read_grid
    from bcr_core.runs.grid_folder import combined_table

    grid = read_grid(file, model=model, dtype=dtype)
    failed = run_grid(grid, out, ray=ray, quiet=quiet)
    table = combined_table(grid, out)
    write_text_whole(out / "grid.csv", table.to_csv(index=False))
    return table, failed
