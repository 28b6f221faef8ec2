"""The synthetic record-lookup task: generator and scorer."""

import pytest

from bcr_core.data import benchmarks, synthetic
from bcr_core.errors import UsageError


def test_reproducible_for_a_seed():
    assert synthetic.make_items(20, seed=3) == synthetic.make_items(20, seed=3)


def test_prefix_does_not_depend_on_n():
    assert synthetic.make_items(5, seed=3) == synthetic.make_items(12, seed=3)[:5]


def test_different_across_seeds():
    a = [item["question"] for item in synthetic.make_items(20, seed=0)]
    b = [item["question"] for item in synthetic.make_items(20, seed=1)]
    assert a != b and len(set(a) & set(b)) < 3


def test_answers_come_from_the_record_list():
    items = synthetic.make_items(50, seed=0)
    assert len({item["id"] for item in items}) == 50
    for item in items:
        assert set(item) >= {"id", "question", "answer", "records", "field", "person"}
        assert len(item["records"]) == synthetic.DEFAULT_N_RECORDS
        assert [item["field"], item["answer"]] in item["records"]
        records, question = item["question"].split("\n\n")
        assert item["answer"] in records and item["answer"] not in question
        assert len({value for _, value in item["records"]}) == len(item["records"])
    assert len({item["field"] for item in items}) == len(synthetic.FIELDS)


def test_n_records_controls_the_list_length():
    for n_records in (1, 3, len(synthetic.FIELDS)):
        for item in synthetic.make_items(5, seed=2, n_records=n_records):
            assert len(item["question"].split("\n\n")[0].splitlines()) == n_records
    with pytest.raises(UsageError, match="n_records"):
        synthetic.make_items(1, n_records=len(synthetic.FIELDS) + 1)


def test_measured_accuracy_is_recorded_for_the_default():
    runs = [
        r for r in synthetic.MEASURED_DENSE["runs"] if r["n_records"] == synthetic.DEFAULT_N_RECORDS and "note" not in r
    ]
    assert runs and all(r["n"] >= 50 and 0.5 <= r["accuracy"] < 1.0 for r in runs)


ITEM = {
    "id": "t",
    "question": "...",
    "answer": "Tokyo",
    "records": [["city", "Tokyo"], ["pet", "cat"], ["age", "42"], ["room", "420"]],
}


@pytest.mark.parametrize(
    "text, correct, pred",
    [
        ("Tokyo", True, "Tokyo"),
        ("Maria lives in tokyo.", True, "Tokyo"),
        ("The answer is **Tokyo**, I think.", True, "Tokyo"),
        ("Maria's pet is a cat. She lives in Tokyo.", False, "cat"),  # another value named first
        ("She lives in Kyoto.", False, None),
        ("Tokyoite", False, None),
        ("Room 4200", False, None),
    ],
)
def test_scorer(text, correct, pred):
    result = synthetic.score_answer(text, ITEM)
    assert result["correct"] is correct and result["pred"] == pred


def test_numbers_match_whole_words_only():
    item = dict(ITEM, answer="42")
    assert synthetic.score_answer("She is 42 years old.", item)["correct"]
    assert not synthetic.score_answer("Her room is 420.", item)["correct"]


def test_dispatcher_scores_synthetic():
    item = synthetic.make_items(1, seed=0)[0]
    assert benchmarks.score("synthetic", f"It is {item['answer']}.", item)["correct"]
    assert not benchmarks.score("synthetic", "No idea.", item)["correct"]
