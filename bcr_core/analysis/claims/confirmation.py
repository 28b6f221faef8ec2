"""A confirmation read as its own family: the claims a plan named (`bcr plan`), Holm over them alone, on exactly
the n items planned, on items the pilot never read.

A run folder is a confirmation when its `cell.json` names the claims it confirms (`confirms`). Its verdicts
never mix with the pilot's: the pilot's claims folder leaves it out of its own family (`is_confirmation`),
and `bcr report claims` reads it beside the pilot. The rules, fixed with the plan:
- every planned claim is tested, and only those, by the same test as in the pilot's family;
- a folder holding fewer than the planned n items of any condition it reads is "incomplete": no test, no
  verdict (a confirmation is read once, at its planned size; reading it as it grows is optional stopping);
- one holding more is read on the first n (in item order);
- its items must be fresh: a folder that reads any item a committed run of the same model and benchmark
  read, that run not a confirmation, is refused (`check_fresh`; the items compared, not their draws).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bcr_core.analysis.claims import synthetic
from bcr_core.analysis.claims.protocol import Verdict, family, verdict_table
from bcr_core.errors import UsageError
from bcr_core.run_folder import RunFolder, run_folders

INCOMPLETE = "incomplete"


def is_confirmation(run: RunFolder) -> bool:
    return bool(run.settings.get("confirms"))


def items_read(settings: dict) -> tuple[tuple, frozenset[str]]:
    """(model and benchmark, the ids of the items the folder's settings draw): what decides whether two
    folders read the same items, whatever their seeds or first items say (a confirmation from item 100 reads
    items 100-139 of a pilot of items 0-139)."""
    from bcr_core.data.benchmarks import load_items

    draw = dict(settings.get("extra") or {})
    first = int(draw.pop("first", 0))
    ids = frozenset(str(item["id"]) for item in load_items(settings["benchmark"], settings.get("n"), first, **draw))
    return (settings.get("model", "default"), settings.get("benchmark")), ids


def check_fresh(settings: dict, root: Path, where: str) -> None:
    """Refuse a confirmation any of whose items a committed non-confirmation run under `root` read, naming it."""
    source, mine = items_read(settings)
    for run in run_folders(root):
        if is_confirmation(run) or run.settings.get("benchmark") != settings.get("benchmark"):
            continue
        theirs_from, theirs = items_read(run.settings)
        shared = mine & theirs if theirs_from == source else frozenset()
        if shared:
            seed = (settings.get("extra") or {}).get("seed", 0)
            raise UsageError(
                f"{where}: a confirmation on item seed {seed} reads {len(shared)} of its {len(mine)} items that "
                f"{run.path} (a pilot) read: a confirmation runs on items no committed run of the model read "
                "(`bcr plan` picks them)"
            )


def confirmation_verdicts(run: RunFolder, root: Path | None = None, seed: int = 0) -> pd.DataFrame:
    """The planned claims' family on the folder's first n items, or every planned claim "incomplete"."""
    planned, n = list(run.settings["confirms"]), int(run.settings["n"])
    if root is not None:
        check_fresh(run.settings, root, str(run.path))
    items, calls = pd.DataFrame(run.items()), pd.DataFrame(run.calls())
    held = items.groupby("condition")["index"].apply(lambda index: int((index < n).sum()))
    if held.min() < n:
        short = ", ".join(f"{condition} {count}" for condition, count in held.items() if count < n)
        return incomplete(planned, f"holds fewer than the {n} items planned ({short})")
    first = items[items["index"] < n]
    calls = calls[calls["item_id"].isin(set(first["item_id"]))]
    conditions = list(dict.fromkeys(first["condition"]))
    rows = synthetic.cost_claims(
        first,
        calls,
        conditions,
        "correct",
        dense="dense",
        kvcomm="kvcomm",
        matched="token-matched-dense",
        bcr="bcr-chunk",
    )
    found = {row.claim: row for row in rows}
    missing = [c for c in planned if c not in found]
    if missing:
        raise UsageError(f"{run.path}: cannot test the planned claim {missing[0]!r} on its conditions {conditions}")
    return family([found[c] for c in planned], seed)


def incomplete(planned: list[str], why: str) -> pd.DataFrame:
    rows = [Verdict(c, "", "accuracy", "the planned test, once the planned items are in", INCOMPLETE) for c in planned]
    for row in rows:
        row.evidence = why
    return verdict_table(rows)


def confirmations(root: Path) -> list[RunFolder]:
    return [run for run in run_folders(root) if is_confirmation(run)]
