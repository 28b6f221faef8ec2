"""Lab processes sharing a machine's cores: each one's wall time alone and side by side, for two
checkouts of the lab (before and after a change to its thread policy), scenario by scenario in one
run, the two checkouts alternated.

    python benchmarks/threads.py --before ../wt-before [--after .] [--workloads verify,run,notebook]
                                 [--scenarios alone,beside] [--repeat K]
                                 [--limit S] [--out threads.csv]

Each checkout runs on this Python (its `bcr_core` first on PYTHONPATH), with the environment this
script was started with, less OMP_WAIT_POLICY and GOMP_SPINCOUNT: what a user's shell gives every
process. Workloads:
`bcr verify` (the embedded model's checks, ~11 s alone), a short `bcr run` (three conditions, four
synthetic items) and the quickstart notebook as `make demo` runs it (`bcr notebooks`, through
papermill and the `bcr-lab` kernel). A "beside" scenario starts a long `bcr run` first, times the
foreground workload, then stops the background one. Each row's ratio is the wall time over the same
workload's one-thread time alone in the same checkout, the yardstick of the lab's targets: four
processes on two cores within 3x, two within 2.2x, and none alone slower than before.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

RUN = ["run", "--benchmark", "synthetic", "--agents", "3", "--conditions", "dense,kvcomm,bcr-chunk"]
WORKLOADS = {
    "verify": ["verify"],
    "run": [*RUN, "--n", "4", "--max-new-tokens", "32"],
    "notebook": ["notebooks", "--only", "00_quickstart"],
}
BACKGROUND = [*RUN, "--n", "10000", "--max-new-tokens", "64"]

# (scenario, foreground workload, how many side by side, OMP_NUM_THREADS of each, background threads)
SCENARIOS = [
    ("alone, 1 thread", "verify", 1, 1, None),
    ("alone", "verify", 1, None, None),
    ("two side by side", "verify", 2, None, None),
    ("four side by side", "verify", 4, None, None),
    ("alone, 1 thread", "run", 1, 1, None),
    ("alone", "run", 1, None, None),
    ("two side by side", "run", 2, None, None),
    ("alone, 1 thread", "notebook", 1, 1, None),
    ("alone", "notebook", 1, None, None),
    ("beside a 1-thread bcr run", "notebook", 1, None, 1),
    ("beside a 2-thread bcr run", "notebook", 1, None, 2),
]


def command(root: Path, args: list[str], scratch: Path, threads: int | None) -> tuple[list[str], dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(root)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    out = ["--out", str(scratch)] if args[0] in ("run", "notebooks") else []
    main = "import sys; from bcr_core.cli import main; sys.exit(main())"
    return [sys.executable, "-P", "-c", main, *args, *out], env  # -P: PYTHONPATH decides, not the cwd


def start(root: Path, args: list[str], scratch: Path, threads: int | None, stderr=subprocess.PIPE) -> subprocess.Popen:
    """A lab command in its own session, so that stopping it stops its kernels too."""
    cmd, env = command(root, args, scratch, threads)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)


def side_by_side(root: Path, workload: str, copies: int, threads, background, limit: float) -> list[float]:
    """Wall seconds of each of `copies` foreground processes started together; NaN for one still
    running `limit` seconds after the start (it is stopped)."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        behind = None
        if background is not None:
            behind = start(root, BACKGROUND, scratch / "background", background, stderr=subprocess.DEVNULL)
            time.sleep(15)  # past its model load: decoding when the foreground starts
        started = time.perf_counter()
        procs = [start(root, WORKLOADS[workload], scratch / f"fg{k}", threads) for k in range(copies)]
        seconds = []
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=max(0.0, limit - (time.perf_counter() - started)))
            except subprocess.TimeoutExpired:  # its kernel too: the whole session
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                seconds.append(float("nan"))
                continue
            if proc.returncode:
                raise SystemExit(f"{workload} failed in {root}: {err.decode()[-2000:]}")
            seconds.append(time.perf_counter() - started)
        if behind is not None:
            os.killpg(behind.pid, signal.SIGKILL)
            behind.wait()
    return seconds


def measure(checkouts: dict[str, Path], workloads, scenarios, repeat: int = 1, limit: float = 3600) -> pd.DataFrame:
    """Each scenario's slowest process, per checkout: the median over `repeat` runs, the checkouts
    alternated within each; NaN where one ran past `limit` seconds."""
    rows = []
    for scenario, workload, copies, threads, background in SCENARIOS:
        if workload not in workloads or not any(s in scenario for s in scenarios):
            continue
        for _ in range(repeat):
            for version, root in checkouts.items():
                seconds = side_by_side(root, workload, copies, threads, background, limit)
                rows.append(dict(workload=workload, scenario=scenario, version=version, seconds=max(seconds)))
                print(f"{workload:9} {scenario:28} {version:7} {' '.join(f'{s:7.1f}' for s in seconds)} s", flush=True)
    table = pd.DataFrame(rows).groupby(["workload", "scenario", "version"], sort=False).seconds.median().reset_index()
    one_thread = table[table.scenario == "alone, 1 thread"].set_index(["workload", "version"]).seconds
    table["x one thread alone"] = [
        s / one_thread.get((w, v), float("nan")) for s, w, v in zip(table.seconds, table.workload, table.version)
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the lab before the change")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--out", type=Path, help="also write the table here as CSV")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS))
    parser.add_argument("--scenarios", default="", help="comma-separated: only scenarios whose name contains one")
    parser.add_argument("--versions", default="before,after", help="which checkouts run: before, after or both")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each scenario (the median is kept)")
    parser.add_argument("--limit", type=float, default=3600, help="seconds after which a scenario is stopped (NaN)")
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    checkouts = {version: root for version, root in checkouts.items() if version in args.versions.split(",")}
    table = measure(checkouts, args.workloads.split(","), args.scenarios.split(","), args.repeat, args.limit)
    wide = table.pivot_table(
        index=["workload", "scenario"], columns="version", values=["seconds", "x one thread alone"], sort=False
    )
    print(wide.round(2).to_string())
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
