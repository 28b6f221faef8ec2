"""The `name[@value][:key=value,...]` grammar that names a condition (`bcr_core.conditions`, e.g.
`bcr-chunk@0.2:chunk=16`) and an arena selector (`bcr_core.arena.registry`, e.g. `cacheblend:layer=3`):
splitting a spec, reading its options against a table of `Option`s, running a seedless coin once
per seed, and writing the label back."""

from __future__ import annotations

from dataclasses import dataclass

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
    keep = lambda k, v: v is not None and (k not in takes or v != takes[k].default or (k == "seed" and is_coin(name)))  # noqa: E731
    return {k: v for k, v in options.items() if keep(k, v)}


def label(name: str, value: float | None = None, options: dict | None = None) -> str:
    """A spec written back: `name[@value][:key=value,...]`, options sorted, floats as %g."""
    text = name if value is None else f"{name}@{value:g}"
    if options:
        text += ":" + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(options.items()))
    return text
