"""Named conditions: a string such as `kvcomm@0.5` or `coin-chunk@0.3:seed=2` turns into a server.

Syntax: `name[@value][:key=value,...]`. The `@value` is the condition's main parameter: gamma for
kvcomm, rho for the repair conditions (default 0.20), theta for opengate (0.5), the give-up
probability for random-alloc (0.25), the paired BCR-chunk reuse rate r for cacheblend-reuse.
Options (`OPTIONS` lists what each condition takes; anything else is an error naming them):
`gamma=` (the KVComm gate under any policy), `seed=` (coin streams), `chunk=` (B: the chunk unit and
the skip rule's B), `skip=alg1|off` (Algorithm 1's skip rule, on every layout), `rank=all|predicted`
(rank every cached row, or only the rows KVComm predicted), `match=bcr-chunk|bcr-grow|bcr-single`
(coin and CacheBlend: recompute on each call exactly as many rows as that BCR condition, with the
same budget and options, recomputes on it), `tau=`, `span_cap=` (grow). A new
control is one factory, one registry line and one line of options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bcr_core import paper
from bcr_core.agents.call_policies import RandomAllocationServer, protect_leaf, protect_root
from bcr_core.errors import UsageError
from bcr_core.repair.bcr import BCRServer, MatchedBudget
from bcr_core.repair.layouts import RANKS, SKIP_RULES, LayoutConfig, layout
from bcr_core.repair.opengate import OpenGateServer
from bcr_core.repair.selectors import CacheBlendSelector, CoinSelector, DraftSelector
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.servers import DenseServer, KVCommServer
from bcr_core.settings import Float, Int, Kind, SettingError, Str, check_setting


@dataclass(frozen=True)
class Option:
    """One option a condition takes: the kind of value it accepts (`bcr_core.settings`) and its default."""

    kind: Kind
    default: object
    about: str = ""

    def read(self, key: str, raw: str):
        """The option's value from its text, checked by the one validator (`settings.check_setting`)."""
        return check_setting(key, self.kind.from_text(raw), self.kind, label=f"option {key}")


GATE = {"gamma": Option(Float(0.0, 1.0), KVCommConfig.gamma, "KVComm's entropy gate (Equation 2)")}
SEED = {"seed": Option(Int(), 0, "the coin's stream")}
REPAIR = {
    "chunk": Option(Int(1), LayoutConfig.chunk, "B: the chunk layout's unit and the skip rule's B (App. B)"),
    "skip": Option(
        Str(SKIP_RULES),
        LayoutConfig.skip,
        "alg1: Algorithm 1's skip rule (M < 2B or rho M < B) on "
        "every layout; off: repair whenever the budget buys a row",
    ),
    "rank": Option(
        Str(RANKS),
        "all",
        "all: rank every cached row (the paper); predicted: only rows KVComm "
        "predicted, the budget still counting the whole cache",
    ),
}
MATCH = {
    "match": Option(
        Str(("none", "bcr-chunk", "bcr-grow", "bcr-single")),
        "none",
        "none: the layout's own budget; bcr-...: on each call exactly the rows that BCR condition "
        "(same rho, chunk, rank) recomputes on the same cache (App. D's row for row)",
    )
}
GROW = {"tau": Option(Float(0.0, 1.0), LayoutConfig.tau), "span_cap": Option(Int(1), LayoutConfig.span_cap)}


@dataclass(frozen=True)
class Condition:
    name: str
    value: float | None = None
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        text = self.name if self.value is None else f"{self.name}@{self.value:g}"
        if self.options:
            text += ":" + ",".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(self.options.items())
            )
        return text

    def option(self, key: str):
        """The option's value as written, else its default for this condition."""
        return self.options.get(key, OPTIONS[self.name][key].default)

    @property
    def settings(self) -> tuple:
        """What the condition runs, every default filled in: two conditions with equal settings are
        the same run (`bcr-chunk`, `bcr-chunk@0.2` and `bcr-chunk:chunk=64` all are)."""
        options = {key: self.option(key) for key in OPTIONS[self.name]}
        value = value_of(self)
        if self.name == "kvcomm":  # its value is the gate; a gamma option overrides it
            gamma = options.pop("gamma")
            value = gamma if "gamma" in self.options else value
        return self.name, value, tuple(sorted(options.items()))


def parse(spec: str) -> Condition:
    head, _, tail = spec.strip().partition(":")
    name, _, value = head.partition("@")
    if name not in REGISTRY:
        raise UsageError(f"unknown condition {name!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        number = float(value) if value else None
    except ValueError:
        raise UsageError(f"cannot read condition {spec!r}: expected name[@number][:key=value,...]") from None
    takes = OPTIONS[name]
    options = {}
    for pair in filter(None, (p.strip() for p in tail.split(","))):
        key, eq, raw = (part.strip() for part in pair.partition("="))
        if not eq or not raw:
            raise UsageError(f"cannot read condition {spec!r}: option {pair!r} is not key=value")
        if key not in takes:
            offered = ", ".join(sorted(takes)) or "none"
            raise UsageError(f"condition {name!r} takes no option {key!r} (in {spec!r}); its options: {offered}")
        try:
            options[key] = takes[key].read(key, raw)
        except SettingError as error:
            raise UsageError(f"condition {spec!r}: {error}") from None
    return Condition(name, number, options)


def split_conditions(text: str) -> list[str]:
    """A comma-separated list of conditions whose options are comma-separated too:
    `dense,bcr-chunk:chunk=16,rank=predicted,kvcomm` -> three conditions (a piece that is only
    `key=value` continues the condition before it)."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def expand_seeds(conditions: list[str], seeds: list[int] | None) -> list[str]:
    """Coin conditions without a seed run once per seed in `seeds`; everything else once."""
    if not seeds:
        return conditions
    out = []
    for spec in conditions:
        if spec.startswith("coin-") and "seed=" not in spec:
            out += [f"{spec}{',' if ':' in spec else ':'}seed={s}" for s in seeds]
        else:
            out.append(spec)
    return out


def make_server(bb, spec: str | Condition):
    condition = parse(spec) if isinstance(spec, str) else spec
    server = REGISTRY[condition.name](bb, condition)
    server.name = condition.label
    return server


def kvcomm_config(c: Condition, gamma: float | None = None) -> KVCommConfig:
    """The gate under a policy: `:gamma=` overrides the default (or the policy's own)."""
    return KVCommConfig(gamma=float(c.options.get("gamma", c.option("gamma") if gamma is None else gamma)))


def layout_config(c: Condition) -> LayoutConfig:
    return LayoutConfig(
        **{key: c.option(key) for key in ("chunk", "tau", "span_cap", "skip") if key in OPTIONS[c.name]}
    )


def value_of(c: Condition) -> float | None:
    """The condition's main value: as written, else its default (DEFAULT_VALUES)."""
    return DEFAULT_VALUES.get(c.name) if c.value is None else c.value


def _kvcomm(bb, c: Condition):
    return KVCommServer(bb, kvcomm_config(c, c.value))


def _repair(selector: Callable):
    def factory(bb, c: Condition):
        return BCRServer(
            bb,
            selector(c),
            layout(REPAIR_LAYOUTS[c.name], layout_config(c)),
            value_of(c),
            kvcomm_config(c),
            rank=c.option("rank"),
            match=matched_budget(c),
        )

    return factory


def matched_budget(c: Condition) -> MatchedBudget | None:
    """The BCR rule a row-matched control takes its per-call row count from (`match=`)."""
    paired = c.options.get("match", "none")  # only the controls take the option
    if paired == "none":
        return None
    return MatchedBudget(DraftSelector(), layout(REPAIR_LAYOUTS[paired], layout_config(c)))


def _coin(c: Condition) -> CoinSelector:
    """A coin over the layout's units: one draw per chunk for the chunk layout, so every chunk
    (a short trailing one too) is equally likely; one per row otherwise."""
    return CoinSelector(_seed(c), unit=c.option("chunk") if REPAIR_LAYOUTS[c.name] == "chunk" else 1)


def _cacheblend_reuse(bb, c: Condition):
    if c.value is None:
        raise UsageError(
            "cacheblend-reuse needs the paired BCR-chunk reuse rate r: write cacheblend-reuse@r "
            "(it recomputes rho_CB = 1 - r of the rows)"
        )
    return BCRServer(
        bb,
        CacheBlendSelector(),
        layout(REPAIR_LAYOUTS[c.name], layout_config(c)),
        1.0 - c.value,
        kvcomm_config(c),
        rank=c.option("rank"),
    )


def _seed(c: Condition) -> int:
    return c.option("seed")


# The layout each repair condition spends its budget in.
REPAIR_LAYOUTS = {
    "bcr-chunk": "chunk",
    "bcr-grow": "grow",
    "bcr-single": "single",
    "coin-chunk": "chunk",
    "coin-single": "single",
    "cacheblend-cost": "single",
    "cacheblend-reuse": "single",
}
REPAIRS = tuple(name for name in REPAIR_LAYOUTS if name != "cacheblend-reuse")
# The main value each condition takes when none is written: the gate for kvcomm, OpenGate's theta
# (App. I), random-alloc's give-up probability, the budget rho for the repairs.
DEFAULT_VALUES = {
    "kvcomm": paper.GAMMA,
    "opengate": paper.OPENGATE_THETA,
    "random-alloc": paper.RANDOM_ALLOCATION_P,
    **{name: paper.RHO for name in REPAIRS},
}

REGISTRY: dict[str, Callable] = {
    "dense": lambda bb, c: DenseServer(bb),
    "token-matched-dense": lambda bb, c: DenseServer(bb, token_matched=True),
    "kvcomm": _kvcomm,
    "opengate": lambda bb, c: OpenGateServer(bb, value_of(c), config=kvcomm_config(c, 1.0)),
    "protect-root": lambda bb, c: protect_root(bb, kvcomm_config(c)),
    "protect-leaf": lambda bb, c: protect_leaf(bb, kvcomm_config(c)),
    "random-alloc": lambda bb, c: RandomAllocationServer(bb, value_of(c), _seed(c), kvcomm_config(c)),
    "bcr-chunk": _repair(lambda c: DraftSelector()),
    "bcr-grow": _repair(lambda c: DraftSelector()),
    "bcr-single": _repair(lambda c: DraftSelector()),
    "coin-chunk": _repair(_coin),
    "coin-single": _repair(_coin),
    "cacheblend-cost": _repair(lambda c: CacheBlendSelector()),
    "cacheblend-reuse": _cacheblend_reuse,
}

# The options each condition takes (anything else is refused, naming these).
OPTIONS: dict[str, dict[str, Option]] = {
    "dense": {},
    "token-matched-dense": {},
    "kvcomm": GATE,
    "protect-root": GATE,
    "protect-leaf": GATE,
    "opengate": {"gamma": Option(float, 1.0, about="OpenGate runs with the entropy gate off (App. I)")},
    "random-alloc": GATE | SEED,
    "bcr-chunk": GATE | REPAIR,
    "bcr-grow": GATE | REPAIR | GROW,
    "bcr-single": GATE | REPAIR,
    "coin-chunk": GATE | REPAIR | SEED | MATCH,
    "coin-single": GATE | REPAIR | SEED | MATCH,
    "cacheblend-cost": GATE | REPAIR | MATCH,
    "cacheblend-reuse": GATE | REPAIR,
}
