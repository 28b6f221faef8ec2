"""The `bcr` command line (also `python -m bcr_core`).

Every subcommand takes `--model` (default: the embedded SmolLM2-135M-Instruct) and `--json`
(exactly one JSON document on stdout; progress and logs go to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bcr_core import paper
from bcr_core.engine.models import DEFAULT_MODEL
from bcr_core.errors import UsageError
from bcr_core.paths import RESULTS


def load_backbone(model: str):
    """Imported when a command needs the model, so `bcr --help` does not wait for torch."""
    from bcr_core.engine.loading import load_backbone

    return load_backbone(model)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="'default' (embedded SmolLM2-135M-Instruct), 'gemma-3-270m' (Gemma 3 270M base, fetched on first use; "
        "Gemma terms apply), a local HF directory, or a hub id",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")


def print_table(table, args, digits: int | None = None) -> int:
    """A result table as JSON records (--json) or as aligned text; returns the exit code 0."""
    import pandas as pd

    if args.json:
        print(table.to_json(orient="records", indent=2))
    else:
        fmt = None if digits is None else (lambda x: f"{x:.{digits}f}")
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(table.to_string(index=False, float_format=fmt))
    return 0


def cmd_verify(args) -> int:
    from bcr_core.probes.verify import verify

    report = verify(load_backbone(args.model), prompt=args.prompt)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"model: {report.model}")
        print(
            f"full repair (rho = 1) token-identical to Dense over {report.tokens_compared} tokens: "
            f"{report.full_repair_token_identical}"
        )
        print(f"  unrepaired (foreign-prefix) cache identical to Dense: {report.unrepaired_token_identical}")
        print(f"  max |repaired - dense| over all layers: {report.repair_max_abs_err:.2e}")
        print(
            f"re-rotation max abs error: {report.rerotation_max_abs_err:.2e} "
            f"(tolerance {report.rerotation_tolerance:.0e})"
        )
        print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


def cmd_demo(args) -> int:
    import pandas as pd

    from bcr_core.probes.demo import demo

    if args.new_tokens < 1:
        raise UsageError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    table = demo(load_backbone(args.model), prompt=args.prompt, new_tokens=args.new_tokens)
    with pd.option_context("display.max_colwidth", 70):
        return print_table(table, args)


def cmd_run(args) -> int:
    from bcr_core.analysis.summary import summarize
    from bcr_core.runs.cell import make_cell
    from bcr_core.runs.conditions import split_conditions
    from bcr_core.runs.runner import run_cell

    cell = make_cell(
        args.benchmark,
        args.agents,
        split_conditions(args.conditions),
        args.n,
        args.max_new_tokens,
        args.pinned,
        args.model,
        args.reference,
        split_list(args.seeds, int, "--seeds") if args.seeds is not None else None,
        args.item_seed,
        args.fidelity,
    )
    items = run_cell(load_backbone(args.model), cell, args.out, progress=True, batch=args.batch)
    table = summarize(items, reference=args.reference)
    (args.out / "summary.csv").write_text(table.to_csv(index=False))
    return print_table(table, args, digits=3)


def cmd_arena(args) -> int:
    from bcr_core.arena.measures import arena_frame, selector_table
    from bcr_core.arena.run import make_arena_cell, run_arena
    from bcr_core.runs.run_files import read_jsonl

    cell = make_arena_cell(
        args.n,
        args.agents,
        args.max_new_tokens,
        args.rho,
        args.chunk,
        split_list(args.rhos, float, "--rhos"),
        args.selectors,
        split_list(args.seeds, int, "--seeds") if args.seeds is not None else None,
        args.benchmark,
        args.item_seed,
        args.model,
        args.gamma,
    )
    run_arena(load_backbone(args.model), cell, args.out, progress=True)
    calls = read_jsonl(args.out / "calls.jsonl")
    if not any(c.get("arena") for c in calls):
        print(
            f"bcr arena: no call of these {args.n} items was served from an assembled cache (KVComm's anchor pool "
            "warms up over the first items), so no selector was compared; run more items (--n)",
            file=sys.stderr,
        )
        if args.json:
            print("[]")
        return 0
    table = selector_table(arena_frame(calls))
    return print_table(table, args, digits=4)


def cmd_grid(args) -> int:
    from bcr_core.runs.grid import run_grid
    from bcr_core.runs.grid_cells import combined_table, read_grid

    grid = read_grid(args.file, model=args.model)
    failed = run_grid(grid, args.out, ray=args.ray, quiet=args.json)
    table = combined_table(grid, args.out)
    (args.out / "grid.csv").write_text(table.to_csv(index=False))
    print_table(table, args, digits=3)
    for name in failed:
        print(f"bcr grid: cell {name} did not finish; run the same command again to resume it", file=sys.stderr)
    return 1 if failed else 0


def cmd_unit_curve(args) -> int:
    from bcr_core.probes.unit_curve import (
        UnitCurveConfig,
        default_texts,
        read_prompts,
        summarize_curve,
        unit_curve,
    )

    if args.seeds < 1:
        raise UsageError(f"--seeds is how many random selections to compare with, at least 1; got {args.seeds}")
    config = UnitCurveConfig(
        args.segment_tokens,
        args.budget,
        tuple(split_list(args.units, int, "--units")),
        tuple(args.seed + i for i in range(args.seeds)),
    )
    texts = read_prompts(args.prompts) if args.prompts else default_texts()
    table = summarize_curve(
        unit_curve(load_backbone(args.model), texts, config, progress=True)
    )  # tqdm writes to stderr
    return print_table(table, args, digits=4)


def cmd_ttft(args) -> int:
    from bcr_core.probes.latency import check_lengths, check_settings, ttft_table

    lengths, rhos = split_list(args.lengths, int, "--lengths"), split_list(args.rho, float, "--rho")
    check_settings(lengths, args.samples)
    bb = load_backbone(args.model)
    check_lengths(bb, lengths)
    # tqdm writes to stderr, so --json stdout stays one document
    table = ttft_table(bb, lengths, rhos, args.samples, progress=True)
    return print_table(table, args, digits=2)


def cmd_notebooks(args) -> int:
    from bcr_core.lab.notebooks import NotebookError, run_notebooks

    parameters = read_parameters(args.parameter)
    if args.model != DEFAULT_MODEL:
        parameters["model"] = args.model
    try:
        results = run_notebooks(
            args.out,
            smoke=args.smoke,
            only=split_list(args.only, str, "--only") if args.only is not None else None,
            parameters=parameters,
        )
    except NotebookError as err:
        print(f"bcr notebooks: error: {err}", file=sys.stderr)
        return 2
    import pandas as pd

    table = pd.DataFrame([{"notebook": r.notebook, "seconds": r.seconds, "ok": r.ok, "html": r.html} for r in results])
    print_table(table, args, digits=1)
    for r in results:
        if not r.ok:
            print(f"bcr notebooks: {r.error}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def read_parameters(pairs: list[str]) -> dict:
    """`-p NAME=VALUE` pairs: VALUE read as JSON, else as a string."""
    parameters = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"-p takes NAME=VALUE, got {pair!r}")
        try:
            parameters[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            parameters[name.strip()] = raw  # a bare word is a string
    return parameters


def cmd_explore(args) -> int:
    import tempfile

    from bcr_core.lab import app

    parameters = read_parameters(args.parameter)
    if args.model != DEFAULT_MODEL:
        parameters["model"] = args.model
    app.check_port(args.port)
    with tempfile.TemporaryDirectory(prefix="bcr-explore-") as folder:
        prepared = app.explorer_notebook(parameters, Path(folder), results=args.results)
        url = f"http://{app.HOST}:{args.port}/"
        source = (
            f"reads {prepared.saved}"
            if prepared.saved
            else f"no saved inspection matches: serves {prepared.parameters['n']} requests with the model first "
            f"(minutes), then saves them to {app.FRESH / 'explorer'}"
        )
        if args.check:
            print(json.dumps({"url": url, "saved": str(prepared.saved or "")}) if args.json else f"ok: {source}")
            return 0
        try:
            server = app.start(prepared.notebook, args.port, explicit=prepared.explicit)
        except RuntimeError as err:
            raise UsageError(f"voila did not start: {err}") from None
        print(
            json.dumps({"url": url, "saved": str(prepared.saved or "")}) if args.json else f"explorer: {url}\n{source}"
        )
        print("Ctrl-C stops it.", file=sys.stderr, flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            app.stop(server)
    return 0


ITEMS = {int: "integers", float: "numbers", str: "names"}


def split_list(text: str, kind, option: str | None = None):
    """A comma-separated option value as a list; with `option` named, an empty list or a value given
    twice is an error naming it."""
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"cannot read {text!r} as a comma-separated list of {kind.__name__}") from None
    if option and not values:
        raise UsageError(f"{option} is empty; give a comma-separated list of {ITEMS[kind]}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if option and twice:
        raise UsageError(f"{option} lists {', '.join(map(str, twice))} more than once; give each value once")
    return values


def build_parser() -> argparse.ArgumentParser:
    from bcr_core.data.benchmarks import NAMES as BENCHMARKS
    from bcr_core.probes.verify import DEFAULT_PROMPT

    parser = argparse.ArgumentParser(prog="bcr", description="BCR lab: cross-context KV-cache reuse and its repair")
    sub = parser.add_subparsers(dest="command", required=True)

    verify = sub.add_parser("verify", help="exactness checks: full repair == Dense, RoPE re-rotation round trip")
    verify.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message to check on")
    add_common(verify)
    verify.set_defaults(run=cmd_verify)

    demo = sub.add_parser("demo", help="Dense vs a reused cache, unrepaired and repaired at a few budgets")
    demo.add_argument("--prompt", default=DEFAULT_PROMPT)
    demo.add_argument("--new-tokens", type=int, default=48)
    add_common(demo)
    demo.set_defaults(run=cmd_demo)
    curve = sub.add_parser("unit-curve", help="Table 8: informed vs random restoration by unit of choice")
    curve.add_argument("--segment-tokens", type=int, default=2048)
    curve.add_argument("--budget", type=float, default=paper.RHO)
    curve.add_argument("--units", default="1,16,64,256,1024")
    curve.add_argument("--prompts", type=Path, default=None, help="JSONL, one object per line with a 'text' field")
    curve.add_argument("--seed", type=int, default=0, help="first seed of the random selections")
    curve.add_argument("--seeds", type=int, default=3, help="how many random seeds")
    add_common(curve)
    curve.set_defaults(run=cmd_unit_curve)

    ttft = sub.add_parser("ttft", help="Table 10: time to first token, Dense vs KVComm vs BCR-chunk (and its coin)")
    ttft.add_argument("--lengths", default="64,512,2048,4096", help="segment lengths in tokens")
    ttft.add_argument("--rho", default="0.05,0.1,0.2,0.3,0.4", help="repair budgets for BCR-chunk and coin-chunk")
    ttft.add_argument("--samples", type=int, default=3, help="timed requests per length (5 calls each)")
    add_common(ttft)
    ttft.set_defaults(run=cmd_ttft)

    run = sub.add_parser("run", help="a grid cell: one benchmark and agent count under several conditions")
    run.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    run.add_argument("--agents", type=int, default=3, help="agents before the FinalRefer node (2-5)")
    run.add_argument(
        "--conditions",
        required=True,
        help="comma-separated, e.g. dense,kvcomm,bcr-chunk,coin-chunk@0.2:seed=1 (see bcr_core.runs.conditions)",
    )
    run.add_argument("--n", type=int, required=True, help="number of items (the first n, same for every condition)")
    run.add_argument("--out", type=Path, required=True, help="run folder; rerunning resumes it")
    run.add_argument("--pinned", default=None, help="give every agent this role instead of cycling roles")
    run.add_argument("--seeds", default=None, help="comma-separated seeds: coin conditions run once per seed")
    run.add_argument("--max-new-tokens", type=int, default=512)
    run.add_argument("--reference", default=None, help="condition the b/c splits are taken against (default kvcomm)")
    run.add_argument("--item-seed", type=int, default=0, help="seed of the synthetic task's items")
    run.add_argument(
        "--batch",
        type=int,
        default=1,
        help="requests served at once with batched decoding (same tokens; call times then include waiting)",
    )
    run.add_argument(
        "--fidelity",
        action="store_true",
        help="also serve every call densely: per-call first-token agreement and teacher-forced KL",
    )
    add_common(run)
    run.set_defaults(run=cmd_run)

    arena = sub.add_parser(
        "arena", help="every selector on the same assembled caches at the same rows, against Dense (issue 24)"
    )
    arena.add_argument("--n", type=int, required=True, help="number of items (the first n)")
    arena.add_argument("--out", type=Path, required=True, help="run folder; rerunning resumes it")
    arena.add_argument("--benchmark", default="synthetic", choices=BENCHMARKS)
    arena.add_argument("--agents", type=int, default=3, help="agents before the FinalRefer node (2-5)")
    arena.add_argument("--max-new-tokens", type=int, default=8)
    arena.add_argument("--item-seed", type=int, default=0, help="seed of the synthetic task's items")
    arena.add_argument("--rho", type=float, default=paper.RHO, help="the serving BCR-chunk's budget (the paired count)")
    arena.add_argument("--chunk", type=int, default=16, help="B: the chunk layout's unit, serving and arena alike")
    arena.add_argument("--rhos", default="0.05,0.1,0.2,0.4", help="the sweep: round(rho x M) rows per call each")
    arena.add_argument("--gamma", type=float, default=None, help="KVComm's gate (default: the paper's 0.3)")
    arena.add_argument(
        "--selectors",
        default=None,
        help="comma-separated selectors with options, e.g. draft,draft:rank=predicted,cacheblend:layer=2 "
        "(default: the whole field; see bcr_core.arena.registry)",
    )
    arena.add_argument("--seeds", default=None, help="comma-separated seeds: a coin without a seed runs once per seed")
    add_common(arena)
    arena.set_defaults(run=cmd_arena)

    grid = sub.add_parser("grid", help="many cells from a TOML file, in this process or on Ray; one combined table")
    grid.add_argument("file", type=Path, help="TOML: a [defaults] table of `bcr run` settings, one [cells.NAME] each")
    grid.add_argument("--out", type=Path, required=True, help="grid folder: each cell in OUT/NAME; rerunning resumes")
    grid.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="one Ray task per cell: on a local Ray instance started for the run, or on the cluster "
        "at ADDRESS ('auto' for the one this node joined)",
    )
    add_common(grid)
    grid.set_defaults(run=cmd_grid)

    notebooks = sub.add_parser("notebooks", help="execute the notebooks headless: executed copies and HTML reports")
    notebooks.add_argument("--smoke", action="store_true", help="CI-sized runs: few items, short outputs")
    notebooks.add_argument("--out", type=Path, default=Path("reports"), help="folder for executed copies and HTML")
    notebooks.add_argument("--only", default=None, help="comma-separated notebook names or prefixes, e.g. 00,09")
    notebooks.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a notebook parameter (VALUE read as JSON, else as a string); repeatable",
    )
    add_common(notebooks)
    notebooks.set_defaults(run=cmd_notebooks)

    explore = sub.add_parser("explore", help="notebook 09, the attention explorer, as a local web app (Voila)")
    explore.add_argument("--port", type=int, default=8866, help="localhost port to serve on")
    explore.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a parameter of notebook 09 (VALUE read as JSON, else as a string); repeatable",
    )
    explore.add_argument(
        "--results",
        type=Path,
        default=RESULTS / "explorer",
        help="folder of saved inspections to read (default: the committed one, which matches 09's defaults)",
    )
    explore.add_argument(
        "--check", action="store_true", help="check the arguments, say what the app would read or serve, and exit"
    )
    add_common(explore)
    explore.set_defaults(run=cmd_explore)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:  # a mistake the user can fix: one line; anything else is a bug and keeps its traceback
        print(f"bcr {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # a run's interruption says what it kept (runner.Interrupted)
        print(f"bcr {args.command}: {err or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
