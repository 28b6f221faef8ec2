"""The headline grid of the claims: the conditions it names (`ClaimsGrid`), reading its
runs (a run's records or the committed ones, `.jsonl` or `.jsonl.gz`; conditions from several
folders on the same items pair by item id). Its table is `summary.condition_table` with the
`GRID` column groups; `runs.claims_run` runs it afresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from bcr_core.conditions import condition
from bcr_core.errors import UsageError
from bcr_core.run_folder import run_folders
from bcr_core.schema import CLAIMS
from bcr_core.setting_kinds import check_settings

GATE = "gate"  # the gate sweep's run folder: its own Dense and KVComm, read apart from the main grid
# The gate sweep on items of an item seed no run had read, with gamma settings between KVComm and
# OpenGate: where a claims folder holds it, Equation 3's line is read on it (the rule, and the line's
# margin, fixed before it ran); otherwise on `GATE`, after the fact.
GATE_FRESH = "gate-fresh"


# ------------------------------------------------------------------------------- records
def load_runs(folder, skip: tuple[str, ...] = (), benchmark: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Items and calls of every run folder (one holding `cell.json`) under `folder`, but those named
    in `skip` and, given a `benchmark`, those of another (a model's folder may hold its HumanEval cell beside
    its synthetic grid). Each comparison pairs its own conditions by item id (`paired`), so folders may hold
    different items."""
    items, calls = [], []
    for found in run_folders(folder):
        run = found.path.relative_to(folder).as_posix()
        if run in skip or found.settings.get("confirms"):  # a confirmation is its own family (`confirmation`)
            continue
        if benchmark is not None and found.settings.get("benchmark") != benchmark:
            continue
        items += [r | {"run": run} for r in found.items()]
        calls += found.calls()
    if not items:
        raise UsageError(f"no run records under {folder}")
    items = pd.DataFrame(items)
    twice = items.groupby(["condition", "item_id"])["run"].unique().map(len) > 1
    if twice.any():
        condition, item = twice[twice].index[0]
        raise UsageError(
            f"{folder} holds {condition} on item {item} in more than one run "
            f"({', '.join(items[(items.condition == condition) & (items.item_id == item)]['run'])}): "
            "point it at one grid's runs"
        )
    return items, pd.DataFrame(calls)


# ------------------------------------------------------------------------------- the grid itself
@dataclass(frozen=True)
class ClaimsGrid:
    """The headline grid and the runs its other claims read. Chunks of 16 rows on the
    CPU-sized synthetic prompts (~110-250 cached rows) keep about as many chunks per call as the
    paper's 64-row chunks on its ~1000-row GSM8K prompts, and let Algorithm 1 repair at all
    (with B = 64 every call is under rho M = 64 and skipped); every repair condition carries the
    same B so the skip rule skips the same calls for all of them."""

    benchmark: str = CLAIMS["benchmark"].default
    agents: int = CLAIMS["agents"].default
    n: int = CLAIMS["n"].default
    max_new_tokens: int = CLAIMS["max_new_tokens"].default
    chunk: int = CLAIMS["chunk"].default
    seeds: tuple[int, ...] = tuple(CLAIMS["seeds"].default)
    gammas: tuple[float, ...] = tuple(CLAIMS["gammas"].default)
    theta: float = CLAIMS["theta"].default
    item_seed: int = CLAIMS["item_seed"].default
    gate_n: int = CLAIMS["gate_n"].default
    rhos: tuple[float, ...] = tuple(CLAIMS["rhos"].default)
    segment_tokens: int = CLAIMS["segment_tokens"].default
    unit_prompts: int = CLAIMS["unit_prompts"].default

    def __post_init__(self):
        """Every field checked by the schema (`bcr_core.schema.CLAIMS`), a notebook's lists kept as tuples."""
        checked = check_settings(
            CLAIMS, {f.name: getattr(self, f.name) for f in fields(self)}, label=lambda key: f"ClaimsGrid.{key}"
        )
        for name, value in checked.items():
            object.__setattr__(self, name, tuple(value) if isinstance(value, list) else value)

    def label(self, name: str, value: float | None = None, **options) -> str:
        """A repair condition of the grid: its B, and the options given."""
        return condition(name, value, chunk=self.chunk, **options)

    @property
    def bcr(self) -> str:
        return self.label("bcr-chunk")

    @property
    def cacheblend(self) -> str:
        return self.label("cacheblend-cost")

    def matched(self) -> list[str]:
        """Row-matched controls (App. D, "row for row"): on each call exactly the rows the paired
        BCR-chunk condition recomputes on it, by coin (every seed) or by CacheBlend's selector."""
        return [
            *self.coins("coin-chunk", match="bcr-chunk"),
            self.label("cacheblend-cost", match="bcr-chunk"),
            *self.coins("coin-chunk", rank="predicted", match="bcr-chunk"),
        ]

    def coins(self, name: str, **options) -> list[str]:
        """A coin condition's label at every seed of the grid (the seeds are one control)."""
        return [self.label(name, **options, seed=s) for s in self.seeds]

    def main(self) -> list[str]:
        return [
            "dense",
            "token-matched-dense",
            "kvcomm",
            self.bcr,
            *self.coins("coin-chunk"),
            self.label("bcr-chunk", rank="predicted"),
            *self.coins("coin-chunk", rank="predicted"),
            self.label("bcr-single"),
            *self.coins("coin-single"),
            self.cacheblend,
        ]

    def budgets(self) -> list[str]:
        """BCR-chunk at the grid's other budgets, on the same items (its own run)."""
        return [self.label("bcr-chunk", rho) for rho in self.rhos]

    def gate(self) -> list[str]:
        return [condition("kvcomm", g) for g in self.gammas] + [condition("opengate", self.theta)]

    def gate_run(self) -> list[str]:
        """The gate sweep with its own line: Dense and KVComm at the default gate on the same items."""
        return ["dense", "kvcomm", *self.gate()]


def load_claims(folder, benchmark: str = ClaimsGrid.benchmark) -> dict:
    """Everything the verdicts read from a folder `runs.claims_run.run_fresh` (or the committed results) wrote,
    on the grid's `benchmark` (runs of another in the folder are not the grid's)."""
    folder = Path(folder)
    items, calls = load_runs(folder, skip=(GATE, GATE_FRESH), benchmark=benchmark)
    curve = folder / "unit_curve.csv"
    report = folder / "verify.json"
    gates = [folder / name for name in (GATE_FRESH, GATE) if (folder / name / "cell.json").exists()]
    return {
        "items": items,
        "calls": calls,
        "gate": load_runs(gates[0])[0] if gates else None,
        "gate_folder": gates[0].name if gates else None,
        "curve": pd.read_csv(curve) if curve.exists() else None,
        "verify": json.loads(report.read_text()) if report.exists() else None,
    }
