"""Named conditions: a string such as `kvcomm@0.5` or `coin-chunk@0.3:seed=2` turns into a server.

Syntax: `name[@value][:key=value,...]`. The `@value` is the condition's main parameter: gamma for
kvcomm, rho for the repair conditions (default 0.20), theta for opengate (0.5), the give-up
probability for random-alloc (0.25), the paired BCR-chunk reuse rate r for cacheblend-reuse.
Options: `gamma=` (the KVComm gate under any policy), `seed=` (coin streams), `chunk=`, `tau=`,
`span_cap=` (layouts). A new control is one factory and one registry line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bcr_core.allocation import RandomAllocationServer, protect_leaf, protect_root
from bcr_core.anchors import KVCommConfig
from bcr_core.bcr import BCRServer
from bcr_core.layouts import LayoutConfig, layout
from bcr_core.opengate import OpenGateServer
from bcr_core.selectors import CacheBlendSelector, CoinSelector, DraftSelector
from bcr_core.serving import DenseServer, KVCommServer


@dataclass(frozen=True)
class Condition:
    name: str
    value: float | None = None
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        text = self.name if self.value is None else f"{self.name}@{self.value:g}"
        if self.options:
            text += ":" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return text


def parse(spec: str) -> Condition:
    head, _, tail = spec.strip().partition(":")
    name, _, value = head.partition("@")
    if name not in REGISTRY:
        raise ValueError(f"unknown condition {name!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        number = float(value) if value else None
        options = {}
        for pair in filter(None, tail.split(",")):
            key, _, raw = pair.partition("=")
            options[key.strip()] = float(raw) if "." in raw else int(raw)
    except ValueError:
        raise ValueError(f"cannot read condition {spec!r}: expected name[@number][:key=number,...]") from None
    return Condition(name, number, options)


def make_server(bb, spec: str | Condition):
    condition = parse(spec) if isinstance(spec, str) else spec
    server = REGISTRY[condition.name](bb, condition)
    server.name = condition.label
    return server


def kvcomm_config(c: Condition, gamma: float | None = None) -> KVCommConfig:
    """The gate under a policy: `:gamma=` overrides the default (or the policy's own)."""
    return KVCommConfig(gamma=float(c.options.get("gamma", KVCommConfig.gamma if gamma is None else gamma)))


def layout_config(c: Condition) -> LayoutConfig:
    defaults = LayoutConfig()
    return LayoutConfig(
        chunk=int(c.options.get("chunk", defaults.chunk)),
        tau=float(c.options.get("tau", defaults.tau)),
        span_cap=int(c.options.get("span_cap", defaults.span_cap)),
    )


def value_of(c: Condition) -> float | None:
    """The condition's main value: as written, else its default (DEFAULT_VALUES)."""
    return DEFAULT_VALUES.get(c.name) if c.value is None else c.value


def _kvcomm(bb, c: Condition):
    return KVCommServer(bb, kvcomm_config(c, c.value))


def _repair(selector: Callable, layout_name: str):
    def factory(bb, c: Condition):
        return BCRServer(bb, selector(c), layout(layout_name, layout_config(c)), value_of(c), kvcomm_config(c))
    return factory


def _cacheblend_reuse(bb, c: Condition):
    if c.value is None:
        raise ValueError("cacheblend-reuse needs the paired BCR-chunk reuse rate r: write cacheblend-reuse@r "
                         "(it recomputes rho_CB = 1 - r of the rows)")
    return BCRServer(bb, CacheBlendSelector(), layout("single"), 1.0 - c.value, kvcomm_config(c))


def _seed(c: Condition) -> int:
    return int(c.options.get("seed", 0))


DEFAULT_RHO = 0.20  # §3: the budget every layout spends unless told otherwise
REPAIRS = ("bcr-chunk", "bcr-grow", "bcr-single", "coin-chunk", "coin-single", "cacheblend-cost")
# The main value each condition takes when none is written: the gate for kvcomm, OpenGate's theta
# (App. I), random-alloc's give-up probability, the budget rho for the repairs.
DEFAULT_VALUES = {"kvcomm": KVCommConfig.gamma, "opengate": 0.5, "random-alloc": 0.25,
                  **{name: DEFAULT_RHO for name in REPAIRS}}

REGISTRY: dict[str, Callable] = {
    "dense": lambda bb, c: DenseServer(bb),
    "token-matched-dense": lambda bb, c: DenseServer(bb, token_matched=True),
    "kvcomm": _kvcomm,
    "opengate": lambda bb, c: OpenGateServer(bb, value_of(c), config=kvcomm_config(c, 1.0)),
    "protect-root": lambda bb, c: protect_root(bb, kvcomm_config(c)),
    "protect-leaf": lambda bb, c: protect_leaf(bb, kvcomm_config(c)),
    "random-alloc": lambda bb, c: RandomAllocationServer(bb, value_of(c), _seed(c), kvcomm_config(c)),
    "bcr-chunk": _repair(lambda c: DraftSelector(), "chunk"),
    "bcr-grow": _repair(lambda c: DraftSelector(), "grow"),
    "bcr-single": _repair(lambda c: DraftSelector(), "single"),
    "coin-chunk": _repair(lambda c: CoinSelector(_seed(c)), "chunk"),
    "coin-single": _repair(lambda c: CoinSelector(_seed(c)), "single"),
    "cacheblend-cost": _repair(lambda c: CacheBlendSelector(), "single"),
    "cacheblend-reuse": _cacheblend_reuse,
}
