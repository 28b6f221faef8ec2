"""The `bcr` command line (also `python -m bcr_core`).

Every subcommand takes `--model` (default: the embedded SmolLM2-135M-Instruct) and `--json`
(exactly one JSON document on stdout; progress and logs go to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys

from bcr_core.models import DEFAULT_MODEL, ModelError


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'default' (embedded SmolLM2-135M-Instruct), a local HF directory, or a hub id")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")


def load_backbone(args):
    from bcr_core.backbone import Backbone

    return Backbone.load(args.model)


def cmd_verify(args) -> int:
    from bcr_core.verify import verify

    report = verify(load_backbone(args), prompt=args.prompt)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"model: {report.model}")
        print(f"full repair (rho = 1) token-identical to Dense over {report.tokens_compared} tokens: "
              f"{report.full_repair_token_identical}")
        print(f"  unrepaired (foreign-prefix) cache identical to Dense: {report.unrepaired_token_identical}")
        print(f"  max |repaired - dense| over all layers: {report.repair_max_abs_err:.2e}")
        print(f"re-rotation max abs error: {report.rerotation_max_abs_err:.2e} "
              f"(tolerance {report.rerotation_tolerance:.0e})")
        print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


def cmd_demo(args) -> int:
    import pandas as pd

    from bcr_core.demo import demo

    table = demo(load_backbone(args), prompt=args.prompt, new_tokens=args.new_tokens)
    if args.json:
        print(table.to_json(orient="records", indent=2))
    else:
        with pd.option_context("display.max_colwidth", 70, "display.width", 200):
            print(table.to_string(index=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from bcr_core.verify import DEFAULT_PROMPT

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ModelError, ValueError) as err:
        print(f"bcr {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
