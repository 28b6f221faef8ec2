"""docs/workshop.md's commands still match the lab: every shell command in it is parsed by the real
command line, and checked further without running the model: `bcr explore` with `--check` (its
parameters against notebook 09, the saved inspection it reads), `bcr notebooks` by the notebooks and
parameters it names, `make` by the Makefile's targets. A stale command fails here."""

from __future__ import annotations

import re
import shlex

import pytest

from bcr_core.cli import build_parser, main
from bcr_core.commands import read_parameters
from bcr_core.lab import app, params
from bcr_core.lab.notebooks import declared_parameters, notebook_paths
from bcr_core.paths import CHECKOUT

DOC = CHECKOUT / "docs" / "workshop.md"


def commands() -> list[str]:
    """The shell commands of the doc's ```bash blocks, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    text = "\n".join(blocks).replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_doc_has_the_commands_an_instructor_needs():
    found = commands()
    assert any(c.startswith(".venv/bin/bcr explore") and "--check" not in c for c in found)
    assert any(c.startswith(".venv/bin/bcr explore --check") for c in found)
    assert "make setup" in found


@pytest.mark.parametrize("command", commands())
def test_each_command_parses_against_the_real_cli(command, capsys):
    argv = shlex.split(command)
    if argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (CHECKOUT / "Makefile").read_text(), flags=re.MULTILINE)
        assert all(t in targets for t in argv[1:]), f"{command}: the Makefile has targets {targets}"
        return
    assert argv[0] == ".venv/bin/bcr", f"{command}: teach this test how to check a {argv[0]!r} command"
    args = build_parser().parse_args(argv[1:])  # argparse exits (a test failure) on a stale flag
    if args.command == "explore":
        free = ["--port", str(app.free_port())]  # the doc's port may be taken on this machine
        assert main([*argv[1:], *free, "--check"]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith("ok: ")
    elif args.command == "notebooks":
        paths = notebook_paths(args.only.split(",") if args.only else None)
        declared = set().union(*(declared_parameters(p) for p in paths))
        given = read_parameters(args.parameter)
        assert set(given) <= declared, f"{command}: no notebook declares {set(given) - declared}"
        params.check(**given)
