"""The one settings model: the kinds of value a setting takes and the one validator every surface
uses (`check_setting`), and `Setting`, one setting's kind, default and help. The lab's settings are
built from them in `bcr_core.schema`, which `bcr`'s flags, `bcr grid` and the notebooks' parameter
cells read.

A bad value is a `SettingError` that names the key, what was given and what the key expects, on
one line: `--agents: expected int in [2, 5], got 9 (9 is outside in [2, 5])`. The key travels with
the error, so a caller that shows it under another name (`bcr grid` as `FILE: cells.NAME.agents`, a
notebook as `parameter 'agents'`) relabels it by the key, never by reading the message.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import ClassVar

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
class Number(Kind):
    """A kind whose values are one numeric type, `cast`: values normalise to it, text reads as it."""

    cast: ClassVar[type] = float

    def normalise(self, value):
        return self.cast(value)

    def from_text(self, raw):
        try:
            return self.cast(raw)
        except ValueError:
            return raw


@dataclass(frozen=True)
class Int(Number):
    cast: ClassVar[type] = int
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


@dataclass(frozen=True)
class Float(Number):
    cast: ClassVar[type] = float
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


@dataclass(frozen=True)
class Str(Kind):
    choices: tuple[str, ...] = ()
    empty: bool = False  # True: "" is a value (a setting whose empty text means "none")

    def describe(self):
        return "str" + (f" (one of {', '.join(map(repr, self.choices))})" if self.choices else "")

    def accepts(self, value):
        return isinstance(value, str)

    def problem(self, value):
        if self.choices and value not in self.choices:
            return f"{value!r} is not one of {', '.join(map(repr, self.choices))}"
        if not self.choices and not self.empty and not value.strip():
            return "it is empty"
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
                return EntryProblem(f"entry {i}: {why}")
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


class EntryProblem(str):
    """What is wrong with one entry of a list: said alone, since the list as such is what was expected."""


def check_setting(key: str, value, kind: Kind, label: str | None = None):
    """The one validator: `value`, normalised (ints for ints, floats for floats, lists for
    sequences), or a SettingError naming the key, what it expects and what was given (for a list
    whose entry is wrong, that entry and what is wrong with it)."""
    if not kind.accepts(value):
        raise SettingError(key, f"expected {kind.describe()}, got {type(value).__name__} {value!r}", label)
    why = kind.problem(value)
    if isinstance(why, EntryProblem):
        raise SettingError(key, why, label)
    if why:
        raise SettingError(key, f"expected {kind.describe()}, got {value!r} ({why})", label)
    return kind.normalise(value)


@dataclass(frozen=True)
class Setting:
    """One setting: its kind, its default (or `required`), and the help `bcr`'s flag for it shows."""

    kind: Kind
    default: object = None
    required: bool = False
    help: str = ""

    @property
    def plain_kind(self) -> Kind:
        """The kind a value has when one is given (`Optional`'s inner kind)."""
        return self.kind.inner if isinstance(self.kind, Optional) else self.kind


def check_given(schema: dict[str, Setting], settings: dict, label=cli_label, required: bool = False) -> dict:
    """The settings given, each by the one validator (`label(key)` names it in the error); a key the
    schema lacks is an error naming the schema's keys, and with `required`, so is a required one missing."""
    unknown = [key for key in settings if key not in schema]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting; the settings: {', '.join(schema)}", label(unknown[0]))
    missing = [key for key, s in schema.items() if required and s.required and settings.get(key) is None]
    if missing:
        raise SettingError(missing[0], "missing; it has no default", label(missing[0]))
    return {key: check_setting(key, value, schema[key].kind, label(key)) for key, value in settings.items()}


def check_settings(schema: dict[str, Setting], settings: dict, label=cli_label) -> dict:
    """Every setting of `schema`: those given checked (`check_given`, required ones too), the rest at
    their defaults."""
    return {key: s.default for key, s in schema.items()} | check_given(schema, settings, label, required=True)


def with_defaults(schema: dict[str, Setting], **defaults) -> dict[str, Setting]:
    """`schema` with other defaults for some settings (a default given makes a setting optional)."""
    unknown = [key for key in defaults if key not in schema]
    if unknown:
        raise KeyError(f"not settings of this schema: {unknown}")
    return {
        key: replace(s, default=defaults[key], required=False) if key in defaults else s for key, s in schema.items()
    }


def differences(found: dict, wanted: dict) -> str:
    """The settings two runs do not share, each as `key: found there, wanted now` (long values cut)."""
    shown = lambda settings, key: short(repr(settings[key])) if key in settings else "unset"
    unset = object()
    keys = [k for k in dict.fromkeys([*found, *wanted]) if found.get(k, unset) != wanted.get(k, unset)]
    return "; ".join(f"{k}: {shown(found, k)} there, {shown(wanted, k)} now" for k in keys)


def short(text: str, most: int = 60) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."
