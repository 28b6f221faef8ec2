"""The repository carries what it cites. Two rules, checked over the prose a reader meets (the
docs, the README and every module of the package, docstrings and comments alike):

1. Every backticked dotted name whose first part is `bcr_core` or one of its subpackages
   (`agents`, `analysis`, `arena`, `data`, `engine`, `lab`, `probes`, `repair`, `reuse`, `runs`,
   read from the package folder) resolves: the longest importable prefix is imported, the rest
   looked up with getattr.
   `bcr_core.lab.tables.line_points` and `lab.tables.line_points` are both checked; `Backbone.load`
   or `paper.py` are not names of this form.
2. Every `docs/design.md §N` cited anywhere in the repository's code, tests, notebooks or docs is
   a numbered heading `## N. ...` of docs/design.md, and no file cites notes a user of the
   repository does not have (the lab's old design file, the paper's text file by line).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bcr_core
from bcr_core.paths import CHECKOUT

PACKAGE = Path(bcr_core.__file__).parent
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
DOTTED = re.compile(r"`((?:bcr_core|" + "|".join(SUBPACKAGES) + r")(?:\.\w+)+)`")
DESIGN = CHECKOUT / "docs" / "design.md"
CITED = re.compile(r"docs/design\.md §(\d+)")
# Citations of files outside the repository, spelled so that this file does not match itself.
FOREIGN = re.compile(r"DESIGN(?:\.md| §)|bcr-paper\.txt|\.\./shared")


def prose_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py")) + sorted((CHECKOUT / "docs").glob("*.md")) + [CHECKOUT / "README.md"]


def citing_files() -> list[Path]:
    kinds = ["bcr_core/**/*.py", "tests/*.py", "notebooks/*.ipynb", "docs/*.md", "*.md", "Makefile", "pyproject.toml"]
    return sorted({p for kind in kinds for p in CHECKOUT.glob(kind)})


def dotted_names() -> list[tuple[str, str]]:
    found = {(m.group(1), str(p.relative_to(CHECKOUT))) for p in prose_files() for m in DOTTED.finditer(p.read_text())}
    return sorted(found)


def resolve(name: str) -> object:
    """The object a dotted name names, `bcr_core.` assumed in front of a subpackage's name."""
    parts = name.split(".")
    parts = parts if parts[0] == "bcr_core" else ["bcr_core", *parts]
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)  # AttributeError: a stale name
        return found
    raise ModuleNotFoundError(name)


def design_sections() -> set[str]:
    return set(re.findall(r"^## (\d+)\. ", DESIGN.read_text(), flags=re.MULTILINE))


def test_the_rules_see_what_they_check():
    names = dict(dotted_names())
    assert "bcr_core.analysis.statistics.binary.mcnemar_exact" in names  # docs/design.md is scanned
    assert "bcr_core.analysis.claims.protocol.with_agreement" in names  # and so are docstrings
    assert resolve("lab.tables.line_points") is resolve("bcr_core.lab.tables.line_points")
    with pytest.raises(AttributeError):
        resolve("bcr_core.lab.tables.no_such_name")
    assert {"2", "4"} <= design_sections()


@pytest.mark.parametrize(("name", "where"), dotted_names())
def test_each_backticked_name_resolves(name, where):
    try:
        resolve(name)
    except (ImportError, AttributeError) as error:
        pytest.fail(f"{where}: `{name}` does not resolve ({error})")


def test_every_cited_section_of_the_design_notes_exists():
    sections = design_sections()
    stale = [
        f"{p.relative_to(CHECKOUT)}: docs/design.md §{n}"
        for p in citing_files()
        for n in CITED.findall(p.read_text())
        if n not in sections
    ]
    assert not stale, f"sections {sorted(sections)} exist; cited: {stale}"


def test_nothing_cites_notes_outside_the_repository():
    citing = {str(p.relative_to(CHECKOUT)) for p in citing_files() if FOREIGN.search(p.read_text())}
    assert not citing, f"cite docs/design.md or the paper's sections instead: {sorted(citing)}"
