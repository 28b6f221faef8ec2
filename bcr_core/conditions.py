"""Named conditions: a string such as `kvcomm@0.5` or `coin-chunk@0.3:seed=2` turns into a server.

Syntax: `name[@value][:key=value,...]`. The `@value` is the condition's main parameter: gamma for
kvcomm, rho for the repair conditions (default 0.20), theta for opengate (0.5), the give-up
probability for random-alloc (0.25), the paired BCR-chunk reuse rate r for cacheblend-reuse.
Options (each condition's `Definition` lists what it takes; anything else is an error naming them):
`gamma=` (the KVComm gate under any policy), `seed=` (coin streams), `chunk=` (B: the chunk unit and
the skip rule's B), `skip=alg1|off` (Algorithm 1's skip rule, on every layout), `rank=all|predicted`
(rank every cached row, or only the rows KVComm predicted), `match=bcr-chunk|...|ours-single`
(every repair but BCR's own: recompute on each call exactly as many rows as that condition, with the
same budget and options, recomputes on it), `tau=`, `span_cap=` (grow), `layer=` (CacheBlend's check
layer). Every deployable selector of `repair.selectors` is served as `SELECTOR-LAYOUT` (the draft as
`bcr-...`, CacheBlend as `cacheblend-cost` on single rows and `cacheblend-chunk`); the rules that name
rows themselves (seams, window) on single rows only, as the arena spends them. Every condition is one
`Definition` in `DEFINITIONS` (its factory, options, default value, and for a repair its selector, layout and
budget): a repair condition is a selector and a layout; a new control is one Definition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bcr_core import paper, spec_grammar
from bcr_core.agents.call_policies import RandomAllocationServer, protect_leaf, protect_root
from bcr_core.errors import UsageError
from bcr_core.repair.bcr import BCRServer, MatchedBudget
from bcr_core.repair.layouts import RANKS, SKIP_RULES, LayoutConfig, layout
from bcr_core.repair.opengate import OpenGateServer
from bcr_core.repair.selectors import SELECTORS, CoinSelector, Selector
from bcr_core.reuse.anchors import ASSEMBLIES, KVCommConfig
from bcr_core.reuse.servers import DenseAgainServer, DenseServer, KVCommServer
from bcr_core.setting_kinds import Float, Int, Str
from bcr_core.spec_grammar import Family, Option, Spec

GATE = {"gamma": Option(Float(0.0, 1.0), KVCommConfig.gamma, "KVComm's entropy gate (Equation 2)")}
ASSEMBLY = {
    "assembly": Option(
        Str(ASSEMBLIES),
        KVCommConfig.assembly,
        "released: each segment tokenized alone (the tokenization tax); aligned: segments cut where "
        "Dense's tokenization has a boundary, so the reuse path's ids are Dense's",
    )
}
SEED = {"seed": Option(Int(), 0, "the stream's seed")}
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
        Str(("none", "bcr-chunk", "bcr-grow", "bcr-single", "ours-chunk", "ours-single")),
        "none",
        "none: the layout's own budget; bcr-... (or ours-...): on each call exactly as many rows as that "
        "condition (same rho, chunk, rank) recomputes on the same cache (App. D's row for row)",
    )
}
GROW = {"tau": Option(Float(0.0, 1.0), LayoutConfig.tau), "span_cap": Option(Int(1), LayoutConfig.span_cap)}
LAYER = {"layer": Option(Int(1), 1, "CacheBlend's check layer (its paper's: 1)")}


class Condition(Spec):
    """A condition's spec (`spec_grammar.Spec`), with the settings it runs."""

    @property
    def settings(self) -> tuple:
        """What the condition runs, every default filled in: two conditions with equal settings are
        the same run (`bcr-chunk`, `bcr-chunk@0.2` and `bcr-chunk:chunk=64` all are)."""
        options = {key: self.option(key) for key in DEFINITIONS[self.name].options}
        value = self.default_value
        if self.name == "kvcomm":  # its value is the gate; a gamma option overrides it
            gamma = options.pop("gamma")
            value = gamma if "gamma" in self.options else value
        return self.name, value, tuple(sorted(options.items()))


def parse(spec: str) -> Condition:
    return CONDITIONS.read(spec)


def find(conditions: list[str], spec: str) -> str:
    """The recorded label with the same settings as `spec` (`kvcomm@0.3` finds `kvcomm`), else `spec`."""
    wanted = parse(spec).settings
    return next((c for c in conditions if parse(c).settings == wanted), spec)


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
    return spec_grammar.expand_seeds(conditions, seeds)


def condition(name: str, value: float | None = None, **options) -> str:
    """A condition's label from its parts, checked as `parse` checks a written one; options given as
    None or at their defaults are left out (a coin's seed is kept), and KVComm's default gate too:
    condition("bcr-chunk", 0.2, chunk=64) == "bcr-chunk@0.2"; condition("kvcomm", 0.3) == "kvcomm"."""
    if name == "kvcomm" and value == DEFINITIONS["kvcomm"].value:
        value = None
    return CONDITIONS.made(name, value, **options).label


def with_options(spec: str, **options) -> str:
    """A condition's label with more options set (`with_options("bcr-chunk:chunk=16", rank="predicted")`)."""
    return parse(spec).with_options(**options).label


def make_server(bb, spec: str | Condition):
    condition = parse(spec) if isinstance(spec, str) else spec
    server = DEFINITIONS[condition.name].factory(bb, condition)
    server.name = condition.label
    return server


def kvcomm_config(c: Condition, gamma: float | None = None) -> KVCommConfig:
    """The gate under a policy: `:gamma=` overrides the default (or the policy's own)."""
    gamma = float(c.options.get("gamma", c.option("gamma") if gamma is None else gamma))
    assembly = c.option("assembly") if "assembly" in DEFINITIONS[c.name].options else KVCommConfig.assembly
    return KVCommConfig(gamma=gamma, assembly=assembly)


def layout_config(c: Condition) -> LayoutConfig:
    return LayoutConfig(
        **{key: c.option(key) for key in ("chunk", "tau", "span_cap", "skip") if key in DEFINITIONS[c.name].options}
    )


def _kvcomm(bb, c: Condition):
    return KVCommServer(bb, kvcomm_config(c, c.value))


def _repair(bb, c: Condition):
    return BCRServer(
        bb,
        make_selector(c),
        layout(DEFINITIONS[c.name].layout, layout_config(c)),
        c.default_value,
        kvcomm_config(c),
        rank=c.option("rank"),
        match=matched_budget(c),
    )


def matched_budget(c: Condition) -> MatchedBudget | None:
    """The BCR rule a row-matched control takes its per-call row count from (`match=`)."""
    paired = c.options.get("match", "none")  # only the controls take the option
    if paired == "none":
        return None
    return MatchedBudget(
        SELECTORS[DEFINITIONS[paired].selector](), layout(DEFINITIONS[paired].layout, layout_config(c))
    )


def make_selector(c: Condition) -> Selector:
    """The repair condition's selector (its Definition's). A coin is one stream over the whole run, seeded
    once (the arena's coins draw afresh per call, `arena.registry`, since it measures calls apart),
    drawing once per chunk on the chunk layout, so every chunk (a short trailing one too) is equally
    likely, and once per row otherwise."""
    definition = DEFINITIONS[c.name]
    if definition.selector == CoinSelector.name:
        return CoinSelector(_seed(c), unit=c.option("chunk") if definition.layout == "chunk" else 1)
    return SELECTORS[definition.selector](**{key: c.option(key) for key in LAYER if key in definition.options})


def _cacheblend_reuse(bb, c: Condition):
    if c.value is None:
        raise UsageError(
            "cacheblend-reuse needs the paired BCR-chunk reuse rate r: write cacheblend-reuse@r "
            "(it recomputes rho_CB = 1 - r of the rows)"
        )
    return BCRServer(
        bb,
        make_selector(c),
        layout(DEFINITIONS[c.name].layout, layout_config(c)),
        DEFINITIONS[c.name].budget(c),
        kvcomm_config(c),
        rank=c.option("rank"),
    )


def _seed(c: Condition) -> int:
    return c.option("seed")


@dataclass(frozen=True)
class Definition:
    """Everything one condition is, in one place: the factory that builds its server, the options
    it takes (anything else is refused, naming these), its main value when none is written, and for
    a repair, the selector that ranks the rows (`repair.selectors.SELECTORS`), the layout it spends
    its budget in (None: it repairs nothing) and the share of the cache that budget is (`rho`, from
    the condition). A repair condition is a selector and a layout; a new control is one Definition."""

    factory: Callable  # (bb, Condition) -> Server
    options: dict[str, Option] = field(default_factory=dict)
    value: float | None = None  # the main value when none is written
    layout: str | None = None  # the layout a repair condition spends its budget in
    selector: str | None = None  # the selector a repair condition ranks rows with
    rho: Callable | None = None  # (Condition) -> the budget rho, for a repair whose value is not rho
    about: str = ""

    def budget(self, c: Condition) -> float | None:
        """The share of the cache a repair condition recomputes; None for one that repairs nothing."""
        if self.layout is None:
            return None
        return self.rho(c) if self.rho is not None else c.default_value


def repair_definition(selector: str, layout_name: str, options: dict, about: str) -> Definition:
    """A repair condition: `selector` ranking rows for `layout_name`, at the paper's rho by default."""
    return Definition(_repair, GATE | ASSEMBLY | REPAIR | options, paper.RHO, layout_name, selector, about=about)


DEFINITIONS: dict[str, Definition] = {
    "dense": Definition(lambda bb, c: DenseServer(bb), about="every call prefilled from scratch (the reference)"),
    "dense-again": Definition(
        lambda bb, c: DenseAgainServer(bb),
        about="Dense again, served as the serial conditions are: agreement with Dense is the instrument's floor",
    ),
    "token-matched-dense": Definition(
        lambda bb, c: DenseServer(bb, token_matched=True), about="Dense on the reuse path's ids (§4.3)"
    ),
    "kvcomm": Definition(
        _kvcomm, GATE | ASSEMBLY, paper.GAMMA, about="KVComm: reuse when the entropy gate gamma passes"
    ),
    "opengate": Definition(
        lambda bb, c: OpenGateServer(bb, c.default_value, config=kvcomm_config(c, 1.0)),
        {"gamma": Option(Float(0.0, 1.0), 1.0, "OpenGate runs with the entropy gate off (App. I)")},
        paper.OPENGATE_THETA,
        about="KVComm with the gate moved to the answer: keep if the draft's mean top-1 prob >= theta (App. I)",
    ),
    "protect-root": Definition(
        lambda bb, c: protect_root(bb, kvcomm_config(c)), GATE, about="Table 7: agent 1 always prefilled dense"
    ),
    "protect-leaf": Definition(
        lambda bb, c: protect_leaf(bb, kvcomm_config(c)), GATE, about="Table 7: the aggregator always prefilled dense"
    ),
    "random-alloc": Definition(
        lambda bb, c: RandomAllocationServer(bb, c.default_value, _seed(c), kvcomm_config(c)),
        GATE | SEED,
        paper.RANDOM_ALLOCATION_P,
        about="Table 7: each reuse the gate allows is given up with probability p",
    ),
    "bcr-chunk": repair_definition("draft", "chunk", {}, "BCR, whole chunks (Algorithm 1)"),
    "bcr-grow": repair_definition("draft", "grow", GROW, "BCR, spans grown from the best rows"),
    "bcr-single": repair_definition("draft", "single", {}, "BCR, single rows"),
    "ours-chunk": repair_definition(
        "ours", "chunk", MATCH, "the lab's pre-registered rule, rows both attended and wrong, whole chunks"
    ),
    "ours-single": repair_definition(
        "ours", "single", MATCH, "the lab's pre-registered rule, rows both attended and wrong, single rows"
    ),
    "coin-chunk": repair_definition("coin", "chunk", SEED | MATCH, "a fair coin per chunk"),
    "coin-single": repair_definition("coin", "single", SEED | MATCH, "a fair coin per row"),
    "cacheblend-cost": repair_definition(
        "cacheblend", "single", LAYER | MATCH, "CacheBlend's layer-1 rule at BCR's budget, single rows"
    ),
    "cacheblend-chunk": repair_definition(
        "cacheblend", "chunk", LAYER | MATCH, "CacheBlend's layer-1 rule, whole chunks (as the arena spends it)"
    ),
    "question-chunk": repair_definition(
        "question", "chunk", MATCH, "the prompt's trailing text run over the cache, rows ranked by its attention"
    ),
    "question-single": repair_definition(
        "question", "single", MATCH, "the prompt's trailing text's attention, single rows"
    ),
    "seams-single": repair_definition("seams", "single", MATCH, "the first rows after every seam, spread evenly"),
    "window-single": repair_definition(
        "window", "single", MATCH, "a window after every seam, each the same share of its segment"
    ),
    "cacheblend-reuse": Definition(
        lambda bb, c: _cacheblend_reuse(bb, c),
        GATE | REPAIR,
        None,
        "single",
        "cacheblend",
        rho=lambda c: 1.0 - c.value,
        about="CacheBlend at the paired BCR-chunk reuse rate r: rho = 1 - r",
    ),
}
CONDITIONS = Family(
    "condition",
    {name: d.options for name, d in DEFINITIONS.items()},
    {name: d.value for name, d in DEFINITIONS.items()},
    make=Condition,
)
# the repair conditions whose main value is the budget rho
REPAIRS = tuple(name for name, spec in DEFINITIONS.items() if spec.layout is not None and spec.rho is None)
