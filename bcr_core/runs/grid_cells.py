"""A grid file's cells: reading and checking the file, running one cell into `DIR/NAME` as `bcr run`
would, and what DIR holds (items done, a cell's lock, the combined table). Both executors of
`bcr_core.runs.grid` (in this process, and on Ray in `bcr_core.runs.grid_ray`) read these.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bcr_core.analysis.summary import condition_table
from bcr_core.engine.architectures import CONFIG_PREFIX
from bcr_core.engine.loading import shared_backbone
from bcr_core.engine.models import DEFAULT_MODEL
from bcr_core.errors import UsageError
from bcr_core.paths import utf8_text
from bcr_core.runs.cell import Cell, make_cell
from bcr_core.runs.run_files import check_folder, read_items
from bcr_core.runs.runner import run_cell
from bcr_core.runs.settings import RUN
from bcr_core.settings import SettingError, check_setting, cli_label

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a cell name is a folder name


class GridError(UsageError):
    """A grid file that cannot run; the message names the file and the key."""


@dataclass(frozen=True)
class GridCell:
    """One cell of a grid: its folder name, the runner's cell, and how to run it."""

    name: str
    cell: Cell
    batch: int = 1
    load: str = DEFAULT_MODEL  # the model name to load: `cell.model` with a relative path made absolute

    @property
    def items(self) -> int:
        """Item records the finished cell holds (one per condition and item)."""
        return self.cell.n * len(self.cell.conditions)


# ---------------------------------------------------------------- reading and checking a grid file


def read_grid(path: Path, model: str = DEFAULT_MODEL) -> list[GridCell]:
    """The cells of a grid file, every setting checked; `model` is the model of cells whose file
    names none (`bcr grid --model`). Raises GridError naming the file and the key."""
    path = Path(path)
    try:
        data = tomllib.loads(utf8_text(path, "a grid file in TOML"))
    except OSError as err:
        raise GridError(f"{path}: cannot read the grid file: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        twice = re.match(r"Cannot declare \('cells', '(.+)'\) twice", str(err))
        if twice:
            raise GridError(f"{path}: cells.{twice.group(1)}: declared twice; cell names must be unique") from None
        raise GridError(f"{path}: not valid TOML: {err}") from None
    for key in data:
        if key not in ("defaults", "cells"):
            raise GridError(f"{path}: {key}: unknown key; a grid file holds a [defaults] table and [cells.NAME] tables")
    defaults = table(path, data.get("defaults", {}), "defaults")
    cells = table(path, data.get("cells"), "cells") if "cells" in data else {}
    if not cells:
        raise GridError(f"{path}: cells: no cells; add one [cells.NAME] table per cell")
    checked = check_settings(path, defaults, "defaults")
    grid, folders = [], {}
    for name, settings in cells.items():
        where = f"cells.{name}"
        if not NAME.fullmatch(name):
            raise GridError(
                f"{path}: {where}: a cell name is its folder's name: letters, digits, '_', '.', '-', "
                "starting with a letter or digit"
            )
        if name.lower() in folders:
            raise GridError(f"{path}: {where}: same folder as cells.{folders[name.lower()]} on a case-blind disk")
        folders[name.lower()] = name
        own = check_settings(path, table(path, settings, where), where)
        grid.append(grid_cell(path, name, checked, own, model))
    return grid


def table(path: Path, value, where: str) -> dict:
    if not isinstance(value, dict):
        raise GridError(f"{path}: {where}: expected a table, got {shown(value)}")
    return value


def shown(value) -> str:
    return json.dumps(value, default=str)


def check_settings(path: Path, settings: dict, where: str) -> dict:
    """Each setting by the one validator (`settings.check_setting`), conditions as a list."""
    out = {}
    for key, value in settings.items():
        if key not in RUN:
            raise GridError(f"{path}: {where}.{key}: unknown setting; the settings: {', '.join(RUN)}")
        try:
            out[key] = check_setting(key, value, RUN[key].kind)
        except SettingError as err:
            raise GridError(f"{path}: {where}.{key}: {err.detail}") from None
    return out


def grid_cell(path: Path, name: str, defaults: dict, own: dict, model: str) -> GridCell:
    """A cell's settings (its own over the defaults over `bcr run`'s), checked together."""
    where = f"cells.{name}"
    origin = lambda key: f"{where}.{key}" if key in own else f"defaults.{key}"  # noqa: E731
    settings = {key: s.default for key, s in RUN.items()} | {"model": model} | defaults | own
    for key, setting in RUN.items():
        if setting.required and key not in defaults and key not in own:
            raise GridError(f"{path}: {where}.{key}: missing; set it in [defaults] or in [{where}]")
    try:  # an error names the setting it is about (`SettingError.key`), shown where the file set it
        cell = make_cell(**{key: value for key, value in settings.items() if key != "batch"})  # batch: how, not what
    except SettingError as err:
        shown_as = "" if err.label == cli_label(err.key) else f"{err.label}: "  # e.g. `condition LABEL: `
        raise GridError(f"{path}: {origin(err.key)}: {shown_as}{err.detail}") from None
    return GridCell(name, cell, settings["batch"], absolute_model(settings["model"]))


def absolute_model(model: str) -> str:
    """A model named by a relative path, made absolute (a Ray worker's working folder is its own);
    names that are not existing paths (hub ids, `default`) are kept."""
    prefix = CONFIG_PREFIX if model.startswith(CONFIG_PREFIX) else ""
    spec = Path(os.path.expanduser(model[len(prefix) :].strip()))
    return prefix + str(spec.resolve()) if not spec.is_absolute() and spec.exists() else model


# ---------------------------------------------------------------- what DIR holds


def items_done(grid_cell: GridCell, out: Path) -> int:
    """Item records of the cell's conditions in DIR/NAME (read from disk, nothing kept)."""
    records = read_items(Path(out) / grid_cell.name / "items.jsonl", grid_cell.cell.conditions)
    return len({(r["condition"], r["item_id"]) for r in records})


def is_finished(grid_cell: GridCell, out: Path) -> bool:
    """Every condition has every item in DIR/NAME/items.jsonl."""
    return items_done(grid_cell, out) == grid_cell.items


def count_lines(path: Path) -> int:
    """A cheap running count of records for progress (a torn last line may be counted)."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


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


def write_summary(grid_cell: GridCell, folder: Path, items: pd.DataFrame) -> None:
    """summary.csv, as `bcr run` writes it."""
    (folder / "summary.csv").write_text(condition_table(items, grid_cell.cell.reference).to_csv(index=False))


# ---------------------------------------------------------------- running one cell


def run_grid_cell(grid_cell: GridCell, out: str, progress: bool = False, on_item=None) -> int:
    """Run (or resume) one cell into out/NAME, as `bcr run` would; returns its item records.
    This is also the Ray task: it writes everything itself and returns only a count."""
    folder = Path(out) / grid_cell.name
    items = run_cell(
        shared_backbone(grid_cell.load),
        grid_cell.cell,
        folder,
        progress=progress,
        batch=grid_cell.batch,
        label=grid_cell.name,
        on_item=on_item,
    )
    write_summary(grid_cell, folder, items)
    return len(items)


# ---------------------------------------------------------------- what is left to run


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
