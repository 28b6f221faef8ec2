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

from bcr_core import paper
from bcr_core.agents.graph import full_connected
from bcr_core.data.benchmarks import NAMES, item_draw
from bcr_core.data.roles import DEFAULT_PROMPT, PROMPTS
from bcr_core.engine.models import DEFAULT_MODEL, DTYPES, default_device, dtype_name, resolve_dtype
from bcr_core.engine.stopping import DEFAULT_RULE, RULES
from bcr_core.errors import UsageError
from bcr_core.setting_kinds import (
    Bool,
    Float,
    Int,
    Kind,
    ListOf,
    Optional,
    Setting,
    SettingError,
    Str,
    check_setting,
    cli_label,
    with_defaults,
)


@dataclass(frozen=True)
class ConditionName(Str):
    """A condition such as `kvcomm@0.5` or `bcr-chunk@0.2:chunk=16` (see `bcr_core.conditions`)."""

    def describe(self):
        return "str (a condition, e.g. 'kvcomm' or 'bcr-chunk@0.2')"

    def problem(self, value):
        from bcr_core.conditions import parse  # here: the settings are read (`bcr`'s flags) without the model code

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
        from bcr_core.conditions import split_conditions

        specs = [value] if isinstance(value, str) else list(value)
        return [piece for spec in specs for piece in split_conditions(spec)]


SEED = Int(0)  # a coin stream's seed
FRACTION = Float(0.0, 1.0)

# Every `bcr run` setting (the grid file's keys, and the notebooks' parameters of the same name),
# with `bcr run`'s defaults and the help of the flag `bcr` makes of each (`cli.add_settings`).
RUN: dict[str, Setting] = {
    "benchmark": Setting(Str(NAMES), required=True, help="the task whose items are served"),
    "agents": Setting(Int(2, 5), 3, help="agents before the FinalRefer node (2-5)"),
    "conditions": Setting(
        Conditions(),
        required=True,
        help="comma-separated, e.g. dense,kvcomm,bcr-chunk,coin-chunk@0.2:seed=1 (see bcr_core.conditions)",
    ),
    "n": Setting(Int(1), required=True, help="number of items (the first n, the same for every condition)"),
    "max_new_tokens": Setting(Int(1), 512, help="the cap on each agent call's answer, in tokens"),
    "seeds": Setting(  # [] in a grid cell: no seeds, whatever the defaults say
        Optional(ListOf(SEED, min_len=0)), help="comma-separated seeds: a coin without a seed runs once per seed"
    ),
    "pinned": Setting(Optional(Str()), help="give every agent this role instead of cycling roles"),
    "model": Setting(
        Str(),
        DEFAULT_MODEL,
        help="'default' (embedded SmolLM2-135M-Instruct), 'gemma-3-270m' (Gemma 3 270M base, fetched on first use; "
        "Gemma terms apply), a local HF directory, or a hub id",
    ),
    "reference": Setting(Optional(ConditionName()), help="condition the b/c splits are taken against (default kvcomm)"),
    "item_seed": Setting(Int(0), 0, help="seed of the synthetic task's items"),
    "batch": Setting(
        Int(1),
        1,
        help="requests served at once with batched decoding (same tokens; call times then include waiting)",
    ),
    "fidelity": Setting(
        Bool(), False, help="also serve every call densely: per-call first-token agreement and teacher-forced KL"
    ),
    "prompt": Setting(
        Str(PROMPTS),
        DEFAULT_PROMPT,
        help="the templates' form: 'standard', or 'one-shot' (the benchmark's worked example before the user turn)",
    ),
    "stop": Setting(
        Str(RULES),
        DEFAULT_RULE,
        help="decoding ends at the end token or the cap ('eos'), or also at the first newline after visible text "
        "('line'); the same for every condition",
    ),
    "dtype": Setting(  # the precision the model is served in (`engine.models.resolve_dtype`)
        Str(DTYPES),
        "auto",
        help="precision the model is served in; 'auto': float32 on a CPU, on a GPU the released code's rule "
        "(float16 where the model's name contains 'llama', else float32)",
    ),
}

# `bcr arena`'s settings: a run's (one BCR-chunk condition, fidelity on, at the arena's defaults) and
# the arena's own. `arena.run.make_arena_cell` reads them, notebook 11 passes them by name.
ARENA_RHOS = [0.05, 0.1, 0.2, 0.4]
ARENA: dict[str, Setting] = with_defaults(
    {key: RUN[key] for key in ("n", "benchmark", "agents", "max_new_tokens", "item_seed", "seeds", "model")},
    benchmark="synthetic",
    max_new_tokens=8,
) | {
    "rho": Setting(FRACTION, paper.RHO, help="the serving BCR-chunk's budget (the paired count)"),
    "chunk": Setting(Int(1), 16, help="B: the chunk layout's unit, serving and arena alike"),
    "rhos": Setting(ListOf(FRACTION), ARENA_RHOS, help="the sweep: round(rho x M) rows per call each"),
    "gamma": Setting(Optional(FRACTION), help="KVComm's gate (default: the paper's 0.3)"),
    "selectors": Setting(
        Optional(Str()),
        help="comma-separated selectors with options, e.g. draft,draft:rank=predicted,cacheblend:layer=2 "
        "(default: the whole field; see bcr_core.arena.registry)",
    ),
    "shard": Setting(
        Str(empty=True),
        "",
        help="K/M: this process is lane K of M (from 0); it serves every item and measures those whose index "
        "is K mod M, in its own --out; join the lanes with `bcr arena-merge`",
    ),
    "prompt": RUN["prompt"],
    "stop": RUN["stop"],
    "dtype": RUN["dtype"],
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
