"""The one schema: every setting of `bcr run` (`RUN`), `bcr arena` (`ARENA`), the claims' grid
(`CLAIMS`) and what a saved inspection is found by (`INSPECTION`), each with its kind
(`bcr_core.setting_kinds`), default and help. `bcr`'s flags are generated from it
(`cli.add_settings`), a grid file's keys and the notebooks' parameters are checked by it
(`runs.grid_file`, `lab.params`), and the records that hold settings are made from it
(`runs.run_settings.settings_record`, `arena.run.make_arena_cell`, `analysis.reports.claims_grid.ClaimsGrid`).
A condition is checked by parsing it (`bcr_core.conditions`), imported where it is checked, so the
schema loads without the model code.
"""

from __future__ import annotations

from dataclasses import dataclass

from bcr_core import paper
from bcr_core.data.benchmarks import NAMES
from bcr_core.data.roles import DEFAULT_PROMPT, PROMPTS
from bcr_core.engine.models import DEFAULT_MODEL, DTYPES
from bcr_core.engine.stopping import DEFAULT_RULE, RULES
from bcr_core.errors import UsageError
from bcr_core.setting_kinds import Bool, Float, Int, Kind, ListOf, Optional, Setting, Str, with_defaults


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
        "Gemma terms apply), 'qwen2.5-coder-0.5b' (Qwen2.5-Coder-0.5B-Instruct, fetched on first use), a local HF "
        "directory, or a hub id",
    ),
    "reference": Setting(Optional(ConditionName()), help="condition the b/c splits are taken against (default kvcomm)"),
    "item_seed": Setting(Int(0), 0, help="seed of the synthetic task's items"),
    "first_item": Setting(
        Int(0),
        0,
        help="index of the first item served: items first_item .. first_item+n-1 of the benchmark's order "
        "(a calibration reads items its cell never does)",
    ),
    "confirms": Setting(
        Optional(ListOf(Str())),
        help="a confirmation's planned claims (`bcr plan` writes them): its folder is read as its own family on "
        "exactly its n items, on items no committed folder of the model read",
    ),
    "batch": Setting(
        Int(1),
        1,
        help="requests served at once with batched decoding (on a CPU the same tokens and logits bit for bit, "
        "whatever the batch holds; call times then include waiting)",
    ),
    "copies": Setting(
        Optional(Str()),
        help="a raw run folder of the same settings: the conditions it holds in full are copied from it, not served "
        "again (the batch-invariant instrument makes them what serving would give; each one's first item is served "
        "here and must equal its record first)",
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
        "('line') or where the first fenced code block closes ('code'); the same for every condition",
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

# The claims' grid (`analysis.reports.claims_grid.ClaimsGrid`, notebook 10): a run's item settings at the
# headline grid's values, and the claims' own.
CLAIMS: dict[str, Setting] = with_defaults(
    {key: RUN[key] for key in ("benchmark", "agents", "n", "max_new_tokens", "item_seed")},
    benchmark="synthetic",
    n=200,
    max_new_tokens=8,
) | {
    "chunk": ARENA["chunk"],
    "seeds": Setting(ListOf(SEED), [0, 1, 2], help="coin seeds: one control, their outcomes averaged per item"),
    "gammas": Setting(
        ListOf(FRACTION),
        [0.05, 0.1, 0.2, 0.5, 1.0],
        help="KVComm gate settings for Equation 3's line (beside the default 0.3): between OpenGate and "
        "KVComm's reuse, and beyond",
    ),
    "theta": Setting(FRACTION, paper.OPENGATE_THETA, help="OpenGate's threshold"),
    "gate_n": Setting(Int(1), 100, help="items of the gate sweep (its own Dense and KVComm arms included)"),
    "rhos": Setting(
        ListOf(FRACTION, min_len=0),
        [0.4],
        help="BCR-chunk's other budgets: repair cannot touch the tax whatever its budget",
    ),
    "segment_tokens": Setting(
        Int(8), 1280, help="the unit curve's segment: at budget 0.2, 256 rows are whole units of 1 to 256"
    ),
    "unit_prompts": Setting(Int(3), 12, help="documents the unit curve predicts, each from the others' anchors"),
}

# What decides a saved inspection's content (`lab.saved_inspection` finds one by these; the
# explorer's starting item, call, layer and head do not): a run's item settings and the repair the
# explorer shows, its layout at a budget.
LAYOUTS = ("chunk", "grow", "single")  # `repair.layouts.LAYOUTS`' names, without loading the model code
INSPECTION: dict[str, Setting] = {
    key: RUN[key] for key in ("model", "benchmark", "item_seed", "agents", "n", "max_new_tokens")
} | {
    "gamma": ARENA["gamma"],
    "layout": Setting(Str(LAYOUTS), "chunk", help="the layout the repair spends its budget in"),
    "rho": ARENA["rho"],
    "chunk": ARENA["chunk"],
}
