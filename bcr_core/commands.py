"""What each `bcr` subcommand does (`cli` parses the arguments and calls one of these): load what it
needs when it runs, so `bcr --help` does not wait for torch, and print a table or one JSON document.
"""

from __future__ import annotations

import json
import sys

from bcr_core.engine.models import DEFAULT_MODEL
from bcr_core.errors import UsageError


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
    from bcr_core.engine.loading import load_backbone
    from bcr_core.probes.verify import verify

    report = verify(load_backbone(args.model, args.dtype), prompt=args.prompt)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"model: {report.model} ({report.dtype})")
        print(
            f"full repair (rho = 1) token-identical to Dense over {report.tokens_compared} tokens: "
            f"{report.full_repair_token_identical}"
        )
        print(f"  unrepaired (foreign-prefix) cache identical to Dense: {report.unrepaired_token_identical}")
        print(f"  max |repaired - dense| over all layers, one kernel: {report.repair_max_abs_err:.2e} (exact: 0)")
        print(f"  max |dense - dense| across the default and the repair's kernel: {report.kernel_max_abs_err:.2e}")
        print(
            f"re-rotation max abs error: {report.rerotation_max_abs_err:.2e} "
            f"(tolerance {report.rerotation_tolerance:.1e})"
        )
        print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


def cmd_demo(args) -> int:
    import pandas as pd

    from bcr_core.engine.loading import load_backbone
    from bcr_core.probes.demo import demo

    if args.new_tokens < 1:
        raise UsageError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    table = demo(load_backbone(args.model, args.dtype), prompt=args.prompt, new_tokens=args.new_tokens)
    with pd.option_context("display.max_colwidth", 70):
        return print_table(table, args)


def cmd_run(args) -> int:
    from bcr_core.runs.cell import RunSettings
    from bcr_core.runs.runner import run_and_summarize
    from bcr_core.schema import RUN

    table, notes = run_and_summarize(RunSettings(**settings_of(args, RUN)), args.out, args.reference)
    code = print_table(table, args, digits=3)
    for note in notes:
        print(f"bcr run: {note}", file=sys.stderr)
    return code


def cmd_arena(args) -> int:
    from bcr_core.arena.run import arena_table
    from bcr_core.schema import ARENA

    table = arena_table(settings_of(args, ARENA), args.out)
    if table is None:
        print(
            f"bcr arena: no call of these {args.n} items was served from an assembled cache (KVComm's anchor pool "
            "warms up over the first items), so no selector was compared; run more items (--n)",
            file=sys.stderr,
        )
        if args.json:
            print("[]")
        return 0
    return print_table(table, args, digits=4)


def cmd_arena_merge(args) -> int:
    from bcr_core.arena.shards import merge

    joined = merge(args.lanes, args.out)
    if args.json:
        print(json.dumps({"out": str(args.out), "items": joined}))
    else:
        print(f"bcr arena-merge: {joined} items of {len(args.lanes)} lanes joined in {args.out}")
    return 0


def cmd_arena_deepen(args) -> int:
    from bcr_core.arena.deepen import continued, deepen, deepened_cell
    from bcr_core.engine.loading import load_backbone
    from bcr_core.run_folder import RunFolder

    cell = deepened_cell(args.source, args.evals)  # the cap checked before the model loads
    deepen(load_backbone(cell.model, cell.dtype), args.source, args.out, args.evals)
    return print_table(continued(RunFolder(args.out).calls()), args, digits=4)


def cmd_calibrate(args) -> int:
    from bcr_core.engine.loading import load_backbone
    from bcr_core.probes.calibration import GOAL, calibrate, choose

    table = calibrate(
        load_backbone(args.model, args.dtype), args.out, args.n, args.item_seed, args.agents, args.max_new_tokens
    )
    chosen = choose(table)
    reached = "reaches" if chosen.dense_accuracy >= GOAL else "does not reach"
    print(
        f"bcr calibrate: chosen --prompt {chosen.prompt} --stop {chosen.stop} (Dense accuracy "
        f"{chosen.dense_accuracy:.0%}, no-record {chosen.no_record_accuracy:.0%}); it {reached} the goal of {GOAL:.0%}",
        file=sys.stderr,
    )
    return print_table(table, args, digits=3)


def cmd_grid(args) -> int:
    from bcr_core.runs.grid import run_grid_file

    table, failed = run_grid_file(
        args.file, args.out, model=args.model, dtype=args.dtype, ray=args.ray, quiet=args.json
    )
    print_table(table, args, digits=3)
    for name in failed:
        print(f"bcr grid: cell {name} did not finish; run the same command again to resume it", file=sys.stderr)
    return 1 if failed else 0


def cmd_unit_curve(args) -> int:
    from bcr_core.probes.unit_curve import curve_table, seeds_from

    units = tuple(split_list(args.units, int, "--units"))
    seeds = seeds_from(args.seed, args.seeds)  # checked before the model loads
    table = curve_table(args.model, args.dtype, args.segment_tokens, args.budget, units, seeds, args.prompts)
    return print_table(table, args, digits=4)  # tqdm wrote its progress to stderr


def cmd_ttft(args) -> int:
    from bcr_core.engine.loading import load_backbone
    from bcr_core.probes.latency import check_lengths, check_settings, ttft_table

    lengths, rhos = split_list(args.lengths, int, "--lengths"), split_list(args.rho, float, "--rho")
    check_settings(lengths, args.samples)
    bb = load_backbone(args.model, args.dtype)
    check_lengths(bb, lengths)
    # tqdm writes to stderr, so --json stdout stays one document
    table = ttft_table(bb, lengths, rhos, args.samples, progress=True)
    return print_table(table, args, digits=2)


def cmd_notebooks(args) -> int:
    from bcr_core.lab.notebooks import NotebookError, run_notebooks

    parameters = read_parameters(args.parameter) | command_line_model(args)
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


def command_line_model(args) -> dict:
    """The notebook parameters `--model` and `--dtype` set where they differ from their defaults."""
    given = {"model": args.model, "dtype": args.dtype}
    return {key: value for key, value in given.items() if value != {"model": DEFAULT_MODEL, "dtype": "auto"}[key]}


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
    from bcr_core.lab.serving import Room, serve

    parameters = read_parameters(args.parameter) | command_line_model(args)
    room = Room(args.port, args.host, args.participants, args.max_kernels, args.results)
    return serve(parameters, room, check=args.check, as_json=args.json)


def cmd_plan(args) -> int:
    """A confirmation's grid file, sized from a pilot claims folder (`analysis.claims.planning`)."""
    from bcr_core.analysis.reports.claims_report import plan_confirmation
    from bcr_core.paths import write_text_whole

    if not args.pilot.is_dir():
        raise UsageError(f"{args.pilot}: no such pilot folder")
    text = plan_confirmation(args.pilot, args.claims, args.power, args.max_items)
    write_text_whole(args.out, text)
    print(text)
    print(f"wrote {args.out}: commit it before the run", file=sys.stderr)
    return 0


def cmd_export(args) -> int:
    from bcr_core.run_folder import export, read_records
    from bcr_core.runs.run_writer import unfinished

    items = export(args.run_dir, args.out)
    calls = len(read_records(args.out / "calls.jsonl.gz"))
    why = unfinished(args.run_dir, items)
    if why:
        print(f"bcr export: {why}", file=sys.stderr)
    done = {"items": items, "calls": calls, "out": str(args.out)}
    print(json.dumps(done) if args.json else f"exported {items} item and {calls} call records to {args.out}")
    return 0


REPORTS = ("claims", "arena", "humaneval", "budget")


def cmd_report(args) -> int:
    """The committed tables' Markdown (docs/results.md) recomputed from the folders' records and printed; with
    --out, the CSVs a committed folder holds are written there too."""
    for folder in args.folders:
        if not folder.is_dir():
            raise UsageError(f"{folder}: no such folder of {args.kind} records")
    if args.kind == "claims":
        from bcr_core.analysis.reports.claims_report import main as report
    elif args.kind == "humaneval":
        from bcr_core.analysis.reports.humaneval_report import main as report
    elif args.kind == "budget":
        from bcr_core.probes.calibration import budget_report as report
    else:
        from bcr_core.arena.report import main as arena_report

        if args.out is not None:
            raise UsageError("bcr report arena prints its tables and writes no file; drop --out")
        arena_report([str(f) for f in args.folders])
        return 0
    report(args.folders, args.out)
    return 0


ITEMS = {int: "integers", float: "numbers", str: "names"}


def settings_of(args, schema: dict) -> dict:
    """The settings of `schema` from parsed flags (`cli.add_settings` made them): a list given as
    comma-separated text read back into its list; everything else as parsed, for the schema to check."""
    from bcr_core.setting_kinds import ListOf, cli_label

    out = {}
    for key, setting in schema.items():
        value = getattr(args, key)
        kind = setting.plain_kind
        if isinstance(value, str) and isinstance(kind, ListOf) and not kind.accepts(value):
            value = split_list(value, kind.item.cast, cli_label(key))
        out[key] = value
    return out


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
