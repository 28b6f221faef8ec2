"""`bcr explore` under a room's load: first-figure seconds and memory per participant.

    python benchmarks/explorer_load.py [--counts 1,4,8] [--modes before,after] [--max-extra-gb 6] [--json]

For each count N and mode, the app is served on the committed inspection (notebook 09's defaults) and
N Chromium pages are opened 3 s apart, as a class arrives (`benchmarks/room.py`): `before` serves it as plain
`bcr explore` does (each page's kernel starts, reads the inspection and draws when the page asks),
`after` as `bcr explore --participants N` does (N kernels preheated, each with the notebook run and
the model loaded for live decoding; the pages are opened once the pool has settled). Reported per
page: seconds from its arrival to its first figure, and from one control moved to the figure after it;
per room: the server's and its kernels' memory (PSS), divided by N. A setting whose memory, estimated
from the smaller rooms measured before it, would pass `--max-extra-gb` is skipped and said so.

A benchmark, not a test: the seconds depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import room  # benchmarks/room.py, beside this script

from bcr_core.lab import app

ARRIVALS_S = 3.0  # participants arrive this far apart (Voila's preheated pool loses pages landing at one instant)


def measure(notebook: Path, count: int, preheat: bool, log: Path) -> dict:
    """One room: the pages' seconds and the server's memory."""
    port = app.free_port()
    with open(log, "w") as out:
        started = time.perf_counter()
        server = app.start(notebook, port, out, participants=count if preheat else None)
        try:
            settled = room.wait_settled(server, count) if preheat else 0.0
            ready = time.perf_counter() - started
            pages = room.open_room(f"http://127.0.0.1:{port}/", count, move=True, stagger_s=ARRIVALS_S)
            memory = room.memory_bytes(server)
            kernels = len(room.kernels(server))
        finally:
            app.stop(server)
    firsts = [p.first_figure_s for p in pages if p.first_figure_s is not None]
    controls = [p.control_s for p in pages if p.control_s is not None]
    return {
        "mode": "after (--participants N)" if preheat else "before",
        "participants": count,
        "pool ready s": round(ready, 1) if preheat else None,
        "pool settle s": round(settled, 1) if preheat else None,
        "first figure s (each)": [round(s, 1) for s in firsts],
        "first figure s (max)": round(max(firsts), 1) if firsts else None,
        "control s (median)": round(statistics.median(controls), 2) if controls else None,
        "kernels": kernels,
        "GB per participant": round(memory / count / 1e9, 2),
        "failures": [p.failure for p in pages if p.failure],
        "console errors": sum(len(p.errors) for p in pages),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,4,8", help="room sizes, comma-separated")
    parser.add_argument("--modes", default="before,after", help="before (no preheating), after (--participants N)")
    parser.add_argument("--max-extra-gb", type=float, default=6.0, help="skip a room estimated to need more")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = sorted(int(c) for c in args.counts.split(","))
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = set(modes) - {"before", "after"}
    if unknown or any(c < 1 for c in counts):
        parser.error(f"--modes takes before and after, --counts integers >= 1; got {args.modes!r}, {args.counts!r}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bcr-load-") as folder:
        notebook = app.explorer_notebook({}, Path(folder)).notebook
        per_participant = {}  # mode -> the most GB per participant measured so far
        for count in counts:  # before and after side by side, smallest rooms first
            for mode in modes:
                estimate = per_participant.get(mode, 0.0) * count
                if estimate > args.max_extra_gb:
                    rows.append({"mode": mode, "participants": count, "skipped": f"~{estimate:.1f} GB estimated"})
                    continue
                row = measure(notebook, count, mode == "after", Path(folder) / f"{mode}-{count}.log")
                per_participant[mode] = max(per_participant.get(mode, 0.0), row["GB per participant"])
                rows.append(row)
                print(json.dumps(row) if args.json else row, flush=True)
    if not args.json:
        print(pd.DataFrame(rows).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
