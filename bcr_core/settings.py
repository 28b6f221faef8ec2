"""The one settings model: the kinds of value a setting takes, the one validator every surface
uses (`check_setting`), and the settings of `bcr run` (`RUN`), which `bcr grid` and the notebooks'
parameter cells read too.

A bad value is a `SettingError` that names the key, what was given and what the key expects, on
one line: `--agents: expected int in [2, 5], got 9 (9 is outside in [2, 5])`. The key travels with
the error, so a caller that shows it under another name (`bcr grid` as `FILE: cells.NAME.agents`, a
notebook as `parameter 'agents'`) relabels it by the key, never by reading the message.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from bcr_core.data.benchmarks import NAMES
from bcr_core.engine.models import DEFAULT_MODEL
from bcr_core.errors import UsageError


class SettingError(UsageError):
    """A setting's value that cannot be used: `key` names it, `detail` says what was wrong."""

    def __init__(self, key: str, detail: str, label: str | None = None):
        self.key, self.detail, self.label = key, detail, label or cli_label(key)
        super().__init__(f"{self.label}: {detail}")

    def relabel(self, label: str) -> SettingError:
        """The same error shown under `label` (a grid file's key, a notebook's parameter)."""
        return type(self)(self.key, self.detail, label)


def cli_label(key: str) -> str:
    return "--" + key.replace("_", "-")


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

    def from_text(self, raw: str):
        """A value of this kind from its text (a condition's `key=value`); text it cannot read is
        returned as it is, for the validator to refuse."""
        return raw


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

    def from_text(self, raw):
        try:
            return int(raw)
        except ValueError:
            return raw


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

    def from_text(self, raw):
        try:
            return float(raw)
        except ValueError:
            return raw


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
        from bcr_core.experiments.conditions import split_conditions

        specs = [value] if isinstance(value, str) else list(value)
        return [piece for spec in specs for piece in split_conditions(spec)]


def check_setting(key: str, value, kind: Kind, label: str | None = None):
    """The one validator: `value`, normalised (ints for ints, floats for floats, lists for
    sequences), or a SettingError naming the key, what it expects and what was given."""
    if not kind.accepts(value):
        raise SettingError(key, f"expected {kind.describe()}, got {type(value).__name__} {value!r}", label)
    why = kind.problem(value)
    if why:
        raise SettingError(key, f"expected {kind.describe()}, got {value!r} ({why})", label)
    return kind.normalise(value)


@dataclass(frozen=True)
class Setting:
    kind: Kind
    default: object = None
    required: bool = False


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
    "model": Setting(Str(), DEFAULT_MODEL),
    "pinned": Setting(Optional(Str())),
    "reference": Setting(Optional(ConditionName())),
    "item_seed": Setting(Int(0), 0),
    "batch": Setting(Int(1), 1),
    "fidelity": Setting(Bool(), False),
}


def check_run(settings: dict, label=cli_label) -> dict:
    """`bcr run`'s settings, each by the one validator (`label(key)` names it in the error), then
    the checks that read two keys; each error carries the key it is about."""
    unknown = [key for key in settings if key not in RUN]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting; the settings: {', '.join(RUN)}", label(unknown[0]))
    checked = {key: check_setting(key, value, RUN[key].kind, label(key)) for key, value in settings.items()}
    full = {key: s.default for key, s in RUN.items()} | checked
    if "benchmark" in full and full["benchmark"] is not None:
        from bcr_core.agents.graph import full_connected

        try:
            full_connected(full["benchmark"], full["agents"], full["pinned"])
        except SettingError as err:
            raise err.relabel(label(err.key)) from None
    return checked
