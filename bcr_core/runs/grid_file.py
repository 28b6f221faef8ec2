"""A grid file's cells: reading a TOML grid file and checking every setting of every cell (by the
run settings' one validator, `runs.run_settings`) before any work, each error naming the file and
the key.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bcr_core.engine.architectures import CONFIG_PREFIX
from bcr_core.engine.models import DEFAULT_MODEL
from bcr_core.errors import UsageError
from bcr_core.paths import utf8_text
from bcr_core.runs.cell import Cell, RunSettings
from bcr_core.schema import RUN
from bcr_core.setting_kinds import SettingError, check_setting, cli_label

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
    copies: str | None = None  # a run folder whose conditions this cell copies (`runs.copies`), made absolute

    @property
    def items(self) -> int:
        """Item records the finished cell holds (one per condition and item)."""
        return self.cell.n * len(self.cell.conditions)


def read_grid(path: Path, model: str = DEFAULT_MODEL, dtype: str = "auto") -> list[GridCell]:
    """The cells of a grid file, every setting checked; `model` and `dtype` are those of cells whose file
    names none (`bcr grid --model --dtype`). Raises GridError naming the file and the key."""
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
        grid.append(grid_cell(path, name, checked, own, {"model": model, "dtype": dtype}))
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


def grid_cell(path: Path, name: str, defaults: dict, own: dict, command: dict) -> GridCell:
    """A cell's settings (its own over the defaults over the command line's `command` over `bcr run`'s),
    checked together."""
    where = f"cells.{name}"

    def origin(key: str) -> str:
        return f"{where}.{key}" if key in own else f"defaults.{key}"

    settings = {key: s.default for key, s in RUN.items()} | command | defaults | own
    for key, setting in RUN.items():
        if setting.required and key not in defaults and key not in own:
            raise GridError(f"{path}: {where}.{key}: missing; set it in [defaults] or in [{where}]")
    try:  # an error names the setting it is about (`SettingError.key`), shown where the file set it
        run = RunSettings(**settings)
        cell = run.cell()
    except SettingError as err:
        shown_as = "" if err.label == cli_label(err.key) else f"{err.label}: "  # e.g. `condition LABEL: `
        raise GridError(f"{path}: {origin(err.key)}: {shown_as}{err.detail}") from None
    copies = None if run.copies is None else str(Path(os.path.expanduser(run.copies)).absolute())
    return GridCell(name, cell, run.batch, absolute_model(run.model), copies)


def absolute_model(model: str) -> str:
    """A model named by a relative path, made absolute (a Ray worker's working folder is its own);
    names that are not existing paths (hub ids, `default`) are kept."""
    prefix = CONFIG_PREFIX if model.startswith(CONFIG_PREFIX) else ""
    spec = Path(os.path.expanduser(model[len(prefix) :].strip()))
    return prefix + str(spec.resolve()) if not spec.is_absolute() and spec.exists() else model
