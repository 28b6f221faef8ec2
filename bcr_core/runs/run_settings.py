"""The settings of `bcr run` (`RUN`), which `bcr grid` and the notebooks' parameter cells read too,
in the kinds of `bcr_core.setting_kinds`: a condition (`ConditionName`), a list of them (`Conditions`),
`check_run`, the checks of a whole `bcr run` command, and `settings_record`, which makes the records
that hold some of these settings (`runs.cell.RunSettings` and `Cell`, `lab.Comparison`) from `RUN`,
so a setting is declared once. They live here, beside the runner, because
checking a condition means parsing it (`bcr_core.conditions`), and the conditions' own options
are checked by the kinds of `bcr_core.setting_kinds`: one direction, no circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any

from bcr_core.agents.graph import full_connected
from bcr_core.conditions import parse, split_conditions
from bcr_core.data.benchmarks import NAMES, item_draw
from bcr_core.data.roles import DEFAULT_PROMPT, PROMPTS
from bcr_core.engine.models import DEFAULT_MODEL, DTYPES, default_device, dtype_name, resolve_dtype
from bcr_core.engine.stopping import DEFAULT_RULE, RULES
from bcr_core.errors import UsageError
from bcr_core.setting_kinds import (
    Bool,
    Int,
    Kind,
    ListOf,
    Optional,
    Setting,
    SettingError,
    Str,
    check_setting,
    cli_label,
)


@dataclass(frozen=True)
class ConditionName(Str):
    """A condition such as `kvcomm@0.5` or `bcr-chunk@0.2:chunk=16` (see `bcr_core.conditions`)."""

    def describe(self):
        return "str (a condition, e.g. 'kvcomm' or 'bcr-chunk@0.2')"

    def problem(self, value):
        try:
            parse(value)
        except UsageError as err:
            return str(err)
        return None


@dataclass(frozen=True)
class Conditions(ListOf):
    """A list of conditions, or one comma-separated string of them (as `bcr run --conditions`)."""

    item: Kind = ConditionName()

    def describe(self):
        return "a list of conditions (or one comma-separated string), e.g. ['dense', 'kvcomm']"

    def accepts(self, value):
        return isinstance(value, str) or super().accepts(value)

    def problem(self, value):
        pieces = self.normalise(value)
        return "it names no condition" if not pieces else super().problem(pieces)

    def normalise(self, value):
        specs = [value] if isinstance(value, str) else list(value)
        return [piece for spec in specs for piece in split_conditions(spec)]


SEED = Int(0)  # a coin stream's seed

# Every `bcr run` setting (the grid file's keys, and the notebooks' parameters of the same name),
# with `bcr run`'s defaults.
RUN: dict[str, Setting] = {
    "benchmark": Setting(Str(NAMES), required=True),
    "agents": Setting(Int(2, 5), 3),
    "conditions": Setting(Conditions(), required=True),
    "n": Setting(Int(1), required=True),
    "max_new_tokens": Setting(Int(1), 512),
    "seeds": Setting(Optional(ListOf(SEED, min_len=0))),  # [] in a grid cell: no seeds, whatever the defaults say
    "pinned": Setting(Optional(Str())),
    "model": Setting(Str(), DEFAULT_MODEL),
    "reference": Setting(Optional(ConditionName())),
    "item_seed": Setting(Int(0), 0),
    "batch": Setting(Int(1), 1),
    "fidelity": Setting(Bool(), False),
    "prompt": Setting(Str(PROMPTS), DEFAULT_PROMPT),
    "stop": Setting(Str(RULES), DEFAULT_RULE),
    "dtype": Setting(Str(DTYPES), "auto"),  # the precision the model is served in (`engine.models.resolve_dtype`)
}


def served_dtype(dtype: str, model: str) -> str:
    """The dtype a run's model is served in on this machine: `auto` resolved (`engine.models.resolve_dtype`),
    the name a run folder records, so a folder says what ran and a CPU's fp32 run and a GPU's fp16 one differ."""
    return dtype_name(resolve_dtype(dtype, model, default_device()))


def check_run(settings: dict, label=cli_label) -> dict:
    """`bcr run`'s settings, each by the one validator (`label(key)` names it in the error), then
    the checks that read two keys; each error carries the key it is about."""
    unknown = [key for key in settings if key not in RUN]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting; the settings: {', '.join(RUN)}", label(unknown[0]))
    checked = {key: check_setting(key, value, RUN[key].kind, label(key)) for key, value in settings.items()}
    full = {key: s.default for key, s in RUN.items()} | checked
    if "benchmark" in full and full["benchmark"] is not None:
        try:
            full_connected(full["benchmark"], full["agents"], full["pinned"], full["prompt"])
        except SettingError as err:
            raise err.relabel(label(err.key)) from None
    return checked


def settings_record(name: str, leave_out: tuple[str, ...] = ()) -> type:
    """A frozen, keyword-only dataclass with one field per `RUN` setting but `leave_out`, in `RUN`'s
    order, at `RUN`'s default; a required setting left out of a record raises a SettingError naming
    it. A record with `benchmark` and `item_seed` has `extra`, the load options that draw its items
    (`data.benchmarks.item_draw`: the synthetic task's seed, nothing for fixed data). Records
    subclass it for their methods; a subclass's `check()` runs when a record is made (the generated
    `__init__` calls the `__post_init__` its class had when generated, which is this one)."""
    unknown = [key for key in leave_out if key not in RUN]
    if unknown:
        raise KeyError(f"not run settings: {unknown}")
    kept = {key: setting for key, setting in RUN.items() if key not in leave_out}

    def post_init(record):
        for key, setting in kept.items():
            if setting.required and getattr(record, key) is None:
                raise SettingError(key, "missing; every run names it")
        record.check()

    fields = [(key, Any, field(default=setting.default)) for key, setting in kept.items()]
    namespace = {"__post_init__": post_init, "check": lambda record: None}
    if "benchmark" in kept and "item_seed" in kept:
        namespace["extra"] = property(lambda record: item_draw(record.benchmark, record.item_seed))
    return make_dataclass(name, fields, frozen=True, kw_only=True, namespace=namespace)
