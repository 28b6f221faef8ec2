"""One arena run split across processes, and joined back.

The arena's measures of one item depend on nothing but that item's calls, but the serving run they
read does: KVComm's anchor pool is built in item order. So a lane (`bcr arena --shard K/M`) serves
every item, as one process would, and runs the arena only on its share, the items whose index is K
mod M. `merge` joins M lanes into the folder one process writes: each item's records taken from the
lane that measured it, once every lane that served the item is seen to have served it alike (the
one assumption a split rests on; a lane whose serving departs is refused, naming the record).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.paths import write_text_whole
from bcr_core.run_folder import read_jsonl, read_settings, rewrite_jsonl

TIMINGS = ("ttft_s", "total_s", "assembly_s", "ttft_s_mean")  # seconds: they differ between processes
MEASURED = "arena"  # the field only the measuring lane holds
FLOAT_TOLERANCE = 1e-6  # relative; lanes on one machine agree exactly, this only absorbs a float's last bits


def parse_shard(text: str) -> tuple[int, int] | None:
    """`"K/M"` as (K, M) with 0 <= K < M; `""` (no split) as None."""
    if text == "":
        return None
    try:
        k, m = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard is K/M (this lane's share of M lanes, K from 0), got {text!r}") from None
    if not 0 <= k < m:
        raise UsageError(f"--shard {text}: K must be in 0..M-1 (M lanes numbered from 0)")
    return k, m


def owns(shard: str, index: int) -> bool:
    """Whether the lane `shard` measures the item at `index` (every item without a split)."""
    split = parse_shard(shard)
    return split is None or index % split[1] == split[0]


def merge(lanes: list[Path], out: Path) -> int:
    """Join the lanes of one split run into `out`, as one process would have written it: the items
    every lane's share reaches without a gap (a lane still running leaves the rest for a later
    merge). Returns the number of items written."""
    out = Path(out)
    if any(out.resolve() == Path(lane).resolve() for lane in lanes):
        raise UsageError(f"--out {out} is one of the lanes; merge into another folder")
    settings = [lane_settings(Path(lane)) for lane in lanes]
    shards = [parse_shard(s.pop("shard", "")) for s in settings]
    check_lanes(lanes, settings, shards)
    records = [lane_records(Path(lane)) for lane in lanes]
    owner = {k: number for number, (k, _) in enumerate(shards)}
    items, calls = [], []
    for index in range(settings[0]["n"]):
        mine = records[owner[index % len(lanes)]].get(index)
        if mine is None:
            break
        for lane, theirs in zip(lanes, records):
            if index in theirs:
                check_alike(lane, index, theirs[index], mine)
        items.append(mine[0])
        calls.extend(mine[1])
    write_text_whole(out / "cell.json", json.dumps(settings[0], indent=2))
    rewrite_jsonl(out / "calls.jsonl", calls)
    rewrite_jsonl(out / "items.jsonl", items)
    return len(items)


def lane_settings(lane: Path) -> dict:
    if not (lane / "cell.json").exists():
        raise UsageError(f"{lane} holds no cell.json: not a lane of `bcr arena --shard`")
    return read_settings(lane / "cell.json")


def check_lanes(lanes: list[Path], settings: list[dict], shards: list) -> None:
    """The lanes are the M shares of one run: the same settings, shards 0..M-1 of M, each once."""
    for lane, found in zip(lanes[1:], settings[1:]):
        if found != settings[0]:
            raise UsageError(f"{lane} is a lane of another run than {lanes[0]} (their cell.json differ)")
    wanted = [(k, len(lanes)) for k in range(len(lanes))]
    if sorted(s for s in shards if s is not None) != wanted:
        named = ", ".join("none" if s is None else f"{s[0]}/{s[1]}" for s in shards)
        raise UsageError(f"{len(lanes)} lanes need shards 0/{len(lanes)} to {len(lanes) - 1}/{len(lanes)}, got {named}")


def lane_records(lane: Path) -> dict[int, tuple[dict, list[dict]]]:
    """The lane's finished items by index, each with its calls in order (calls of an item whose item
    line a crash kept from being written are left out, as resuming leaves them)."""
    calls: dict[str, list[dict]] = {}
    for call in read_jsonl(lane / "calls.jsonl"):
        calls.setdefault(call["item_id"], []).append(call)
    return {item["index"]: (item, calls.get(item["item_id"], [])) for item in read_jsonl(lane / "items.jsonl")}


def check_alike(lane: Path, index: int, theirs: tuple, mine: tuple) -> None:
    """The lane served item `index` as its measuring lane did: every field but timings and the
    arena's measures alike (floats to `FLOAT_TOLERANCE`)."""
    served = lambda record: {k: v for k, v in record.items() if k not in TIMINGS and k != MEASURED}
    pairs = [("its item record", theirs[0], mine[0])]
    if len(theirs[1]) != len(mine[1]):
        pairs.append(("its calls", len(theirs[1]), len(mine[1])))
    pairs += [(f"call {a.get('node')}", a, b) for a, b in zip(theirs[1], mine[1])]
    for what, a, b in pairs:
        where = first_difference(served(a) if isinstance(a, dict) else a, served(b) if isinstance(b, dict) else b)
        if where is not None:
            raise UsageError(
                f"{lane}: item {index} ({what}) was served otherwise than by the lane that measured it, at "
                f"{where}; the lanes' runs differ, so they cannot be merged (rerun them on one machine and code)"
            )


def first_difference(a, b, at: str = "") -> str | None:
    """The path of the first place two records differ, or None (floats to `FLOAT_TOLERANCE`)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{at or '.'} (fields {sorted(a.keys() ^ b.keys())})"
        children = [(a[k], b[k], f"{at}.{k}") for k in a]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{at} ({len(a)} entries, not {len(b)})"
        children = [(x, y, f"{at}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, float) and isinstance(b, float):
        return None if math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=1e-12) else f"{at} ({a!r} != {b!r})"
    else:
        return None if type(a) is type(b) and a == b else f"{at} ({a!r} != {b!r})"
    return next((d for x, y, where in children if (d := first_difference(x, y, where)) is not None), None)
