"""One `bcr run` cell (benchmark x agent count, its items and new tokens) under several conditions:
`Cell` and `make_cell`, which check every setting and condition before any folder is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bcr_core.conditions import REPAIRS, SPECS, Condition, expand_seeds, parse
from bcr_core.data import benchmarks
from bcr_core.data.roles import DEFAULT_PROMPT
from bcr_core.engine.stopping import DEFAULT_RULE
from bcr_core.runs.run_settings import RUN, check_run
from bcr_core.setting_kinds import SettingError, check_setting


@dataclass(frozen=True)
class Cell:
    benchmark: str
    n_agents: int
    conditions: tuple[str, ...]
    n: int
    max_new_tokens: int = 512
    pinned: str | None = None
    model: str = "default"
    reference: str | None = None  # condition the b/c splits are taken against (default: kvcomm or the first)
    extra: dict = field(default_factory=dict)  # task options (e.g. the synthetic task's seed)
    fidelity: bool = False  # also serve every call densely and record its in-situ fidelity (about 2x the work)
    prompt: str = DEFAULT_PROMPT  # the templates' form (`data.roles.PROMPTS`)
    stop: str = DEFAULT_RULE  # the rule every call's decoding ends by (`engine.stopping.RULES`)

    def __post_init__(self):
        check_setting("n", self.n, RUN["n"].kind)
        check_setting("prompt", self.prompt, RUN["prompt"].kind)
        check_setting("stop", self.stop, RUN["stop"].kind)
        parsed = [parse(c) for c in self.conditions]
        seen: dict[tuple, str] = {}
        for c in parsed:
            if c.settings in seen:
                raise SettingError(
                    "conditions",
                    f"{seen[c.settings]} and {c.label} repeat one run (the same settings); list it once",
                )
            seen[c.settings] = c.label
        for c in parsed:
            check_value(c)
        object.__setattr__(self, "conditions", tuple(c.label for c in parsed))
        if self.reference is not None and parse(self.reference).settings not in seen:
            raise SettingError(
                "reference", f"{self.reference} is not among the conditions: {', '.join(self.conditions)}"
            )


def check_value(c: Condition) -> None:
    """Refuse a condition value no server can take, naming it (before any folder is touched); the
    error is about the `conditions` setting and reads `condition LABEL: why`."""
    refuse = lambda why: SettingError("conditions", why, label=f"condition {c.label}")  # noqa: E731
    if c.name == "cacheblend-reuse" and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"r is the paired BCR-chunk reuse rate, in [0, 1]; got {c.value:g}")
    if c.name in REPAIRS and c.value is not None and not 0.0 <= c.value <= 1.0:
        raise refuse(f"rho is the share of rows repaired, in [0, 1]; got {c.value:g}")
    if "seed" in SPECS[c.name].options and c.option("seed") < 0:
        raise refuse(f"option seed is a coin stream's seed, at least 0; got {c.option('seed')}")


def make_cell(**settings) -> Cell:
    """The cell `bcr run` runs for these settings (each cell of `bcr grid` and of a notebook's
    `Comparison` too): every key of `runs.run_settings.RUN` but `batch` (how a cell runs, not what it
    is), by keyword, at `RUN`'s default where not given. Coin conditions without a seed run once
    per seed in `seeds`; the synthetic task's items are drawn with `item_seed`. Every setting is
    checked first by the one validator (`runs.run_settings.check_run`): an error names its key."""
    if "batch" in settings:
        raise SettingError("batch", "is how a cell runs, not what it is: give it to the runner, not the cell")
    checked = check_run(settings)
    for key, setting in RUN.items():
        if setting.required and checked.get(key) is None:
            raise SettingError(key, "missing; every run names it")
    s = {key: setting.default for key, setting in RUN.items()} | checked
    if s["seeds"] and not any(c.startswith("coin-") for c in s["conditions"]):
        raise SettingError(
            "seeds", "runs coin conditions once per seed, and no coin condition (coin-chunk, coin-single) is listed"
        )
    return Cell(
        benchmark=s["benchmark"],
        n_agents=s["agents"],
        conditions=tuple(expand_seeds(s["conditions"], s["seeds"])),
        n=s["n"],
        max_new_tokens=s["max_new_tokens"],
        pinned=s["pinned"],
        model=s["model"],
        reference=s["reference"],
        extra=benchmarks.item_draw(s["benchmark"], s["item_seed"]),
        fidelity=s["fidelity"],
        prompt=s["prompt"],
        stop=s["stop"],
    )
