"""Every table committed under results/ that a `bcr report` makes regenerates from the committed records byte for
byte: `bcr report KIND FOLDER... --out DIR` writes into DIR what the committed folder holds, and each file is
compared as bytes with the committed one. A drift check: it holds code and committed files equal, so a change to
either (a moved module that changed a rounding, a stale CSV) fails here; the computations themselves are tested
on records written by hand elsewhere (tests/test_claims.py, test_confirmation.py, test_humaneval_claims.py,
test_calibration.py).

What no report can regenerate is named, with its reason: a HumanEval cell's seams.csv is counted from the calls'
id lists, which committed records keep only as counts.
"""

from __future__ import annotations

import pytest

from bcr_core.paths import RESULTS

CALIBRATION = "qwen2.5-coder-0.5b-calibration"
CLAIMS = ("verdicts.csv", "grid_table.csv")
REPORTS = {  # the committed folder -> (the report's kind, the folders it reads, the files its --out writes)
    "claims": ("claims", ["claims"], [*CLAIMS, "confirm-1/verdicts.csv"]),
    "claims-gemma-3-270m": ("claims", ["claims-gemma-3-270m"], CLAIMS),
    "claims-gemma-3-270m-bos": ("claims", ["claims-gemma-3-270m-bos"], CLAIMS),
    "claims-qwen2.5-coder-0.5b": ("claims", ["claims-qwen2.5-coder-0.5b"], CLAIMS),
    "claims-qwen2.5-coder-0.5b/humaneval": ("humaneval", ["claims-qwen2.5-coder-0.5b/humaneval"], ["verdicts.csv"]),
    CALIBRATION: ("budget", [f"{CALIBRATION}/{c}" for c in ("eos-512", "code-512", "code-384")], ["table.csv"]),
}
NOT_REGENERATED = {"claims-qwen2.5-coder-0.5b/humaneval/seams.csv"}  # counted from id lists the export drops


def test_every_committed_report_table_is_covered_here():
    """A committed verdicts.csv, grid_table.csv or seams.csv (and the budget calibration's table.csv) that no
    report below writes would go unchecked: the set of them is the set this file regenerates or names."""
    committed = {str(p.relative_to(RESULTS)) for name in (*CLAIMS, "seams.csv") for p in RESULTS.rglob(name)}
    covered = {f"{target}/{name}" for target, (_, _, names) in REPORTS.items() for name in names}
    assert committed | {f"{CALIBRATION}/table.csv"} == covered | NOT_REGENERATED


@pytest.mark.parametrize("target", list(REPORTS))
def test_a_committed_report_regenerates_byte_for_byte(target, tmp_path, capsys):
    from bcr_core.cli import main

    kind, folders, names = REPORTS[target]
    assert main(["report", kind, *(str(RESULTS / f) for f in folders), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out  # it printed its tables
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert made == sorted(names)
    changed = [name for name in names if (tmp_path / name).read_bytes() != (RESULTS / target / name).read_bytes()]
    assert changed == []


def test_a_report_without_out_writes_nothing(tmp_path, capsys):
    """Reports print: the folder read is left as it was (the budget report is the cheapest to run)."""
    import shutil

    from bcr_core.cli import main

    for name in ("eos-512", "code-384"):
        shutil.copytree(RESULTS / CALIBRATION / name, tmp_path / name)
    before = {str(p) for p in tmp_path.rglob("*")}
    assert main(["report", "budget", str(tmp_path / "eos-512"), str(tmp_path / "code-384")]) == 0
    assert "chooses **" in capsys.readouterr().out
    assert {str(p) for p in tmp_path.rglob("*")} == before
