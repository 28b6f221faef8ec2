"""A confirmation read as its own family (`analysis.claims.confirmation`), on run folders written out by hand: its
planned claims only, on exactly its n items; a world where the effect is absent never reads "holds"; fewer
items than planned read "incomplete"; items a pilot read are refused in one line; the pilot's own family
never takes the confirmation's items."""

import json

import pytest

from bcr_core.analysis.claims import confirmation
from bcr_core.analysis.reports import claims_grid
from bcr_core.errors import UsageError
from bcr_core.run_folder import RunFolder

PLANNED = ["reuse costs accuracy", "the approximation costs accuracy"]


def write_run(path, right: dict[str, int], held: int, n: int = 400, seed: int = 9, confirms=PLANNED):
    """A run folder of `held` items per condition, each condition right on its first k items."""
    path.mkdir(parents=True)
    settings = {"benchmark": "synthetic", "n_agents": 3, "conditions": list(right), "n": n, "max_new_tokens": 8}
    settings |= {"model": "default", "extra": {"seed": seed}} | ({"confirms": confirms} if confirms else {})
    (path / "cell.json").write_text(json.dumps(settings))
    items, calls = [], []
    for condition, k in right.items():
        for i in range(held):
            item = {"condition": condition, "item_id": f"s{seed}-{i}", "index": i, "correct": i < k}
            items.append(item | {"final_text": "A" if i < k else f"{condition} wrong", "reuse_rate": 0.0})
            reason = "reuse" if condition == "kvcomm" else "dense"
            calls.append({"condition": condition, "item_id": f"s{seed}-{i}", "node": "agent_1", "reason": reason})
            calls[-1] |= {"rows_recomputed": 0, "cached_rows": 100, "ids_match": True}
    (path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    (path / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in calls))
    return RunFolder(path)


def read(run) -> dict[str, str]:
    table = confirmation.confirmation_verdicts(run)
    return dict(zip(table["claim"], table["verdict"]))


def test_a_confirmation_where_the_effects_hold_reads_holds_on_its_planned_claims_only(tmp_path):
    run = write_run(tmp_path / "c", {"dense": 300, "token-matched-dense": 296, "kvcomm": 240}, held=400)
    table = confirmation.confirmation_verdicts(run)
    assert list(table["claim"]) == PLANNED and set(table["verdict"]) == {"holds"} and set(table["n"]) == {400}


@pytest.mark.parametrize("kvcomm", [300, 296, 304], ids=["as-dense", "within-tax", "above"])
def test_where_the_effect_is_absent_a_confirmation_never_reads_holds(tmp_path, kvcomm):
    run = write_run(tmp_path / "c", {"dense": 300, "token-matched-dense": 300, "kvcomm": kvcomm}, held=400)
    assert "holds" not in read(run).values()


def test_fewer_items_than_planned_is_incomplete_and_more_are_read_on_the_first_n(tmp_path):
    short = write_run(tmp_path / "short", {"dense": 300, "token-matched-dense": 296, "kvcomm": 240}, held=399)
    table = confirmation.confirmation_verdicts(short)
    assert set(table["verdict"]) == {"incomplete"} and table["p"].isna().all()
    assert "fewer than the 400 items planned (dense 399, kvcomm 399, token-matched-dense 399)" in table["evidence"][0]
    # 600 held, the last 200 against the claim: read on the first 400 only, so it still holds
    more = write_run(tmp_path / "more", {"dense": 300, "token-matched-dense": 296, "kvcomm": 240}, held=600)
    assert set(read(more).values()) == {"holds"}


def test_a_confirmation_on_the_pilots_items_is_refused_in_one_line_and_the_pilot_never_reads_it(tmp_path):
    right = {"dense": 150, "token-matched-dense": 148, "kvcomm": 120}
    write_run(tmp_path / "root" / "a", right, held=200, n=200, seed=0, confirms=None)
    run = write_run(tmp_path / "root" / "confirm-1", right, held=400, seed=0)
    with pytest.raises(UsageError) as err:
        confirmation.confirmation_verdicts(run, root=tmp_path / "root")
    assert (
        "\n" not in str(err.value)
        and "item seed 0" in str(err.value)
        and str(tmp_path / "root" / "a") in str(err.value)
    )
    items, _ = claims_grid.load_runs(tmp_path / "root")
    assert set(items["run"]) == {"a"} and len(items) == 3 * 200
    fresh = write_run(tmp_path / "root" / "confirm-2", right, held=400, seed=4)
    confirmation.confirmation_verdicts(fresh, root=tmp_path / "root")  # item seed 4: nobody read it


def test_the_committed_confirmation_gives_the_documented_verdicts():
    """results/claims/confirm-1 (SmolLM2's confirmation of its two reuse-cost rows): read as its own family on its
    489 planned items, both hold, and docs/results.md shows exactly that table. The docs part is a drift
    check: it holds the table the code prints from the committed records equal to the lines of
    docs/results.md, so it catches a change to either without judging which is right; the reading itself is
    checked on hand-written runs by
    test_a_confirmation_where_the_effects_hold_reads_holds_on_its_planned_claims_only and
    test_where_the_effect_is_absent_a_confirmation_never_reads_holds."""
    from bcr_core.analysis.reports import claims_report
    from bcr_core.paths import CHECKOUT, RESULTS

    run = RunFolder(RESULTS / "claims" / "confirm-1")
    table = confirmation.confirmation_verdicts(run, root=RESULTS)
    assert list(table["claim"]) == PLANNED and set(table["verdict"]) == {"holds"} and set(table["n"]) == {489}
    shown_in = (CHECKOUT / "docs" / "results.md").read_text()
    for line in claims_report.markdown(table).splitlines()[:4]:
        assert line in shown_in, line


def test_a_confirmation_overlapping_a_pilots_items_from_another_first_item_is_refused(tmp_path):
    """Freshness compares the items read, not the draws: a HumanEval confirmation from item 100 reads items
    100-139 of a pilot of items 0-139 (their draws differ: first 100 against first 0), and is refused; one
    from item 140 reads none of them."""
    pilot = {"benchmark": "humaneval", "n_agents": 3, "conditions": ["dense"], "n": 140, "model": "qwen2.5-coder-0.5b"}
    (tmp_path / "root" / "pilot").mkdir(parents=True)
    (tmp_path / "root" / "pilot" / "cell.json").write_text(json.dumps(pilot | {"extra": {}}))
    overlapping = pilot | {"n": 40, "extra": {"first": 100}, "confirms": PLANNED}
    with pytest.raises(UsageError, match="reads 40 of its 40 items that .*pilot"):
        confirmation.check_fresh(overlapping, tmp_path / "root", "confirm")
    confirmation.check_fresh(pilot | {"n": 24, "extra": {"first": 140}, "confirms": PLANNED}, tmp_path / "root", "c")
