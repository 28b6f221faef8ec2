"""Checking a notebook's parameters before any work starts.

Every notebook opens with a papermill `parameters` cell (plain assignments a user or papermill
overrides) and then a cell that hands them to `check`:

    P = params.check(model=model, benchmark=benchmark, n=n, smoke=smoke, ...)

`check` knows every parameter name the lab's notebooks use (`SCHEMA`) and raises
`ParameterError` on the first value of the wrong type or out of range, naming the parameter,
what it expects and what it was given, so a bad `-p n three` stops at that cell with one line
instead of a traceback deep in `bcr_core`. `Params.smoke` swaps in the CI-sized settings.
"""

from __future__ import annotations

import html
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

from bcr_core.data.benchmarks import NAMES
from bcr_core.errors import UsageError


class ParameterError(UsageError, TypeError):
    """A notebook parameter of the wrong type or out of range; the message says which and why."""


# -- value kinds --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    def describe(self) -> str:
        raise NotImplementedError

    def accepts(self, value) -> bool:
        raise NotImplementedError

    def problem(self, value) -> str | None:
        """Why an accepted value is still unusable (out of range, unknown choice), or None."""
        return None

    def normalise(self, value):
        return value


@dataclass(frozen=True)
class Bool(Kind):
    def describe(self):
        return "bool (True or False)"

    def accepts(self, value):
        return isinstance(value, bool)


@dataclass(frozen=True)
class Int(Kind):
    low: int | None = None
    high: int | None = None

    def describe(self):
        return "int" + _range_text(self.low, self.high)

    def accepts(self, value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    def problem(self, value):
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            return f"{value} is outside{_range_text(self.low, self.high)}"
        return None

    def normalise(self, value):
        return int(value)


@dataclass(frozen=True)
class Float(Kind):
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # True: the low end itself is excluded

    def describe(self):
        return "float (a number)" + _range_text(self.low, self.high, self.open_low)

    def accepts(self, value):
        return isinstance(value, numbers.Real) and not isinstance(value, bool)

    def problem(self, value):
        if not math.isfinite(value):
            return f"{value} is not a finite number"
        below = self.low is not None and (value <= self.low if self.open_low else value < self.low)
        if below or (self.high is not None and value > self.high):
            return f"{value} is outside{_range_text(self.low, self.high, self.open_low)}"
        return None

    def normalise(self, value):
        return float(value)


@dataclass(frozen=True)
class Str(Kind):
    choices: tuple[str, ...] = ()

    def describe(self):
        return "str" + (f" (one of {', '.join(map(repr, self.choices))})" if self.choices else "")

    def accepts(self, value):
        return isinstance(value, str)

    def problem(self, value):
        if self.choices and value not in self.choices:
            return f"{value!r} is not one of {', '.join(map(repr, self.choices))}"
        if not self.choices and not value.strip():
            return "it is empty"
        return None


@dataclass(frozen=True)
class ConditionName(Str):
    """A condition such as `kvcomm@0.5` or `bcr-chunk@0.2:chunk=16` (see `bcr_core.experiments.conditions`)."""

    def describe(self):
        return "str (a condition, e.g. 'kvcomm' or 'bcr-chunk@0.2')"

    def problem(self, value):
        from bcr_core.experiments.conditions import parse

        try:
            parse(value)
        except ValueError as err:
            return str(err)
        return None


@dataclass(frozen=True)
class ListOf(Kind):
    item: Kind
    min_len: int = 1

    def describe(self):
        return f"list of {self.item.describe()}" + (f", at least {self.min_len}" if self.min_len > 1 else "")

    def accepts(self, value):
        return isinstance(value, (list, tuple)) and all(self.item.accepts(v) for v in value)

    def problem(self, value):
        if len(value) < self.min_len:
            return f"it has {len(value)} entries, fewer than {self.min_len}"
        for i, v in enumerate(value):
            why = self.item.problem(v)
            if why:
                return f"entry {i}: {why}"
        return None

    def normalise(self, value):
        return [self.item.normalise(v) for v in value]


@dataclass(frozen=True)
class Optional(Kind):
    inner: Kind

    def describe(self):
        return f"{self.inner.describe()} or None"

    def accepts(self, value):
        return value is None or self.inner.accepts(value)

    def problem(self, value):
        return None if value is None else self.inner.problem(value)

    def normalise(self, value):
        return None if value is None else self.inner.normalise(value)


def _range_text(low, high, open_low: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if open_low else '['}{low:g}, {high:g}]"
    if low is not None:
        return f" {'>' if open_low else '>='} {low:g}"
    if high is not None:
        return f" <= {high:g}"
    return ""


LAYOUT_NAMES = ("chunk", "grow", "single")
FRACTION = Float(0.0, 1.0)

# Every parameter any notebook declares, with the kind of value it takes.
SCHEMA: dict[str, Kind] = {
    "model": Str(),  # 'default' (the embedded SmolLM2-135M-Instruct), a local HF folder, or a hub id
    "benchmark": Str(NAMES),
    "agents": Int(2, 5),
    "n": Int(1),
    "max_new_tokens": Int(1),
    "item_seed": Int(0),  # the synthetic task's items
    "pinned": Optional(Str()),  # give every agent this role
    "conditions": ListOf(ConditionName()),
    "condition": ConditionName(),
    "reuse": ConditionName(),  # a reuse condition, e.g. kvcomm or kvcomm@1
    "gamma": FRACTION,
    "gammas": ListOf(FRACTION),
    "theta": FRACTION,
    "rho": FRACTION,
    "rhos": ListOf(FRACTION),
    "seeds": ListOf(Int(0)),
    "chunk": Int(1),
    "block": Int(1),
    "item": Optional(Int(0)),
    "call": Optional(Str()),
    "layer": Optional(Int(0)),
    "head": Optional(Int(0)),
    "layout": Str(LAYOUT_NAMES),
    "segment_tokens": Int(8),
    "budget": Float(0.0, 1.0, open_low=True),
    "units": ListOf(Int(1)),
    "span_caps": ListOf(Int(1)),
    "prompts": Int(3),
    "lengths": ListOf(Int(2)),
    "samples": Int(1),
    "results_dir": Str(),
    "results": Str(),  # a folder of finished runs to read (the committed results, or a `bcr run` output)
    "fresh": Bool(),  # run everything anew on `model` instead of reading `results`
    "measure": Str(("agrees_dense", "correct")),  # the per-item outcome the claims are read on
    "smoke": Bool(),
}

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
        raise ParameterError(f"unknown parameter {name!r}: bcr_core.lab.params.SCHEMA declares no type for it")
    if not kind.accepts(value):
        raise ParameterError(f"parameter {name!r} expects {kind.describe()}, got {type(value).__name__} {value!r}")
    why = kind.problem(value)
    if why:
        raise ParameterError(f"parameter {name!r} expects {kind.describe()}, got {value!r}: {why}")
    return kind.normalise(value)


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

    def replace(self, **changes) -> Params:
        """A copy with some values changed (checked like the originals)."""
        unknown = [k for k in changes if k not in self._values]
        if unknown:
            raise ParameterError(f"cannot replace {unknown}: this notebook's parameters are {', '.join(self._values)}")
        values = self._values | {k: check_value(k, v) for k, v in changes.items()}
        return Params(values, tuple(k for k in values if values[k] != self._values[k]) or self._changed)

    def at_least(self, name: str, minimum: int, why: str) -> Params:
        """Refuse, before any work, a value too small for the notebook to show anything."""
        if self._values[name] < minimum:
            raise ParameterError(
                f"parameter {name!r} is {self._values[name]}, but {why}: raise {name} to at least {minimum}"
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


def check(**values) -> Params:
    """Check every given parameter against SCHEMA; the first bad one raises ParameterError."""
    return Params({name: check_value(name, value) for name, value in values.items()})
