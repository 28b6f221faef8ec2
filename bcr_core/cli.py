"""The `bcr` command line (also `python -m bcr_core`).

Every subcommand takes `--model` (default: the embedded SmolLM2-135M-Instruct) and `--json`
(exactly one JSON document on stdout; progress and logs go to stderr).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bcr_core import paper
from bcr_core.commands import (
    REPORTS,
    cmd_arena,
    cmd_arena_deepen,
    cmd_arena_merge,
    cmd_calibrate,
    cmd_demo,
    cmd_explore,
    cmd_export,
    cmd_grid,
    cmd_notebooks,
    cmd_plan,
    cmd_report,
    cmd_run,
    cmd_ttft,
    cmd_unit_curve,
    cmd_verify,
)
from bcr_core.errors import UsageError
from bcr_core.paths import RESULTS
from bcr_core.setting_kinds import Bool, Number, Setting, Str, cli_label, with_defaults


def add_settings(parser: argparse.ArgumentParser, schema: dict[str, Setting]) -> None:
    """One flag per setting of `schema`, its type, choices, default and help read from the setting:
    a flag a schema declares is never declared by hand."""
    for key, setting in schema.items():
        parser.add_argument(cli_label(key), dest=key, **flag_options(setting))


def pick(schema: dict[str, Setting], *keys: str) -> dict[str, Setting]:
    return {key: schema[key] for key in keys}


def without(schema: dict[str, Setting], *keys: str) -> dict[str, Setting]:
    """The settings but `keys` (`--model` and `--dtype`, which `add_common` gives every command)."""
    return {key: setting for key, setting in schema.items() if key not in keys}


def flag_options(setting: Setting) -> dict:
    """`add_argument`'s options for a setting. A list is typed as comma-separated text (its default
    shown so), which `commands.settings_of` reads back into the list."""
    kind = setting.plain_kind
    options = {"help": setting.help, "required": True} if setting.required else {"help": setting.help}
    if not setting.required:
        default = setting.default
        options["default"] = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
    if isinstance(kind, Bool):
        options["action"] = "store_true"
    elif isinstance(kind, Number):
        options["type"] = kind.cast
    elif isinstance(kind, Str) and kind.choices:
        options["choices"] = kind.choices
    return options


def add_common(parser: argparse.ArgumentParser) -> None:
    from bcr_core.schema import RUN

    add_settings(parser, pick(RUN, "model", "dtype"))
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, unless it has none (None, a flag's False, an empty
    string or list) or its help already says what happens without it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default in ("", []) or "default" in action.help:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """`bcr` and its subcommands, one `add_...` function each."""
    parser = argparse.ArgumentParser(prog="bcr", description="BCR lab: cross-context KV-cache reuse and its repair")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        add_verify,
        add_demo,
        add_unit_curve,
        add_ttft,
        add_run,
        add_arena,
        add_arena_merge,
        add_arena_deepen,
        add_calibrate,
        add_grid,
        add_plan,
        add_notebooks,
        add_explore,
        add_records_commands,
    ):
        add(sub)
    for command in sub.choices.values():
        command.formatter_class = DefaultsShown
    return parser


def add_verify(sub) -> None:
    from bcr_core.probes.verify import DEFAULT_PROMPT

    verify = sub.add_parser("verify", help="exactness checks: full repair == Dense, RoPE re-rotation round trip")
    verify.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message to check on")
    add_common(verify)
    verify.set_defaults(run=cmd_verify)


def add_demo(sub) -> None:
    from bcr_core.probes.verify import DEFAULT_PROMPT

    demo = sub.add_parser("demo", help="Dense vs a reused cache, unrepaired and repaired at a few budgets")
    demo.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="user message to serve densely and from the reused cache"
    )
    demo.add_argument("--new-tokens", type=int, default=48, help="tokens each answer generates")
    add_common(demo)
    demo.set_defaults(run=cmd_demo)


def add_unit_curve(sub) -> None:
    curve = sub.add_parser("unit-curve", help="Table 8: informed vs random restoration by unit of choice")
    curve.add_argument("--segment-tokens", type=int, default=2048, help="length of the reused segment, in tokens")
    curve.add_argument("--budget", type=float, default=paper.RHO, help="share of the segment's rows restored (rho)")
    curve.add_argument("--units", default="1,16,64,256,1024", help="comma-separated units of choice, in rows")
    curve.add_argument("--prompts", type=Path, default=None, help="JSONL, one object per line with a 'text' field")
    curve.add_argument("--seed", type=int, default=0, help="first seed of the random selections")
    curve.add_argument("--seeds", type=int, default=3, help="how many random seeds")
    add_common(curve)
    curve.set_defaults(run=cmd_unit_curve)


def add_ttft(sub) -> None:
    ttft = sub.add_parser("ttft", help="Table 10: time to first token, Dense vs KVComm vs BCR-chunk (and its coin)")
    ttft.add_argument("--lengths", default="64,512,2048,4096", help="segment lengths in tokens")
    ttft.add_argument("--rho", default="0.05,0.1,0.2,0.3,0.4", help="repair budgets for BCR-chunk and coin-chunk")
    ttft.add_argument("--samples", type=int, default=3, help="timed requests per length (5 calls each)")
    add_common(ttft)
    ttft.set_defaults(run=cmd_ttft)


def add_run(sub) -> None:
    from bcr_core.schema import RUN

    about = "a grid cell: one benchmark and agent count under several conditions"
    add_run_folder_command(sub, "run", about, RUN, cmd_run)


def add_arena(sub) -> None:
    from bcr_core.schema import ARENA

    about = "every selector on the same assembled caches at the same rows, against Dense"
    add_run_folder_command(sub, "arena", about, ARENA, cmd_arena)


def add_run_folder_command(sub, name: str, about: str, schema: dict[str, Setting], run) -> None:
    """A command that writes a resumable run folder (`--out`), its every other flag from `schema`."""
    parser = sub.add_parser(name, help=about)
    parser.add_argument("--out", type=Path, required=True, help="run folder; rerunning resumes it")
    add_settings(parser, without(schema, "model", "dtype"))
    add_common(parser)
    parser.set_defaults(run=run)


def add_arena_merge(sub) -> None:
    merge = sub.add_parser("arena-merge", help="join the lanes of a split `bcr arena --shard` into one run folder")
    merge.add_argument("lanes", nargs="+", type=Path, metavar="LANE", help="the M lanes' --out folders")
    merge.add_argument("--out", type=Path, required=True, help="the joined run folder (rewritten on every merge)")
    add_common(merge)
    merge.set_defaults(run=cmd_arena_merge)


def add_arena_deepen(sub) -> None:
    deepen = sub.add_parser(
        "arena-deepen",
        help="continue an arena run's searches that stopped at their evaluation cap, into a new run folder",
    )
    deepen.add_argument("source", type=Path, metavar="RUN", help="a finished `bcr arena` folder (its model and dtype)")
    deepen.add_argument("--out", type=Path, required=True, help="the deepened run folder; rerunning resumes it")
    deepen.add_argument(
        "--evals", type=int, default=1000, help="the searches' new cap, evaluations per call and budget in all"
    )
    deepen.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")
    deepen.set_defaults(run=cmd_arena_deepen)


def add_calibrate(sub) -> None:
    from bcr_core.schema import RUN

    calibrate = sub.add_parser(
        "calibrate",
        help="choose a model's prompt and stop rule before a grid: Dense's pipeline under each candidate, on "
        "items of another seed, with the no-record control and the seam share",
    )
    calibrate.add_argument("--out", type=Path, required=True, help="folder for records.jsonl and table.csv; resumes")
    # the run's settings at calibration's defaults: items of another seed than the grid's
    add_settings(
        calibrate,
        with_defaults(pick(RUN, "n", "item_seed", "agents", "max_new_tokens"), n=50, item_seed=1, max_new_tokens=8),
    )
    add_common(calibrate)
    calibrate.set_defaults(run=cmd_calibrate)


def add_plan(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="size a confirmatory run from a pilot claims folder: a grid file of the conditions its undecided "
        "claims need, on fresh items, n fixed by simulating each claim's own test",
    )
    plan.add_argument("pilot", type=Path, metavar="PILOT_FOLDER", help="a claims folder (e.g. results/claims)")
    plan.add_argument("--out", type=Path, required=True, help="the grid file (TOML) to write and commit")
    plan.add_argument("--power", type=float, default=0.8, help="the power each planned claim is sized for")
    plan.add_argument(
        "--claims",
        type=lambda text: [c.strip() for c in text.split(",") if c.strip()],
        default=None,
        help="comma-separated claims to size (default: every undecided claim bcr plan sizes that fits --max-items)",
    )
    plan.add_argument("--max-items", type=int, default=5000, help="the most items a planned run may take")
    plan.set_defaults(run=cmd_plan)


def add_grid(sub) -> None:
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


def add_notebooks(sub) -> None:
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


def add_explore(sub) -> None:
    explore = sub.add_parser("explore", help="notebook 09, the attention explorer, as a local web app (Voila)")
    explore.add_argument("--port", type=int, default=8866, help="port to serve on")
    explore.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0: every network it is on, "
        "for a room); prints the URL participants type",
    )
    explore.add_argument(
        "--participants",
        type=int,
        default=None,
        metavar="N",
        help="preheat N kernels with the inspection read and the model loaded, so each of N pages gets its "
        "first figure at once; later pages start a kernel of their own (memory: see docs/workshop.md)",
    )
    explore.add_argument(
        "--max-kernels",
        type=int,
        default=None,
        metavar="M",
        help="at most M kernels at once; past them a page says the room is full (default: twice --participants; "
        "no cap without it)",
    )
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


def add_records_commands(sub) -> None:
    """The subcommands that read records already on disk and load no model."""
    export = sub.add_parser(
        "export", help="a run folder's records for committing: gzip, each call's counts in place of its id lists"
    )
    export.add_argument(
        "run_dir", metavar="RUN_DIR", type=Path, help="a run folder (`bcr run --out`, `bcr arena --out`)"
    )
    export.add_argument(
        "out", metavar="OUT_DIR", type=Path, help="folder to write cell.json, items.jsonl.gz and calls.jsonl.gz into"
    )
    export.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")
    export.set_defaults(run=cmd_export)

    report = sub.add_parser("report", help="recompute the committed tables (docs/results.md) from records")
    report.add_argument(
        "kind",
        choices=REPORTS,
        help="'claims' (verdicts and grid table), 'arena', 'humaneval' (the HumanEval family and its seams), or "
        "'budget' (a decoding budget's calibration: one Dense run folder per candidate, the longest first)",
    )
    report.add_argument(
        "folders",
        metavar="FOLDER",
        type=Path,
        nargs="+",
        help="one folder per model; several also print the transfer table",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        help="also write the CSVs a committed folder holds (verdicts.csv, grid_table.csv; seams.csv; table.csv) "
        "into OUT (into OUT/<folder name> for several folders); without it the report only prints",
    )
    report.set_defaults(run=cmd_report)


RESUMED = {"run", "grid", "arena", "arena-deepen", "calibrate", "notebooks"}  # what keeps its finished work on disk


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with sigterm_as_ctrl_c() as terminated:
        try:
            return args.run(args)
        except UsageError as err:  # a mistake the user can fix: one line; anything else is a bug: its traceback
            print(f"bcr {args.command}: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as err:  # a run's interruption says what it kept (runner.Interrupted)
            print(f"bcr {args.command}: {str(err) or interrupted(args.command)}", file=sys.stderr)
            return 128 + terminated[0] if terminated else 130


def interrupted(command: str) -> str:
    if command in RESUMED:
        return "interrupted; rerun the same command to resume"
    return "interrupted; it keeps nothing, so rerun the same command to start again"


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[list]:
    """SIGTERM (what `kill`, systemd and SLURM send) takes Ctrl-C's path while a command runs: the
    item in flight is dropped, the finished ones are kept and the command says how to resume. The
    list yielded holds the signal once one came; a second SIGTERM does not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    received = []

    def stop(signum, frame):
        if not received:
            received.append(signum)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
