"""What the runner makes of `bcr run`'s settings (`bcr_core.schema.RUN`): `check_run`, the checks of a
whole `bcr run` command (those that read two keys too), `settings_record`, which makes the records
that hold some of these settings (`runs.cell.RunSettings` and `Cell`, `lab.Comparison`) from `RUN`,
so a setting is declared once, and `served_dtype`, the dtype a run folder records.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from typing import Any

from bcr_core.agents.graph import full_connected
from bcr_core.data.benchmarks import item_draw
from bcr_core.engine.models import default_device, dtype_name, resolve_dtype
from bcr_core.schema import RUN
from bcr_core.setting_kinds import SettingError, check_given, cli_label


def served_dtype(dtype: str, model: str) -> str:
    """The dtype a run's model is served in on this machine: `auto` resolved (`engine.models.resolve_dtype`),
    the name a run folder records, so a folder says what ran and a CPU's fp32 run and a GPU's fp16 one differ."""
    return dtype_name(resolve_dtype(dtype, model, default_device()))


def check_run(settings: dict, label=cli_label) -> dict:
    """`bcr run`'s settings, each by the one validator (`label(key)` names it in the error), then
    the checks that read two keys; each error carries the key it is about."""
    checked = check_given(RUN, settings, label)
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
        namespace["extra"] = property(
            lambda record: item_draw(record.benchmark, record.item_seed, getattr(record, "first_item", 0))
        )
    return make_dataclass(name, fields, frozen=True, kw_only=True, namespace=namespace)
