"""Sizing a confirmation (`analysis.claims.planning`): the simulated power of the claim's own test against an
independently written closed form (the exact binomial power of McNemar's conditional test, with
`scipy.stats.binom`), and the items found where power first reaches the target."""

import numpy as np
import pytest
from scipy import stats

from bcr_core.analysis.claims import planning


def exact_mcnemar_power(p10: float, p01: float, n: int, alpha: float) -> float:
    """Power of the two-sided exact conditional McNemar test, written out: the discordant count D is
    Binomial(n, p10 + p01); given D = d, the one-way count B is Binomial(d, p10 / (p10 + p01)); the test
    rejects when the two-sided exact binomial p of B against d / 2 is below alpha."""
    psi, q, power = p10 + p01, p10 / (p10 + p01), 0.0
    for d in range(1, n + 1):
        b = np.arange(d + 1)
        p_two_sided = np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(b, d, 0.5), stats.binom.sf(b - 1, d, 0.5)))
        power += stats.binom.pmf(d, n, psi) * stats.binom.pmf(b, d, q)[p_two_sided < alpha].sum()
    return float(power)


def pilot(p10: float, p01: float, items: int = 1000) -> np.ndarray:
    up, down = round(items * p10), round(items * p01)
    return np.array([1.0] * up + [-1.0] * down + [0.0] * (items - up - down))


@pytest.mark.parametrize("p10, p01, n", [(0.15, 0.08, 200), (0.12, 0.06, 400), (0.10, 0.10, 150), (0.2, 0.05, 60)])
def test_simulated_mcnemar_power_matches_the_exact_binomial_power(p10, p01, n):
    simulated = planning.simulated_power(pilot(p10, p01), n, planning.mcnemar_p, 0.05, simulations=4000, seed=1)
    exact = exact_mcnemar_power(p10, p01, n, 0.05)
    assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / 4000) + 0.005, (simulated, exact)


def test_the_items_found_are_where_the_power_first_reaches_the_target():
    d = pilot(0.15, 0.085)
    n = planning.items_needed(d, planning.mcnemar_p, 0.025, 0.8, max_items=3000, simulations=2000, seed=2)
    assert n is not None
    assert exact_mcnemar_power(0.15, 0.085, n, 0.025) >= 0.77  # simulation error at the boundary
    assert exact_mcnemar_power(0.15, 0.085, int(n * 0.9), 0.025) < 0.8


def test_an_effect_that_max_items_cannot_detect_gives_none_and_the_paper_effect_sizes_when_larger():
    assert planning.items_needed(pilot(0.1, 0.1), planning.mcnemar_p, 0.05, max_items=300, simulations=500) is None
    sized = planning.size_claim("reuse costs accuracy", pilot(0.16, 0.095), 0.025, 0.8, 3000)
    assert sized.paper_effect == 0.137 and sized.items_at_paper < sized.items_at_observed
    assert sized.items == sized.items_at_observed and sized.sized_by == "the pilot's effect"


def test_bcr_plan_writes_a_checked_grid_of_fresh_items_from_the_committed_pilot(tmp_path, capsys):
    """`bcr plan results/claims` for the embedded model's reuse-cost claim: a grid file `bcr grid` accepts,
    with only the conditions the claim reads, the pilot's settings, an item seed no committed folder of the
    model used, n the larger of the two sizes, and a header stating them; a claim it cannot size is one line."""
    import json

    from bcr_core.cli import main
    from bcr_core.paths import RESULTS
    from bcr_core.runs.grid_file import read_grid

    out = tmp_path / "confirm.toml"
    assert main(["plan", str(RESULTS / "claims"), "--claims", "reuse costs accuracy", "--out", str(out)]) == 0
    text = out.read_text()
    (cell,) = read_grid(out)  # every setting checked as `bcr grid` checks it
    assert cell.cell.conditions == ("dense", "kvcomm") and cell.batch == 8
    seeds = {
        (json.loads(p.read_text()).get("extra") or {}).get("seed")
        for p in RESULTS.rglob("cell.json")
        if json.loads(p.read_text()).get("model", "default") == "default"
    }
    assert "item_seed = " in text and int(text.split("item_seed = ")[1].split()[0]) not in seeds
    assert '\nconditions = ["dense", "kvcomm"]\n' in text and 'dtype = "float32"' in text and "fidelity = true" in text
    sized = [line for line in text.splitlines() if line.startswith("#   reuse costs accuracy (exact McNemar): ")]
    assert len(sized) == 1 and "sized by the pilot's effect" in sized[0]
    import re

    observed, paper = map(int, re.search(r": (\d+) items at the pilot's .*, (\d+) at the paper's", sized[0]).groups())
    assert f"\nn = {max(observed, paper)}\n" in text and paper < observed
    capsys.readouterr()
    assert main(["plan", str(RESULTS / "claims"), "--claims", "draft beats coin", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not 'draft beats coin'" in err


def test_a_folder_that_is_no_pilot_is_one_line(tmp_path, capsys):
    """A folder without the pilot's main run (here: an empty one) is a usage error of one line, not a
    StopIteration's traceback."""
    from bcr_core.cli import main

    assert main(["plan", str(tmp_path), "--claims", "reuse costs accuracy", "--out", str(tmp_path / "c.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run in it holds dense, kvcomm, token-matched-dense" in err


def committed(root, name: str, seed: int | None, n: int, first: int = 0, benchmark: str = "synthetic") -> None:
    import json

    draw = ({"seed": seed} if seed is not None else {}) | ({"first": first} if first else {})
    settings = {"benchmark": benchmark, "model": "default", "n": n, "extra": draw, "conditions": ["dense"]}
    (root / name).mkdir()
    (root / name / "cell.json").write_text(json.dumps(settings))


def test_fresh_items_are_found_by_item_sets_not_by_seeds(tmp_path):
    """Seed 1's first 10 items and seed 2's items 50-59 are read: a run of 40 items may take seed 2 (its items
    0-39 were never read), one of 60 may not (items 50-59 were), and another model's or benchmark's folders
    do not count."""
    committed(tmp_path, "pilot", seed=1, n=10)
    committed(tmp_path, "later", seed=2, n=10, first=50)
    committed(tmp_path, "humaneval", seed=None, n=10, benchmark="humaneval")
    settings = {"model": "default", "benchmark": "synthetic"}
    assert planning.fresh_item_seed(settings, 40, tmp_path) == 2
    assert planning.fresh_item_seed(settings, 60, tmp_path) == 3
    assert planning.fresh_item_seed({"model": "other", "benchmark": "synthetic"}, 60, tmp_path) == 1


def test_a_grid_file_keeps_a_quote_and_a_backslash_as_written():
    """Strings are TOML basic strings, escaped: a claim, a pilot path or a setting holding a quote, a backslash,
    a tab or a newline reads back (with Python's own TOML reader) as the very string written."""
    import tomllib

    odd = 'C:\\pilots\\"quoted" one\tand\na line'
    sizing = planning.Sizing("reuse costs accuracy", "exact McNemar", 0.1, 50, None, None, 50, "the pilot's effect")
    text = planning.grid_text([sizing], odd, {"model": odd, "fidelity": True}, 7, 0.05, 0.8)
    grid = tomllib.loads(text)
    assert grid["defaults"]["model"] == odd and grid["defaults"]["fidelity"] is True
    assert grid["defaults"]["confirms"] == ["reuse costs accuracy"] and grid["defaults"]["item_seed"] == 7
    assert tomllib.loads("x = " + planning.toml_value(["\x00\x7f", "é"]))["x"] == ["\x00\x7f", "é"]
