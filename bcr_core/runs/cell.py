"""The records made from `bcr run`'s settings (`bcr_core.schema.RUN`): `RunSettings`, one command's
settings, and `Cell`, what one run folder holds (benchmark x agent count, its items and new tokens,
under several conditions), which `cell.json` records. Both check every setting and condition when
made, before any folder is touched.
"""

from __future__ import annotations

from dataclasses import asdict

from bcr_core.conditions import DEFINITIONS, REPAIRS, Condition, expand_seeds, parse
from bcr_core.runs.run_settings import check_run, served_dtype, settings_record
from bcr_core.schema import RUN
from bcr_core.setting_kinds import SettingError
from bcr_core.spec_grammar import is_coin, split

# how a cell runs, or what it is made from, rather than what it is: not part of a cell
NOT_CELL = ("batch", "seeds", "copies")
# `cell.json`'s name for a setting where it differs (the committed records keep theirs)
RECORD_NAMES = {"agents": "n_agents"}
RECORDED_BEFORE_DTYPE = "float32"  # every run recorded before cell.json named its dtype ran in fp32 on a CPU


class RunSettings(settings_record("RunSettingsFields")):
    """Every setting of one `bcr run` (a grid file's cell, a notebook's comparison), each checked
    by the one validator when made: an error names its key. `cell()` is the run it describes."""

    def check(self):
        for key, value in check_run(asdict(self)).items():
            object.__setattr__(self, key, value)
        if self.seeds and not any(is_coin(split(c)[0]) for c in self.conditions):
            raise SettingError(
                "seeds",
                "runs coin conditions once per seed, and no coin condition (coin-chunk, coin-single) is listed",
            )

    def cell(self) -> Cell:
        """The cell these settings run: coin conditions without a seed once per seed in `seeds`."""
        kept = {key: value for key, value in asdict(self).items() if key not in NOT_CELL}
        return Cell(**kept | {"conditions": tuple(expand_seeds(self.conditions, self.seeds))})


class Cell(settings_record("CellFields", leave_out=NOT_CELL)):
    """One run folder's settings: every `RunSettings` key but `NOT_CELL`, conditions by their labels
    (`reference` is the condition the b/c splits are taken against; default kvcomm or the first)."""

    def check(self):
        for key, value in check_run({key: getattr(self, key) for key in RUN if key not in NOT_CELL}).items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "dtype", served_dtype(self.dtype, self.model))
        parsed = [parse(c) for c in self.conditions]
        seen: dict[tuple, str] = {}
        for c in parsed:
            if c.settings in seen:
                raise SettingError(
                    "conditions",
                    f"{seen[c.settings]} and {c.label} repeat one run (the same settings); list it once",
                )
            seen[c.settings] = c.label
        for c in parsed:
            check_value(c)
        object.__setattr__(self, "conditions", tuple(c.label for c in parsed))
        if self.reference is not None and parse(self.reference).settings not in seen:
            raise SettingError(
                "reference", f"{self.reference} is not among the conditions: {', '.join(self.conditions)}"
            )

    def record(self) -> dict:
        """`cell.json`'s settings: every field under its committed name, the item draw as `extra`."""
        found = asdict(self)
        found["item_seed"] = self.extra
        return {("extra" if key == "item_seed" else RECORD_NAMES.get(key, key)): v for key, v in found.items()}

    @classmethod
    def from_record(cls, found: dict) -> Cell:
        """The cell a `cell.json` records (`record`'s inverse)."""
        names = {recorded: key for key, recorded in RECORD_NAMES.items()}
        settings = {names.get(key, key): value for key, value in found.items() if key != "extra"}
        settings.setdefault("dtype", RECORDED_BEFORE_DTYPE)
        extra = found.get("extra") or {}
        return cls(**settings | {"conditions": tuple(found["conditions"]), "item_seed": extra.get("seed", 0)})


def check_value(c: Condition) -> None:
    """Refuse a condition value no server can take, naming it (before any folder is touched); the
    error is about the `conditions` setting and reads `condition LABEL: why`."""

    def refuse(why: str) -> SettingError:
        return SettingError("conditions", why, label=f"condition {c.label}")

    if c.name == "cacheblend-reuse" and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"r is the paired BCR-chunk reuse rate, in [0, 1]; got {c.value:g}")
    if c.name in REPAIRS and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"rho is the share of rows repaired, in [0, 1]; got {c.value:g}")
    if "seed" in DEFINITIONS[c.name].options and c.option("seed") < 0:
        raise refuse(f"option seed is a coin stream's seed, at least 0; got {c.option('seed')}")
