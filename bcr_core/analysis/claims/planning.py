"""Sizing a confirmatory run from a pilot, before it runs (`bcr plan`).

A pilot that leaves a claim undecided at its observed effect is not extended until p drops (optional
stopping); the next run is a confirmation: sized before it starts, on items the pilot never read, read as
its own family. For each claim the plan names, the items its own test needs for the power asked are found
by simulation: the pilot's per-item values (the item as the unit: a paired binary row's per-item difference
in {-1, 0, +1}, a sign-flip row's per-item difference) are resampled to n items, the claim's own test run
on each resample, and the power is the share of resamples it rejects at the planning level. That level is
Holm's strictest threshold over the planned family, alpha / k, so each claim keeps its power whatever the
others do. Where the paper states the claim's effect, the items at the paper's effect are found too (the
pilot's discordance kept, its two directions moved apart to the paper's difference), and the run is sized
by the larger of the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bcr_core.analysis.claims.confirmation import items_read
from bcr_core.analysis.statistics.binary import mcnemar_exact
from bcr_core.analysis.statistics.inference import ALPHA
from bcr_core.errors import UsageError
from bcr_core.run_folder import RunFolder, run_folders

SIMULATIONS = 2000  # resamples per power estimate: its Monte-Carlo error is at most 0.011 (one sd)
POWER = 0.8
BATCH = 8  # the confirmation's decoding batch: a speed setting only, a prompt's tokens do not depend on it
SEEDS_TRIED = 1000  # item seeds tried for items no committed folder read
# The paper's effects, in points of accuracy, for the claims it states one for (Dense minus the condition).
PAPER_EFFECTS = {
    "reuse costs accuracy": (0.137, "Table 3: Dense vs KVComm on GSM8K with roles pinned, 13.7 points"),
    "the approximation costs accuracy": (0.076, "Table 5(a): the approximation term on MMLU, 7.6 points"),
}


def mcnemar_p(differences: np.ndarray) -> float:
    """Exact two-sided McNemar p of per-item paired differences in {-1, 0, +1}."""
    return mcnemar_exact(int((differences > 0).sum()), int((differences < 0).sum()))


def simulated_power(
    per_item, n: int, test: Callable[[np.ndarray], float], alpha: float, simulations: int = SIMULATIONS, seed: int = 0
) -> float:
    """The share of `simulations` resamples of n items (drawn with replacement from `per_item`) that `test`
    rejects at `alpha`."""
    values = np.asarray(per_item, float)
    rng = np.random.default_rng(seed)
    rejected = sum(test(values[rng.integers(0, len(values), n)]) < alpha for _ in range(simulations))
    return rejected / simulations


def items_needed(
    per_item,
    test: Callable[[np.ndarray], float],
    alpha: float,
    power: float = POWER,
    max_items: int = 5000,
    simulations: int = SIMULATIONS,
    seed: int = 0,
) -> int | None:
    """The fewest items at which the simulated power reaches `power` (searched by doubling, then bisection,
    every estimate from the same seed), or None if `max_items` do not reach it."""
    if simulated_power(per_item, max_items, test, alpha, simulations, seed) < power:
        return None
    lo, hi = 1, 8
    while hi < max_items and simulated_power(per_item, hi, test, alpha, simulations, seed) < power:
        lo, hi = hi, min(2 * hi, max_items)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if simulated_power(per_item, mid, test, alpha, simulations, seed) >= power else (mid, hi)
    return hi


def at_effect(differences, effect: float) -> np.ndarray | None:
    """Per-item binary differences with the pilot's discordance rate and their mean moved to `effect`
    (None where the pilot's items disagree less often than the effect needs)."""
    d = np.asarray(differences, float)
    discordant = float(np.mean(d != 0))
    if discordant < abs(effect) or len(d) == 0:
        return None
    n = 1000
    up = round(n * (discordant + effect) / 2)
    down = round(n * discordant) - up
    return np.array([1.0] * up + [-1.0] * down + [0.0] * (n - up - down))


@dataclass
class Sizing:
    claim: str
    test: str
    observed: float  # the pilot's effect (points for a binary row)
    items_at_observed: int | None
    paper_effect: float | None
    items_at_paper: int | None
    items: int | None  # what sizes the run: the larger of the two
    sized_by: str


def size_claim(claim: str, per_item, alpha: float, power: float, max_items: int, seed: int = 0) -> Sizing:
    """The items `claim`'s own test (`SIZED`) needs at the pilot's effect and, where the paper states one, at
    the paper's."""
    d = np.asarray(per_item, float)
    sized = SIZED[claim]
    observed = items_needed(d, sized.test, alpha, power, max_items, SIMULATIONS, seed)
    paper, why = PAPER_EFFECTS.get(claim, (None, ""))
    moved = at_effect(d, paper) if paper is not None else None
    at_paper = (
        items_needed(moved, sized.test, alpha, power, max_items, SIMULATIONS, seed) if moved is not None else None
    )
    sizes = [(observed, "the pilot's effect"), (at_paper, f"the paper's effect ({why})")]
    known = [(n, by) for n, by in sizes if n is not None]
    items, by = max(known) if known else (None, f"neither reaches {power:.0%} power within {max_items} items")
    return Sizing(claim, sized.test_name, float(d.mean()), observed, paper, at_paper, items, by)


# ------------------------------------------------------------------------------- the plan a pilot gives
@dataclass(frozen=True)
class Sizable:
    """A claim `bcr plan` sizes: the conditions its test compares and that test, the one its family reads it by
    (`claims.synthetic`), run on each resample of the pilot's per-item differences."""

    conditions: tuple[str, ...]
    test_name: str
    test: Callable[[np.ndarray], float]


SIZED = {
    "reuse costs accuracy": Sizable(("dense", "kvcomm"), "exact McNemar", mcnemar_p),
    "the approximation costs accuracy": Sizable(("token-matched-dense", "kvcomm"), "exact McNemar", mcnemar_p),
    "reuse pays a tokenization tax": Sizable(("dense", "token-matched-dense"), "exact McNemar", mcnemar_p),
}


def planned_claims(verdicts, claims: list[str] | None, max_items: int) -> list[str]:
    """The claims named, or every undecided row `bcr plan` can size whose post-hoc items fit `max_items`."""
    if claims:
        unknown = [c for c in claims if c not in SIZED]
        if unknown:
            raise UsageError(f"bcr plan sizes {', '.join(repr(c) for c in SIZED)}; not {unknown[0]!r}")
        return claims
    rows = verdicts[(verdicts["verdict"] == "undecided") & verdicts["claim"].isin(list(SIZED))]
    fits = rows["items_needed_post_hoc"].notna() & (rows["items_needed_post_hoc"] <= max_items)
    return list(rows.loc[fits, "claim"])


def find_pilot(folder: Path) -> RunFolder:
    """The pilot's main run: the run of a claims folder that holds every condition a sized claim reads."""
    needed = {c for sized in SIZED.values() for c in sized.conditions}
    for run in run_folders(folder):
        if needed <= set(run.settings["conditions"]):
            return run
    raise UsageError(
        f"{folder}: no run in it holds {', '.join(sorted(needed))}; bcr plan reads a claims folder (results/claims)"
    )


def pilot_settings(pilot: RunFolder) -> dict:
    """The settings a confirmation keeps from its pilot (its dtype, prompt and stop rule included)."""
    found = pilot.settings
    return {
        "model": found.get("model", "default"),
        "dtype": found.get("dtype", "float32"),
        "benchmark": found["benchmark"],
        "agents": found["n_agents"],
        "max_new_tokens": found["max_new_tokens"],
        "fidelity": bool(found.get("fidelity", False)),
        "prompt": found.get("prompt", "standard"),
        "stop": found.get("stop", "eos"),
        "batch": BATCH,
    }


def fresh_item_seed(settings: dict, n: int, root: Path) -> int:
    """The smallest item seed (from 1) whose n items no committed folder under `root` of the same model and
    benchmark read, compared as item sets (`confirmation.items_read`), confirmations included."""
    key = (settings["model"], settings["benchmark"])
    read = frozenset().union(
        *(ids for source, ids in map(items_read, (r.settings for r in run_folders(root))) if source == key)
    )
    for seed in range(1, SEEDS_TRIED + 1):
        draw = {"model": settings["model"], "benchmark": settings["benchmark"], "n": n, "extra": {"seed": seed}}
        if not items_read(draw)[1] & read:
            return seed
    raise UsageError(f"no item seed of 1-{SEEDS_TRIED} draws {n} {settings['benchmark']} items no committed run read")


def plan(pilot: Path, verdicts, claims: list[str] | None, power: float, max_items: int, root: Path) -> str:
    """The confirmation's grid file from a pilot claims folder and its family's verdicts: the claims named (or
    every undecided sizable one that fits), each sized at Holm's strictest level for `power`, on items no
    folder under `root` read, with the settings of the pilot's main run (`find_pilot`)."""
    planned = planned_claims(verdicts, claims, max_items)
    if not planned:
        raise UsageError(f"{pilot}: no undecided claim bcr plan sizes fits --max-items {max_items}")
    alpha = ALPHA / len(planned)
    per_item = verdicts.attrs["per_item"]
    sizings = [size_claim(claim, per_item[claim].to_numpy(float), alpha, power, max_items) for claim in planned]
    unsized = [s.claim for s in sizings if s.items is None]
    if unsized:
        raise UsageError(f"{unsized[0]!r}: {power:.0%} power needs more than --max-items {max_items} items")
    settings = pilot_settings(find_pilot(pilot))
    seed = fresh_item_seed(settings, max(s.items for s in sizings), root)
    return grid_text(sizings, str(pilot), settings, seed, alpha, power)


def grid_text(sizings: list[Sizing], pilot: str, settings: dict, item_seed: int, alpha: float, power: float) -> str:
    """The confirmation's grid file: one cell of the conditions the planned claims read, on `n` fresh items,
    with the pilot's settings (dtype included), and a header stating claims, sizes and the rule."""
    n = max(s.items for s in sizings)
    conditions = list(dict.fromkeys(c for s in sizings for c in SIZED[s.claim].conditions))
    lines = [
        f"# A confirmation of {comment_text(pilot)}, planned by `bcr plan` before it runs: commit this file, "
        "then run it.",
        f"# Claims (one family, Holm over {len(sizings)}; each sized at alpha / {len(sizings)} = {alpha:g} "
        f"for {power:.0%} power by simulating its own test on the pilot's items resampled):",
    ]
    for s in sizings:
        paper = "" if s.paper_effect is None else f", {s.items_at_paper} at the paper's {100 * s.paper_effect:g} pts"
        lines.append(
            f"#   {s.claim} ({s.test}): {s.items_at_observed} items at the pilot's {100 * s.observed:+.1f} pts"
            f"{paper}; sized by {s.sized_by}"
        )
    lines += [
        f"# The run: {n} items of item seed {item_seed}, which no committed folder of this model used; read as",
        "# its own family on exactly these items (fewer: incomplete, never a verdict; more: the first n).",
        "",
        "[defaults]",
    ]
    for key, value in settings.items():
        lines.append(f"{key} = {toml_value(value)}")
    lines += [f"item_seed = {item_seed}", f"n = {n}", f"confirms = {toml_value([s.claim for s in sizings])}"]
    lines += ["", "[cells.confirm]", f"conditions = {toml_value(conditions)}"]
    return "\n".join(lines) + "\n"


def toml_value(value) -> str:
    """A TOML literal of a bool, number, string or list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + "".join(map(toml_char, value)) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def comment_text(text: str) -> str:
    """`text` inside a TOML comment: as it is, or as an escaped string where it holds a control character (a
    newline would end the comment)."""
    return toml_value(text) if any(ch < " " and ch != "\t" or ch == "\x7f" for ch in text) else text


def toml_char(ch: str) -> str:
    """One character inside a TOML basic string: quote, backslash and control characters escaped."""
    if ch in TOML_ESCAPES:
        return TOML_ESCAPES[ch]
    return f"\\u{ord(ch):04x}" if ch < " " or ch == "\x7f" else ch
