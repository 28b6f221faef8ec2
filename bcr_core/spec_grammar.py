"""The `name[@value][:key=value,...]` grammar that names a condition (`bcr_core.conditions`, e.g.
`bcr-chunk@0.2:chunk=16`) and an arena selector (`bcr_core.arena.registry`, e.g. `cacheblend:layer=3`).

`Spec` is the one value every such label comes from: a `Family` (conditions, selectors) reads one
from text or makes one from parts, checking its name and options against the family's table of
`Option`s; `Spec.label` writes it back, `Spec.option` fills a default, and two specs are equal when
their name, value and options are. Also here: running a seedless coin once per seed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bcr_core.errors import UsageError
from bcr_core.setting_kinds import Kind, SettingError, check_setting


@dataclass(frozen=True)
class Option:
    """One option a spec takes: the kind of value it accepts (`bcr_core.setting_kinds`) and its default."""

    kind: Kind
    default: object
    about: str = ""

    def read(self, key: str, raw: str):
        """The option's value from its text, checked by the one validator (`settings.check_setting`)."""
        return check_setting(key, self.kind.from_text(raw), self.kind, label=f"option {key}")


@dataclass(frozen=True)
class Spec:
    """One parsed condition or selector: its name, its `@value` (None when not written) and the
    options written. `label` is its one written form; `option` is an option as written, else its
    default. Made by a `Family` (`Family.read`, `Family.made`), never by hand."""

    name: str
    value: float | None = None
    options: Mapping = field(default_factory=dict)
    family: Family | None = field(default=None, compare=False, repr=False)

    @property
    def label(self) -> str:
        return label(self.name, self.value, self.options)

    def __str__(self) -> str:
        return self.label

    def option(self, key: str):
        """The option's value as written, else its default for this spec's name."""
        return self.options.get(key, self.family.takes[self.name][key].default)

    @property
    def default_value(self) -> float | None:
        """The `@value` as written, else the family's default for this name."""
        return self.family.values.get(self.name) if self.value is None else self.value

    def with_options(self, **options) -> Spec:
        """The same spec with more options set, checked as a written one is."""
        return self.family.read(label(self.name, self.value, {**self.options, **options}))


@dataclass(frozen=True)
class Family:
    """Specs that share the grammar: what one is called in errors ("condition", "selector"), the
    options each name takes, each name's default `@value` (a family without `valued` takes none),
    the old names records may hold, and the `Spec` type it makes (conditions add their settings)."""

    what: str
    takes: Mapping[str, Mapping[str, Option]]
    values: Mapping[str, float | None] = field(default_factory=dict)
    valued: bool = True
    renamed: Mapping[str, str] = field(default_factory=dict)
    make: type[Spec] = Spec

    def known(self, name: str) -> str:
        """`name` under today's name, refused with the known ones when the family has none such."""
        name = self.renamed.get(name, name)
        if name not in self.takes:
            raise UsageError(f"unknown {self.what} {name!r}; known: {', '.join(self.takes)}")
        return name

    def read(self, text: str) -> Spec:
        """The spec `text` writes; an unknown name, a bad value or option is one line naming it."""
        head, value, pairs = split(text)
        name = self.known(head)
        if value and not self.valued:
            raise UsageError(f"{self.what} {text!r}: a {self.what} takes options (name:key=value), not an @value")
        try:
            number = float(value) if value else None
        except ValueError:
            raise UsageError(f"cannot read {self.what} {text!r}: expected name[@number][:key=value,...]") from None
        return self.make(name, number, read_options(text, self.what, name, pairs, self.takes[name]), self)

    def made(self, name: str, value: float | None = None, **options) -> Spec:
        """The spec built from parts, checked as a written one is: options given as None or at their
        defaults are left out, a coin's seed kept (`made("bcr-chunk", 0.2, chunk=64)` reads `bcr-chunk@0.2`)."""
        name = self.known(name)
        return self.read(label(name, value, shown(name, options, self.takes[name])))


def split(spec: str) -> tuple[str, str, list[str]]:
    """A spec's name, its `@value` text ('' when none) and its `key=value` pieces."""
    head, _, tail = spec.strip().partition(":")
    name, _, value = head.partition("@")
    return name.strip(), value.strip(), [p.strip() for p in tail.split(",") if p.strip()]


def read_options(spec: str, what: str, name: str, pairs: list[str], takes: dict[str, Option]) -> dict:
    """The options of `spec` (a `what`, e.g. "condition") read against the ones `name` takes;
    a piece that is not key=value, an option it does not take, or a bad value is one line naming it."""
    options = {}
    for pair in pairs:
        key, eq, raw = (part.strip() for part in pair.partition("="))
        if not eq or not raw:
            raise UsageError(f"cannot read {what} {spec!r}: option {pair!r} is not key=value")
        if key not in takes:
            offered = ", ".join(sorted(takes)) or "none"
            raise UsageError(f"{what} {name!r} takes no option {key!r} (in {spec!r}); its options: {offered}")
        try:
            options[key] = takes[key].read(key, raw)
        except SettingError as error:
            raise UsageError(f"{what} {spec!r}: {error}") from None
    return options


def is_coin(name: str) -> bool:
    """Whether a condition or selector name is a coin (the arena's `coin`, the conditions' `coin-LAYOUT`):
    the specs a seedless listing runs once per seed, and whose seed every label shows."""
    return name == "coin" or name.startswith("coin-")


def expand_seeds(specs: list[str], seeds: list[int] | None) -> list[str]:
    """Every coin spec that names no seed, once per seed in `seeds`; everything else once."""
    if not seeds:
        return list(specs)
    out = []
    for spec in specs:
        if is_coin(split(spec)[0]) and "seed=" not in spec:
            out += [f"{spec}{',' if ':' in spec else ':'}seed={s}" for s in seeds]
        else:
            out.append(spec)
    return out


def shown(name: str, options: dict, takes: dict[str, Option]) -> dict:
    """The options a label built from parts writes: those given and away from their defaults, and a
    coin's seed always (its stream is part of its name)."""

    def keep(k: str, v: object) -> bool:
        return v is not None and (k not in takes or v != takes[k].default or (k == "seed" and is_coin(name)))

    return {k: v for k, v in options.items() if keep(k, v)}


def label(name: str, value: float | None = None, options: dict | None = None) -> str:
    """A spec written back: `name[@value][:key=value,...]`, options sorted, floats as %g."""
    text = name if value is None else f"{name}@{value:g}"
    if options:
        text += ":" + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(options.items()))
    return text
