"""Checking a notebook's parameters before any work starts.

Every notebook opens with a papermill `parameters` cell (plain assignments a user or papermill
overrides) and then a cell that hands them all to `check`, through `from_cell`:

    P = params.from_cell(globals()).smoke(...)

`check` knows every parameter name the lab's notebooks use (`SCHEMA`) and raises
`ParameterError` on the first value of the wrong type or out of range, naming the parameter,
what it expects and what it was given, so a bad `-p n three` stops at that cell with one line
instead of a traceback deep in `bcr_core`. `Params.smoke` swaps in the CI-sized settings.
"""

from __future__ import annotations

import html
import os
from dataclasses import fields, is_dataclass
from typing import Any

from bcr_core.schema import ARENA, CLAIMS, INSPECTION, RUN, ConditionName
from bcr_core.setting_kinds import (  # noqa: F401  (the kinds, re-exported: notebooks declare parameters with them)
    Bool,
    Float,
    Int,
    Kind,
    ListOf,
    Optional,
    SettingError,
    Str,
    check_setting,
)


class ParameterError(SettingError, TypeError):
    """A notebook parameter of the wrong type or out of range; the message says which and why."""


# The settings a notebook shares with `bcr run`, `bcr arena` and the claims' grid, checked as they
# check them (`bcr_core.schema.RUN`, `ARENA`, `CLAIMS`) and passed on by name (`Params.settings_of`).
SHARED_WITH_RUN = ("model", "dtype", "benchmark", "agents", "n", "max_new_tokens", "item_seed", "pinned")
SHARED_WITH_ARENA = ("rho", "rhos", "chunk", "gamma", "selectors")
SHARED_WITH_CLAIMS = ("gammas", "theta", "seeds", "segment_tokens")

# Every parameter any notebook declares, with the kind of value it takes.
SCHEMA: dict[str, Kind] = (
    {key: RUN[key].kind for key in SHARED_WITH_RUN}
    | {key: ARENA[key].kind for key in SHARED_WITH_ARENA}
    | {key: CLAIMS[key].kind for key in SHARED_WITH_CLAIMS}
    | {
        "conditions": ListOf(ConditionName()),
        "condition": ConditionName(),
        "reuse": ConditionName(),  # a reuse condition, e.g. kvcomm or kvcomm@1
        "block": Int(1),
        "item": Optional(Int(0)),
        "call": Optional(Str()),
        "layer": Optional(Int(0)),
        "head": Optional(Int(0)),
        "layout": INSPECTION["layout"].kind,
        "budget": Float(0.0, 1.0, open_low=True),
        "units": ListOf(Int(1)),
        "span_caps": ListOf(Int(1)),
        "prompts": Int(3),
        "lengths": ListOf(Int(2)),
        "samples": Int(1),
        "results_dir": Str(),
        "results": Str(),  # a folder of finished runs to read (the committed results, or a `bcr run` output)
        "transfer": ListOf(Str()),  # claims (or arena) folders of other models, read beside `results`
        "fresh": Bool(),  # run everything anew on `model` instead of reading `results`
        "measure": Str(("agrees_dense", "correct")),  # the per-item outcome the claims are read on
        "smoke": Bool(),
    }
)

EXPLICIT = "BCR_EXPLICIT_PARAMETERS"  # the parameters a user set by name, which smoke settings leave alone
# The CI-sized settings `Params.smoke` applies (to the names a notebook has). The synthetic
# task's seed 34 has short items first, so KVComm's anchor pool can serve calls from item 3 on.
SMOKE: dict[str, Any] = {
    "benchmark": "synthetic",
    "item_seed": 34,
    "agents": 2,
    "n": 4,
    "max_new_tokens": 4,
    "chunk": 16,
}


def check_value(name: str, value, kind: Kind | None = None):
    """The value, normalised (ints for ints, floats for floats, lists for sequences), or a
    ParameterError naming the parameter, the expected type and what was given."""
    kind = kind or SCHEMA.get(name)
    if kind is None:
        raise ParameterError(name, "bcr_core.lab.params.SCHEMA declares no type for it", f"unknown parameter {name!r}")
    try:
        return check_setting(name, value, kind)
    except SettingError as err:
        raise ParameterError(name, err.detail, f"parameter {name!r}") from None


class Params:
    """Checked parameters: read as attributes (`P.n`) or keys (`P["n"]`); displays as a table."""

    def __init__(self, values: dict[str, Any], changed: tuple[str, ...] = ()):
        self._values = dict(values)
        self._changed = changed

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"no parameter {name!r}; this notebook has {', '.join(self._values)}") from None

    def __getitem__(self, name):
        return self._values[name]

    def __contains__(self, name):
        return name in self._values

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def settings_of(self, schema) -> dict[str, Any]:
        """The parameters that are settings of `schema` (a settings dict such as `ARENA`, or a record's
        dataclass such as `ClaimsGrid`), by name: a record's settings passed whole, not one positional
        argument each."""
        names = {f.name for f in fields(schema)} if is_dataclass(schema) else set(schema)
        return {k: v for k, v in self._values.items() if k in names}

    def replace(self, **changes) -> Params:
        """A copy with some values changed (checked like the originals)."""
        unknown = [k for k in changes if k not in self._values]
        if unknown:
            raise ParameterError(
                unknown[0], f"this notebook's parameters are {', '.join(self._values)}", f"cannot replace {unknown}"
            )
        values = self._values | {k: check_value(k, v) for k, v in changes.items()}
        return Params(values, tuple(k for k in values if values[k] != self._values[k]) or self._changed)

    def at_least(self, name: str, minimum: int, why: str) -> Params:
        """Refuse, before any work, a value too small for the notebook to show anything."""
        if self._values[name] < minimum:
            raise ParameterError(
                name, f"got {self._values[name]}, but {why}: raise {name} to at least {minimum}", f"parameter {name!r}"
            )
        return self

    def smoke(self, **overrides) -> Params:
        """With `smoke` set: the CI-sized settings (SMOKE, for the names this notebook has, then
        `overrides`); otherwise unchanged. A value the user set explicitly (`bcr notebooks -p` or
        `bcr explore -p`, passed on in EXPLICIT) is honoured, not overridden."""
        if not self._values.get("smoke"):
            return self
        explicit = set(filter(None, os.environ.get(EXPLICIT, "").split(",")))
        changes = {
            k: v
            for k, v in ({k: v for k, v in SMOKE.items() if k in self._values} | overrides).items()
            if k not in explicit
        }
        return self.replace(**changes)

    def __repr__(self):
        return "Params(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def _repr_html_(self):
        rows = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td><td><code>{html.escape(repr(v))}</code></td>"
            f"<td>{'smoke setting' if k in self._changed else ''}</td></tr>"
            for k, v in self._values.items()
        )
        return f"<table><tr><th>parameter</th><th>value</th><th></th></tr>{rows}</table>"


CELL_NAMES = "__bcr_parameter_names__"  # where `from_cell` keeps the names it found, in the namespace


def from_cell(namespace: dict) -> Params:
    """`check` of the parameters a notebook's parameters cell bound in `namespace` (the notebook's
    `globals()`): every name SCHEMA declares that is bound there, in the cell's order. The names are
    fixed on the first call in a kernel, so when the cell is run again after later cells, a later
    variable that happens to share a parameter's name is not taken for one."""
    names = namespace.setdefault(CELL_NAMES, [name for name in namespace if name in SCHEMA])
    return check(**{name: namespace[name] for name in names})


def check(**values) -> Params:
    """Check every given parameter against SCHEMA; the first bad one raises ParameterError."""
    return Params({name: check_value(name, value) for name, value in values.items()})
