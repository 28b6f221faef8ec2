"""The README is the order a newcomer needs and says only what is true: the two commands are two and
are what CI runs, every `bcr` command it shows parses against the real command line, its command
table lists every subcommand, and its summary of the findings quotes docs/results.md and
docs/performance.md (whose tables the claims and arena tests check against the committed records).
"""

from __future__ import annotations

import re
import shlex

import pytest

from bcr_core.cli import build_parser
from bcr_core.conditions import parse, split_conditions
from bcr_core.paths import CHECKOUT

README = (CHECKOUT / "README.md").read_text()


def section(title: str) -> str:
    """The text of the README's `## title` section, up to the next `## ` heading."""
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def expand(line: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), line)


def bcr_commands() -> list[str]:
    """Every `bcr` command of the README's ```bash blocks: continuation lines joined, comments and a
    trailing `&` dropped, each block's shell variables (`C=...; A="..."`) and a `for` loop's first
    value substituted."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL):
        variables: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip().removesuffix("&").strip()
            loop = re.fullmatch(r"for (\w+) in (\S+)[^;]*; do (.*); done", line)
            if loop:
                variables[loop.group(1)] = loop.group(2)
                line = loop.group(3)
            assignments = [a for a in line.split("; ") if len(shlex.split(a)) == 1 and re.fullmatch(r"\w+=.*", a)]
            for a in assignments:
                name, value = a.split("=", 1)
                variables[name] = " ".join(shlex.split(value))
            line = expand(line, variables)
            words = shlex.split(line) if line and not assignments else []
            while words and re.fullmatch(r"\w+=\S*", words[0]):
                words = words[1:]  # OMP_NUM_THREADS=1 before the command
            if words and words[0] in ("bcr", ".venv/bin/bcr"):
                found.append(shlex.join(words))
    return found


def test_the_readme_opens_with_usage_and_keeps_two_commands():
    headings = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert headings[:3] == ["Two commands", "Four recipes", "The command line"], headings
    assert headings[-1] == "What the lab found"
    assert README.index("## Four recipes") < 60 * 80  # usage within the first screenfuls, before any table
    commands = re.findall(r"^make (\S+)", section("Two commands"), flags=re.MULTILINE)
    assert commands == ["demo", "test"]
    assert "\nmake test\n" in (CHECKOUT / ".ci" / "run").read_text()
    targets = re.findall(r"^([\w-]+):", (CHECKOUT / "Makefile").read_text(), flags=re.MULTILINE)
    assert {"demo", "test"} <= set(targets)
    recipes = re.findall(r"^\*\*(.+?)\.\*\*", section("Four recipes"), flags=re.MULTILINE)
    assert len(recipes) == 4, recipes


def test_the_recipes_name_the_commands_they_teach():
    found = bcr_commands()
    assert any(c.startswith(".venv/bin/bcr run --model /path/to/hf-dir ") for c in found)
    assert any(c.startswith(".venv/bin/bcr explore") for c in found)
    regenerate = section("Four recipes").split("**Regenerate the committed results.**")[1]
    steps = [line for line in regenerate.split("```bash\n")[1].split("```")[0].splitlines() if line.strip()]
    running = 0
    for line in steps:  # on two cores: at most two runs at once, and `wait` before anything reads them
        running += line.startswith("bcr run") and line.rstrip().endswith("&")
        running += line.startswith("  ") and line.rstrip().endswith("&")
        if line == "wait":
            running = 0
        assert running <= 2, line
        if "bcr export" in line or "bcr report" in line:
            assert running == 0, line
    assert any("bcr export" in line for line in steps) and any("bcr report claims" in line for line in steps)


@pytest.mark.parametrize("command", bcr_commands())
def test_each_readme_command_parses_against_the_real_cli(command):
    try:
        args = build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"the README shows a command the CLI refuses: {command}")
    if args.command == "run":  # and every condition it names is one the lab knows
        assert [parse(c).label for c in split_conditions(args.conditions)]


def test_the_command_table_lists_every_subcommand():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    listed = set(re.findall(r"^\| `bcr ([\w-]+)", section("The command line"), flags=re.MULTILINE))
    assert listed == set(sub.choices), sorted(set(sub.choices) ^ listed)


@pytest.mark.parametrize("command", ["demo", "unit-curve", "run", "arena", "calibrate", "ttft", "grid", "notebooks"])
def test_every_option_says_what_it_is_and_its_default(command):
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    page = " ".join(sub.choices[command].format_help().split())
    for action in sub.choices[command]._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"bcr {command} {action.option_strings[0]} has no help text"
        none = action.default is None or action.default is False or action.default in ("", [])
        if not none and "default" not in action.help:
            default = " ".join(str(action.default).split())
            assert f"{' '.join(action.help.split())} (default: {default})" in page, action.option_strings[0]


def test_the_summary_quotes_the_documented_numbers():
    """Every decimal, percentage and interval in the summary is in docs/results.md or
    docs/performance.md, so a number that moves there and not here fails."""
    summary = section("What the lab found")
    documented = " ".join(
        ((CHECKOUT / "docs" / "results.md").read_text() + (CHECKOUT / "docs" / "performance.md").read_text()).split()
    )
    intervals = re.findall(r"\[[^\]]+\]", re.sub(r"\]\([^)]*\)", "]", summary))
    intervals = [i for i in intervals if re.fullmatch(r"\[[-+]?\d[\d.]*, [-+]?\d[\d.]*\]", i)]
    numbers = re.findall(r"[-+]?\d+\.\d+x?|\d+%", re.sub(r"\([^)]*\.md[^)]*\)", "", summary))
    assert len(intervals) > 10 and len(numbers) > 20
    missing = [n for n in intervals + numbers if n not in documented]
    assert missing == []
