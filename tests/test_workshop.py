"""docs/workshop.md's commands still match the lab: every shell command in it is parsed by the real
command line, and checked further without running the model: `bcr explore` with `--check` (its
parameters against notebook 09, the saved inspection it reads), `bcr notebooks` by the notebooks and
parameters it names, `make` by the Makefile's targets. A stale command fails here."""

from __future__ import annotations

import re
import shlex

import pandas as pd
import pytest

from bcr_core.cli import build_parser, main
from bcr_core.commands import read_parameters
from bcr_core.lab import app, params
from bcr_core.lab.notebooks import declared_parameters, notebook_paths
from bcr_core.paths import CHECKOUT, RESULTS

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


# ------------------------------------------------------------------ the numbers it teaches, from the committed data


def doc_text() -> str:
    return " ".join(DOC.read_text().split())  # line breaks in the prose read as spaces


def verdict(table: pd.DataFrame, claim: str) -> pd.Series:
    return table.set_index("claim").loc[claim]


def test_the_claims_and_curve_it_quotes_are_the_committed_ones():
    """The grid's wasted rows, the verdicts it reads out and the unit curve's gap shares, each
    recomputed here from results/claims (the curve's gap share written out: per prompt, the coin's
    mean error over its seeds minus informed's, over the unrepaired error, then the mean over prompts).
    It is a drift check: it holds the numbers docs/workshop.md quotes equal to the committed grid_table.csv,
    verdicts.csv and unit_curve.csv, so it catches a change to the doc or to those files without judging which
    is right (test_claims.py::test_the_committed_results_give_the_committed_verdicts holds verdicts.csv to the
    code, itself a drift check)."""
    text = doc_text()
    claims = RESULTS / "claims"
    grid = pd.read_csv(claims / "grid_table.csv").set_index("condition").loc["bcr-chunk:chunk=16"]
    assert f"{grid.rows_wasted_per_call:.1f} of {grid.rows_per_reuse_call:.1f} rows per reuse call" in text
    table = pd.read_csv(claims / "verdicts.csv")
    reuse = verdict(table, "reuse costs accuracy")
    assert f"({reuse.verdict}: {100 * reuse.effect:+.1f} points)" in text
    coin = verdict(table, "draft beats coin at chunk granularity")
    said = f"is {coin.verdict} on accuracy ({100 * coin.effect:+.1f} points "
    assert said + f"[{100 * coin.ci_lo:+.1f}, {100 * coin.ci_hi:+.1f}] per item)" in text
    coin_kl = re.search(r"on KL to Dense: ([-+]\d\.\d{4} \[[-+]\d\.\d{4}, [-+]\d\.\d{4}\])", coin.evidence)
    assert f"on KL per item ({coin_kl.group(1)})" in text
    curve = pd.read_csv(claims / "unit_curve.csv")
    share = {}
    for unit in sorted(curve["unit"].unique()):
        per_prompt = []
        for prompt in sorted(curve["prompt"].unique()):
            rows = curve[(curve["unit"] == unit) & (curve["prompt"] == prompt)]
            coin_error = rows[rows["selection"] == "random"]["error"].mean()
            informed = rows[rows["selection"] == "informed"]["error"].iloc[0]
            per_prompt.append((coin_error - informed) / rows["unrepaired_error"].iloc[0])
        share[unit] = 100 * sum(per_prompt) / len(per_prompt)
    said = f"by {share[1]:.0f}% of the unrepaired error at single rows, {share[16]:.0f}% at 16-row chunks, "
    assert said + f"{share[64]:.0f}% at 64 and {share[256]:.0f}% at 256" in text


def test_the_url_it_tells_them_to_open_is_the_one_the_app_prints():
    assert f"`explorer: http://{app.HOST}:8866/`" in doc_text() and "localhost" not in DOC.read_text()


def chunks_of(rows: list[int]) -> list[str]:
    """`[0, 1, 2, 5, 6]` -> `["0-2", "5-6"]`."""
    runs, start = [], rows[0]
    for prev, row in zip(rows, rows[1:] + [None]):
        if row != prev + 1:
            runs.append(f"{start}-{prev}")
            start = row
    return runs


@pytest.fixture(scope="module")
def exercise(tmp_path_factory):
    """Item 4's calls from the committed saved inspection, with Algorithm 2's score worked out here
    (layers 1 and up, heads and draft steps averaged) and the rows of Algorithm 1's chunks at rho 0.2."""
    from types import SimpleNamespace

    from bcr_core.lab import app, saved_inspection

    default = app.explorer_notebook({}, tmp_path_factory.mktemp("explorer")).saved  # what `bcr explore` opens
    saved = saved_inspection.load(default)
    view = saved.view(4, "agent_3")
    rows, chunk, prefix = view.rows, 16, view.segments[0]["stop"]
    attention = view.attention.double()
    score = attention[1:].mean(dim=(1, 2)).sum(dim=0).numpy()
    spans = [(a, min(a + chunk, rows)) for a in range(0, rows, chunk)]
    best = sorted(sorted(spans, key=lambda s: -score[s[0] : s[1]].mean())[: round(0.2 * rows / chunk)])
    return SimpleNamespace(
        saved=saved,
        view=view,
        short=saved.view(4, "agent_1"),
        rows=rows,
        chunk=chunk,
        prefix=prefix,
        shared={r for s in view.segments if s["placeholder"] for r in range(s["start"], s["stop"])},
        attention=attention,
        score=score,
        picked=[r for a, b in best for r in range(a, b)],
    )


def test_exercise_1_the_chunks_algorithm_1_picks(exercise):
    """Algorithm 1's chunk count round(rho M / B) of the best mean-scoring 16-row chunks."""
    e, text = exercise, doc_text()
    assert f"item 4, `agent_3` ({e.rows} cached rows)" in text and f"`agent_1` ({e.short.rows} rows)" in text
    on_prefix = sum(r < e.prefix for r in e.picked)
    runs = chunks_of(e.picked)
    assert f"{len(e.picked)} rows selected, in three chunks: rows {runs[0]}, {runs[1]} and {runs[2]}" in text
    assert f"{on_prefix} of the {len(e.picked)} sit on the agent's own prefix (rows 0-{e.prefix - 1})" in text
    assert f"The prefix takes {100 * e.score[: e.prefix].sum() / e.score.sum():.0f}% of the score mass" in text


def test_exercise_2_single_rows_and_chunk_rounding(exercise):
    """Single rows as the top round(rho M); chunks rounded to whole chunks; a short segment below one chunk."""
    e, text = exercise, doc_text()
    single = ", ".join(str(round(rho * e.rows)) for rho in (0.1, 0.2, 0.3, 0.4))
    assert f"single selects exactly round(ρ·M) rows: {single} of {e.rows}" in text
    assert f"({round(0.1 * e.rows / e.chunk) * e.chunk} rows at ρ = 0.1, {len(e.picked)} at 0.2)" in text
    assert 0.1 * e.short.rows < e.chunk and f"0.1 · {e.short.rows} = {0.1 * e.short.rows:.1f} < {e.chunk} rows" in text


def test_exercise_3_which_layers_score(exercise):
    """The top 20% of rows by the summed score, by layer 0 alone and by layer 3's head 1."""
    import numpy as np

    e, text = exercise, doc_text()

    def top(values, k):
        return set(np.argsort(-values, kind="stable")[:k].tolist())

    def counts(chosen):
        return sum(r < e.prefix for r in chosen), len(chosen & e.shared)

    k = round(0.2 * e.rows)
    summed, layer0 = top(e.score, k), top(e.attention[0].mean(dim=(0, 1)).numpy(), k)
    layer3 = top(e.attention[3, :, 1].mean(dim=0).numpy(), k)
    assert f"{counts(summed)[0]} of the {k} rows are on the exact prefix and {counts(summed)[1]} on the shared" in text
    assert f"with layer 0, none on the prefix and {counts(layer0)[1]} on the shared values" in text
    assert counts(layer0)[0] == 0 and f"head 1 puts {counts(layer3)[0]} on the prefix" in text


def test_exercise_4_each_selectors_lane_against_the_error(exercise):
    """Each selector's lane as the explorer draws it (`microscope.picks`) scored against `kv-error`'s band."""
    import torch

    from bcr_core.lab import microscope

    e, text = exercise, doc_text()
    view, prefix, picked = e.view, e.prefix, e.picked
    error = view.rankings["kv-error"].double()
    assert error[:prefix].sum() / error.sum() < 1e-6  # the prefix is exact: float rounding only
    answer = next(s for s in view.segments if s["name"] == "agent_2_current")
    mass = 100 * error[answer["start"] : answer["stop"]].sum() / error.sum()
    assert f"(rows {answer['start']}-{answer['stop'] - 1}) holds {mass:.0f}% of the error mass" in text
    lanes = microscope.picks(view, len(picked), e.chunk)
    searched = lanes.pop("searched")
    assert sorted(lanes["draft"]) == picked and len(lanes) == 11 and "of the eleven" in text
    found = view.searched[len(picked)]
    assert len(searched) == len(picked) and not any(r < prefix for r in searched)
    assert f"its {len(searched)} rows, none on the prefix, leave {found['kl']:.3f} nats" in text
    assert f"where the unrepaired cache leaves {found['unrepaired_kl']:.3f}" in text
    assert view.answer_with(None, searched, 32) == view.dense_text and "gives Dense's answer too" in text

    def cover(name):
        return f"{100 * error[torch.tensor(lanes[name])].sum() / error.sum():.0f}%"

    on_prefix = sum(r < prefix for r in picked)
    assert f"puts {on_prefix} of its {len(picked)} rows on the prefix and covers {cover('draft')} of the error" in text
    assert cover("kv-error") == cover("cacheblend:layer=3")
    assert (
        f"`kv-error` and CacheBlend at check layer 3 cover {cover('kv-error')}, a coin {cover('coin:seed=0')}" in text
    )

    def answer_of(name):
        return view.answers[(tuple(lanes[name]), e.saved.parameters["max_new_tokens"])]

    assert " ".join(answer_of("kv-error").split()).startswith("The other agents: Tom: Tom:")
    assert f'Dense\'s "{view.dense_text}"' in text
    assert [name for name in lanes if answer_of(name) == view.dense_text] == ["ours"]
