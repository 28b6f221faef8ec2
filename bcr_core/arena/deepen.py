"""`bcr arena-deepen`: an arena run's searched ceiling, its local searches that stopped at the
evaluation cap continued until they end at a local optimum (or at a new cap), written as a new
arena folder.

The search's cost is almost all of an arena run's, and a search that stopped at its cap is the only
part a larger cap changes, so only those are redone: every item is served again as the run served
it (its records replayed into the stateful server where nothing of it is redone, driven again where
something is), each such call is assembled again and checked against its record (the same ids, and
the searched set's KL measured again within `KL_TOLERANCE`), and its search goes on from the set it
stopped at, with the same moves and votes (`search.local_search`), until no move improves or the
searches' evaluations reach `evals` in all. Everything else is copied as it was.

The new folder is an arena folder of its own (`bcr report arena` reads it): its settings are the
run's with the ceiling labelled `searched:evals=E`, so its tables say which search made them, and
each continued search's record holds `deepened` (the evaluations it added, and the KL it started
from). Items are written as they finish; rerunning the same command resumes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from bcr_core.arena import search
from bcr_core.arena.copies import DenseReference, kl_of_sets
from bcr_core.arena.measures import arena_frame, gap_share, is_searched
from bcr_core.arena.registry import evals_of, make_entry
from bcr_core.arena.run import ArenaCell, KeptReference, Serving
from bcr_core.conditions import parse
from bcr_core.data import benchmarks
from bcr_core.engine.memory import release_freed_memory
from bcr_core.errors import UsageError
from bcr_core.reuse.segments import predicted_rows
from bcr_core.run_folder import CALLS, RunFolder, read_records
from bcr_core.runs.run_writer import RunFiles
from bcr_core.runs.runner import Interrupted

# the searched set measured again gives its recorded KL (same code, same model) to within this share
# plus `KL_FLOOR`: a copy measured in another batch of copies differs in the last bits
KL_TOLERANCE, KL_FLOOR = 1e-2, 1e-6


def capped(call: dict) -> list[str]:
    """The budgets of a call whose search its cap stopped (`search.stopped_at_cap`)."""
    out = []
    for label, found in call.get("arena", {}).get("search", {}).items():
        cap = evals_of(label)
        out += [budget for budget, record in found.items() if search.stopped_at_cap(record, cap)]
    return out


def deepened_cell(source: Path, evals: int) -> ArenaCell:
    """The source run's settings, its ceiling relabelled `searched:evals=E`."""
    cell = ArenaCell.from_record(RunFolder(Path(source)).settings)
    ceilings = [label for label in cell.selectors if is_searched(label)]
    if not ceilings:
        raise UsageError(f"{source} ran no `searched` ceiling, so there is no search to continue")
    if evals <= evals_of(ceilings[0]):
        raise UsageError(f"--evals {evals} is not above the run's cap of {evals_of(ceilings[0])}; give a larger one")
    cap = make_entry(ceilings[0]).options.get("cap", search.CAP)
    new = make_entry(f"searched:cap={cap},evals={evals}").label
    return ArenaCell.from_record(cell.record() | {"selectors": [new if is_searched(s) else s for s in cell.selectors]})


def source_records(source: Path, cell: ArenaCell) -> tuple[dict, dict]:
    """The source run's item records and call records, keyed by item id (calls in their order)."""
    condition = cell.conditions[0]
    items = {r["item_id"]: r for r in RunFolder(Path(source)).items() if r["condition"] == condition}
    calls: dict[str, list[dict]] = {}
    for call in read_records(Path(source) / CALLS):  # as recorded: they are replayed and copied
        calls.setdefault(call["item_id"], []).append(call)
    if len(items) < cell.n:
        raise UsageError(f"{source} holds {len(items)} of its {cell.n} items; finish the arena run first")
    return items, calls


def deepen(bb, source: Path, out: Path, evals: int, progress: bool = True) -> int:
    """Continue the capped searches of the arena run at `source` into `out`; returns the searches
    continued by this process."""
    cell = deepened_cell(source, evals)
    items, calls = source_records(source, cell)
    files = RunFiles(out, cell)
    try:
        serving = Serving(bb, cell)
        condition = serving.condition
        files.settle(bb.arithmetic())
        done, _ = files.finished(list(items), serving.nodes, {condition})
        continued = 0
        listed = benchmarks.load_items(cell.benchmark, cell.n, **cell.extra)
        for item in tqdm(listed, disable=not progress, desc=f"deepen {Path(source).name}"):
            item_id, recorded = str(item["id"]), calls[str(item["id"])]
            if (condition, item_id) in done or not any(capped(c) for c in recorded):
                serving.replay(recorded)
                if (condition, item_id) not in done:
                    files.append(items[item_id], [relabelled(c, cell) for c in recorded])
                continue
            served = zip(serving.serve(item).calls, recorded, strict=True)
            files.append(items[item_id], [continue_call(bb, c, r, serving.reference, cell, evals) for c, r in served])
            continued += sum(len(capped(c)) for c in recorded)
            release_freed_memory()
    except KeyboardInterrupt:
        raise Interrupted(files) from None
    finally:
        files.release()
    return continued


def ceiling_label(cell: ArenaCell) -> str:
    return next(label for label in cell.selectors if is_searched(label))


def relabelled(record: dict, cell: ArenaCell) -> dict:
    """A call record with its ceiling under the new label (a call without the arena as it is)."""
    if "arena" not in record:
        return record
    label, arena = ceiling_label(cell), dict(record["arena"])

    def rename(d: dict) -> dict:
        return {label if is_searched(k) else k: v for k, v in d.items()}

    arena["cost"], arena["search"] = rename(arena["cost"]), rename(arena.get("search", {}))
    arena["entries"] = [e | {"selector": label} if is_searched(e["selector"]) else e for e in arena["entries"]]
    return record | {"arena": arena}


def continue_call(bb, call, record: dict, reference: KeptReference, cell: ArenaCell, evals: int) -> dict:
    """The call's record with each capped search continued, served again as `call`."""
    out = relabelled(record, cell)
    if not capped(record):
        return out
    where = f"item {record['item_id']}, call {record['node']}"
    if call.trace is None or call.merged_ids != record["merged_ids"]:
        raise UsageError(f"{where}: served again, it is not the recorded assembled call (other code or another model?)")
    dense = DenseReference(bb, reference.record(call.dense_ids, cell.max_new_tokens), cell.max_new_tokens)
    evaluate = kl_of_sets(bb, call.trace.assembled, call.merged_ids, dense, measured := {})
    chunk = parse(cell.conditions[0]).option("chunk")
    label, arena = ceiling_label(cell), out["arena"]
    predicted = set(predicted_rows(record["segment_map"], arena["cached_rows"]))
    for budget in capped(record):
        started = time.perf_counter()
        entries = [e for e in arena["entries"] if e["budget"] == budget]
        ceiling = next(e for e in entries if is_searched(e["selector"]))
        start = tuple(search.rows_of(ceiling["runs"]))
        again = evaluate([start])[0]
        if abs(again - ceiling["kl"]) > KL_TOLERANCE * abs(ceiling["kl"]) + KL_FLOOR:
            raise UsageError(
                f"{where}: the searched set at budget {budget} measures KL {again:.6g} again, recorded "
                f"{ceiling['kl']:.6g}; these records were made by other code or another model"
            )
        others = [e for e in entries if e is not ceiling and e["rows"] == len(start)]
        seeds = {tuple(search.rows_of(e["runs"])): e["kl"] for e in others}
        votes = search.chunk_votes(seeds, arena["cached_rows"], chunk)
        seen = seeds | {start: again}
        record_of = arena["search"][label][budget]
        best, spent, local = search.local_search(
            evaluate, seen, start, arena["cached_rows"], chunk, votes, evals - record_of["evaluations"]
        )
        seconds = time.perf_counter() - started
        arena["search"][label][budget] = record_of | {
            "evaluations": record_of["evaluations"] + spent,
            "local_optimum": local,
            "from": record_of["from"] if best == start else "search",
            "seconds": record_of["seconds"] + seconds,
            "deepened": {"evaluations": spent, "kl_before": ceiling["kl"], "seconds": seconds},
        }
        cost = arena["cost"][label]
        arena["cost"][label] = {"passes": cost["passes"] + spent, "ms": cost["ms"] + 1000 * seconds}
        if best != start:
            found = measured[best] | {"rows_wasted": sum(j not in predicted for j in best), "runs": search.runs(best)}
            arena["entries"] = [e | found if e is ceiling else e for e in arena["entries"]]
    return out


def continued(calls: list[dict]) -> pd.DataFrame:
    """Per budget, the searches a deepened folder continued: how many, the share that found a set
    leaving less KL, the share now ended at a local optimum, the evaluations added per search, and
    the mean KL of the searched sets before and after (over those searches)."""
    rows = []
    for call in calls:
        for records in call.get("arena", {}).get("search", {}).values():
            for budget, r in records.items():
                if "deepened" in r:
                    after = next(
                        e["kl"]
                        for e in call["arena"]["entries"]
                        if is_searched(e["selector"]) and e["budget"] == budget
                    )
                    before = r["deepened"]["kl_before"]
                    rows.append(
                        {"budget": budget, "before": before, "after": after, "better": after < before}
                        | {"local_optimum": r["local_optimum"], "evaluations": r["deepened"]["evaluations"]}
                    )
    if not rows:
        return pd.DataFrame(columns=["budget", "searches"])
    return (
        pd.DataFrame(rows)
        .groupby("budget", sort=False)
        .agg(
            searches=("before", "size"),
            found_better=("better", "mean"),
            local_optimum=("local_optimum", "mean"),
            evaluations=("evaluations", "mean"),
            kl_before=("before", "mean"),
            kl_after=("after", "mean"),
        )
        .reset_index()
    )


def shares_before_after(source: Path, out: Path) -> pd.DataFrame:
    """Each selector's share of the ceiling's gain at BCR-chunk's count, against the run's ceiling
    and against the deepened one, on the items the deepened folder holds."""
    deeper = RunFolder(Path(out)).calls()
    held = {c["item_id"] for c in deeper}
    first = [c for c in RunFolder(Path(source)).calls() if c["item_id"] in held]

    def table(calls: list[dict]) -> pd.DataFrame:
        return gap_share(arena_frame(calls))[1].set_index("selector")[["gap_share", "lo", "hi"]]

    before, after = table(first), table(deeper)
    before.index, after.index = before.index.map(plain), after.index.map(plain)
    return before.add_suffix("_before").join(after.add_suffix("_after")).reset_index()


def plain(label: str) -> str:
    """A ceiling's label without its options (`searched:evals=1000` -> `searched`), so the two runs' rows meet."""
    return "searched" if is_searched(label) else label
