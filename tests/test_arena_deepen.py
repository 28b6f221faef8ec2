"""`bcr arena-deepen` on a tiny random model: an arena run whose searches stop at a small cap,
continued. Each continued search ends at a local optimum (every neighbour written out here and
measured by hand leaves no less KL), never above the KL it stopped at; everything else is the
source's record; records another model made are refused; a cut-short deepening resumes to the same
records."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from bcr_core.arena import ceiling, search
from bcr_core.arena.deepen import capped, continued, deepen, shares_before_after
from bcr_core.arena.run import make_arena_cell, run_arena
from bcr_core.cli import main
from bcr_core.errors import UsageError
from bcr_core.run_folder import read_jsonl
from tests.test_arena import IDS, M, assembled  # noqa: F401  (the shared fixture)
from tests.test_arena_search import CHUNK, arena_call, dense, entry, kl_by_hand  # noqa: F401

SHORT, LONG = "searched:cap=1,evals=2", "searched:cap=1,evals=400"


def neighbours(rows: tuple[int, ...], m: int, chunk: int) -> set[tuple[int, ...]]:
    """Written out: for every ordered pair of chunks, the donor's last t chosen rows out and the
    receiver's first t unchosen rows in, t the fewer of the two."""
    chunks = [range(s, min(s + chunk, m)) for s in range(0, m, chunk)]
    out = set()
    for donor in chunks:
        for receiver in chunks:
            give = [j for j in donor if j in rows]
            room = [j for j in receiver if j not in rows]
            t = min(len(give), len(room))
            if donor != receiver and t:
                out.add(tuple(sorted((set(rows) - set(give[len(give) - t :])) | set(room[:t]))))
    return out


def test_a_search_continued_from_where_its_cap_stopped_it_ends_at_a_local_optimum(tiny, assembled, dense):  # noqa: F811
    _, kv = assembled
    tokens, reference, dense_logits = dense
    short = arena_call(tiny, kv, reference, f"draft,coin:seed=0,seams,{SHORT}", [0.3])
    stopped, record = entry(short, "searched", "0.3"), short["search"][SHORT]["0.3"]
    assert record["case"] == "local" and not record["local_optimum"]
    start = tuple(search.rows_of(stopped["runs"]))
    seeds = {tuple(search.rows_of(e["runs"])): e["kl"] for e in short["entries"] if e is not stopped}
    seeds = {rows: kl for rows, kl in seeds.items() if len(rows) == len(start)}
    measure = lambda sets: [kl_by_hand(tiny, tiny.repair(kv, IDS[:-1], list(s)), tokens, dense_logits) for s in sets]  # noqa: E731
    seen = seeds | {start: stopped["kl"]}
    best, spent, local = search.local_search(measure, seen, start, M, CHUNK, search.chunk_votes(seeds, M, CHUNK), 400)
    assert local and 0 < spent < 400
    assert seen[best] <= stopped["kl"] + 1e-12
    around = neighbours(best, M, CHUNK)
    assert around and min(measure(sorted(around))) >= seen[best] - 1e-7  # no move improves: a local optimum


@pytest.fixture(scope="module")
def deepened(tiny_chat, tmp_path_factory):
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("deepened")
    cell = make_arena_cell(
        n=3, agents=2, max_new_tokens=4, item_seed=34, gamma=1.0, rhos=(0.3,), selectors=f"draft,coin,seams,{SHORT}"
    )
    run_arena(tiny_chat, cell, source, progress=False)
    count = deepen(tiny_chat, source, out, 400, progress=False)
    return source, out, count


def arena_calls(folder):
    return [c for c in read_jsonl(folder / "calls.jsonl") if "arena" in c]


def test_every_capped_search_is_continued_to_a_local_optimum_and_never_ends_above_its_start(deepened):
    source, out, count = deepened
    before, after = arena_calls(source), arena_calls(out)
    stopped = sum(len(capped(c)) for c in before)
    assert stopped > 0 and count == stopped
    assert json.loads((out / "cell.json").read_text())["selectors"][-1] == LONG
    improved = 0
    for old, new in zip(before, after, strict=True):
        assert (old["item_id"], old["node"]) == (new["item_id"], new["node"])
        for budget in capped(old):
            record = new["arena"]["search"][LONG][budget]
            assert record["local_optimum"] and record["deepened"]["evaluations"] > 0
            assert (
                record["evaluations"]
                == old["arena"]["search"][SHORT][budget]["evaluations"] + record["deepened"]["evaluations"]
            )
        for e_old, e_new in zip(old["arena"]["entries"], new["arena"]["entries"], strict=True):
            if e_old["selector"] == SHORT:
                assert e_new["selector"] == LONG and e_new["rows"] == e_old["rows"]
                assert e_new["kl"] <= e_old["kl"] + 1e-12
                improved += e_new["kl"] < e_old["kl"]
            else:
                assert e_new == e_old  # every selector's own record is the source's
    assert improved > 0
    assert ceiling.violations(read_jsonl(out / "calls.jsonl")).empty
    summary = continued(after)
    assert summary["searches"].sum() == stopped and (summary["local_optimum"] == 1.0).all()
    assert (summary["kl_after"] <= summary["kl_before"] + 1e-12).all()
    assert (summary["found_better"] * summary["searches"]).sum() == pytest.approx(improved)
    assert read_jsonl(out / "items.jsonl") == read_jsonl(source / "items.jsonl")


def test_a_cut_short_deepening_resumes_to_the_same_records(tiny_chat, deepened, tmp_path):
    source, out, _ = deepened
    shutil.copytree(out, tmp_path / "out")
    items = (tmp_path / "out" / "items.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "out" / "items.jsonl").write_text("".join(items[:-1]))  # the last item's line lost in a crash
    deepen(tiny_chat, source, tmp_path / "out", 400, progress=False)
    strip = lambda calls: [
        {**c, "arena": {**c["arena"], "cost": None, "search": None}} if "arena" in c else c for c in calls
    ]  # noqa: E731
    timeless = lambda folder: [
        {k: v for k, v in c.items() if not k.endswith("_s")} for c in strip(read_jsonl(folder / "calls.jsonl"))
    ]
    assert timeless(tmp_path / "out") == timeless(out)


def test_records_another_model_made_are_refused_naming_the_call(tiny_chat, deepened, tmp_path):
    source, _, _ = deepened
    shutil.copytree(source, tmp_path / "source")
    calls = read_jsonl(source / "calls.jsonl")
    first = next(i for i, c in enumerate(calls) if capped(c))
    budget = capped(calls[first])[0]
    for e in calls[first]["arena"]["entries"]:
        if e["selector"] == SHORT and e["budget"] == budget:
            e["kl"] *= 1.1  # what this code and model do not measure
    (tmp_path / "source" / "calls.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    with pytest.raises(
        UsageError, match=f"item {calls[first]['item_id']}, call {calls[first]['node']}: .* budget {budget}"
    ):
        deepen(tiny_chat, tmp_path / "source", tmp_path / "out", 400, progress=False)


def test_a_cap_not_above_the_runs_is_one_line_before_any_work(deepened, tmp_path, capsys):
    source, _, _ = deepened
    assert main(["arena-deepen", str(source), "--out", str(tmp_path / "x"), "--evals", "2"]) == 2
    assert "--evals 2 is not above the run's cap of 2" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_committed_records_hold_the_searches_their_cap_stopped():
    """A drift check: it holds `capped`'s count on the committed results/arena records equal to the number
    docs/results.md quotes (typed here), so it catches a change to the code, the records or the docs without
    judging which is right."""
    calls = [json.loads(line) for line in gzip.open("results/arena/calls.jsonl.gz", "rt")]
    assert sum(len(capped(c)) for c in calls) == 912 + 29  # docs/results.md: the share the cap stopped


def test_a_lower_ceiling_can_only_shrink_every_selectors_share_of_its_gain(deepened):
    source, out, _ = deepened
    shares = shares_before_after(source, out).set_index("selector")
    assert shares.loc["searched", "gap_share_before"] == shares.loc["searched", "gap_share_after"] == 1.0
    rest = shares.drop(index="searched")
    assert len(rest) and (rest["gap_share_after"].abs() <= rest["gap_share_before"].abs() + 1e-12).all()


@pytest.mark.parametrize("source", ["arena", "arena-gemma-3-270m-bos"], ids=["smollm2-135m", "gemma-3-270m"])
def test_the_committed_deepened_ceilings_end_every_capped_search_at_a_local_optimum(source):
    """results/<arena>-deepened holds every item of its source, and every search the cap stopped there,
    continued to a local optimum, its KL never above where it stopped; the largest move of a
    selector's share that docs/results.md quotes is what these records give. That last part is a drift
    check: it holds `shares_before_after` on the committed records equal to the number docs/results.md and
    the folder's README quote, so it catches a change to the code or to any of those files without judging
    which is right; the continuation itself is checked on a tiny run, every neighbour measured by hand, by
    test_a_search_continued_from_where_its_cap_stopped_it_ends_at_a_local_optimum."""
    from bcr_core.paths import CHECKOUT, RESULTS
    from bcr_core.run_folder import RunFolder

    first, deeper = RunFolder(RESULTS / source).calls(), RunFolder(RESULTS / f"{source}-deepened").calls()
    assert {c["item_id"] for c in deeper} == {c["item_id"] for c in first}
    table = continued(deeper)
    assert table["searches"].sum() == sum(len(capped(c)) for c in first) > 0
    assert (table["local_optimum"] == 1.0).all() and (table["kl_after"] <= table["kl_before"]).all()
    shares = shares_before_after(RESULTS / source, RESULTS / f"{source}-deepened").set_index("selector")
    moved = (shares["gap_share_after"] - shares["gap_share_before"]).abs()
    results = (CHECKOUT / "docs" / "results.md").read_text()
    paragraph = results.split("**How far the cap leaves the ceiling from a local optimum.**")[1].split("\n\n")[0]
    readme = " ".join((RESULTS / f"{source}-deepened" / "README.md").read_text().split())
    assert f"{moved.max():.4f}" in paragraph and f"moved by at most {moved.max():.4f}" in readme
