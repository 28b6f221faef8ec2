"""The one `name[@value][:key=value,...]` grammar of conditions and arena selectors: each piece
against hand-written expectations, then both families read through it the same way."""

import pytest

from bcr_core import spec_grammar
from bcr_core.arena.registry import make_entries, parse_spec
from bcr_core.conditions import CONDITIONS, condition, expand_seeds, parse, with_options
from bcr_core.errors import UsageError
from bcr_core.setting_kinds import Int, Str
from bcr_core.spec_grammar import Option

TAKES = {"chunk": Option(Int(1), 64), "rank": Option(Str(("all", "predicted")), "all")}


def test_a_spec_splits_into_name_value_and_option_pieces():
    assert spec_grammar.split(" bcr-chunk@0.2:chunk=16, rank=predicted ,") == (
        "bcr-chunk",
        "0.2",
        ["chunk=16", "rank=predicted"],
    )
    assert spec_grammar.split("dense") == ("dense", "", [])
    assert spec_grammar.split("cacheblend:layer=3") == ("cacheblend", "", ["layer=3"])


def test_options_are_read_as_their_kind_and_every_mistake_is_one_line_naming_it():
    read = lambda pairs: spec_grammar.read_options("x:...", "condition", "x", pairs, TAKES)
    assert read(["chunk=16", "rank=predicted"]) == {"chunk": 16, "rank": "predicted"}
    assert read([]) == {}
    with pytest.raises(UsageError, match=r"^cannot read condition 'x:...': option 'chunk' is not key=value$"):
        read(["chunk"])
    with pytest.raises(
        UsageError, match=r"^condition 'x' takes no option 'rho' \(in 'x:...'\); its options: chunk, rank$"
    ):
        read(["rho=0.2"])
    with pytest.raises(
        UsageError, match=r"^condition 'x:...': option chunk: expected int >= 1, got 0 \(0 is outside >= 1\)$"
    ):
        read(["chunk=0"])
    with pytest.raises(UsageError, match=r"its options: none$"):
        spec_grammar.read_options("seams:k=1", "selector", "seams", ["k=1"], {})


def test_a_label_sorts_options_and_writes_floats_short():
    assert spec_grammar.label("dense") == "dense"
    assert spec_grammar.label("bcr-chunk", 0.2, {"rank": "predicted", "chunk": 16}) == (
        "bcr-chunk@0.2:chunk=16,rank=predicted"
    )
    assert spec_grammar.label("kvcomm", 0.30000, {"gamma": 0.50}) == "kvcomm@0.3:gamma=0.5"
    assert spec_grammar.label("coin", None, {"seed": 0}) == "coin:seed=0"


def test_a_seedless_coin_runs_once_per_seed_and_nothing_else_does():
    specs = ["coin-chunk", "coin-chunk:seed=4", "dense", "coin-single:chunk=8", "random-alloc", "coin"]
    assert spec_grammar.expand_seeds(specs, [0, 1]) == [
        "coin-chunk:seed=0",
        "coin-chunk:seed=1",
        "coin-chunk:seed=4",
        "dense",
        "coin-single:chunk=8,seed=0",
        "coin-single:chunk=8,seed=1",
        "random-alloc",  # a seeded stream, but no coin: one run unless its seed is written
        "coin:seed=0",
        "coin:seed=1",
    ]
    assert spec_grammar.expand_seeds(specs, None) == specs
    assert spec_grammar.expand_seeds(specs, []) == specs


def test_a_label_built_from_parts_is_the_one_a_written_spec_reads_as():
    """Conditions and selectors alike: options at their defaults left out, a coin's seed kept."""
    assert condition("bcr-chunk", 0.2, chunk=64, rank="all") == "bcr-chunk@0.2"
    assert condition("coin-chunk", 0.2, chunk=16, seed=0) == "coin-chunk@0.2:chunk=16,seed=0"
    assert condition("random-alloc", 0.25, seed=0) == "random-alloc@0.25"
    assert condition("kvcomm", 0.3) == "kvcomm" and condition("kvcomm", 0.5, gamma=None) == "kvcomm@0.5"
    assert with_options("bcr-chunk:chunk=16", rank="predicted") == "bcr-chunk:chunk=16,rank=predicted"
    assert make_entries("coin:seed=0,draft:rank=all")[0].label == "coin:seed=0"
    assert make_entries("coin:seed=0,draft:rank=all")[1].label == "draft"
    with pytest.raises(UsageError, match="condition 'bcr-chunk' takes no option 'layer'"):
        condition("bcr-chunk", 0.2, layer=3)


def test_conditions_and_selectors_share_the_grammar():
    assert parse("bcr-chunk@0.2:rank=predicted,chunk=16").label == "bcr-chunk@0.2:chunk=16,rank=predicted"
    assert expand_seeds(["coin-chunk@0.3", "bcr-chunk"], [2, 3]) == [
        "coin-chunk@0.3:seed=2",
        "coin-chunk@0.3:seed=3",
        "bcr-chunk",
    ]
    assert (parse_spec("cacheblend:layer=3").name, parse_spec("cacheblend:layer=3").options) == (
        "cacheblend",
        {"layer": 3},
    )
    assert [e.label for e in make_entries("coin,draft:k=3,cacheblend:layer=1", seeds=[0, 1])] == [
        "coin:seed=0",
        "coin:seed=1",
        "draft:k=3",
        "cacheblend",  # at its default layer
    ]
    for bad, message in [
        ("cacheblend:depth=2", r"selector 'cacheblend' takes no option 'depth' \(in 'cacheblend:depth=2'\)"),
        ("draft@3", r"selector 'draft@3': a selector takes options \(name:key=value\), not an @value"),
        ("bcr-chunk:rho=0.2", r"condition 'bcr-chunk' takes no option 'rho'"),
    ]:
        with pytest.raises(UsageError, match=message):
            parse(bad) if bad.startswith("bcr") else parse_spec(bad)


def test_a_spec_is_one_value_read_or_made_and_written_back_the_same():
    """Equality is the written name, value and options (settings are `Condition.settings`'s question);
    defaults are filled from the spec's family; an old selector name reads as today's."""
    assert parse("bcr-chunk@0.2:chunk=16,rank=all") == parse("bcr-chunk@0.2:rank=all, chunk=16")
    assert parse("bcr-chunk@0.2:chunk=16") != parse("bcr-chunk@0.2")
    assert parse("bcr-chunk@0.2").settings == parse("bcr-chunk:chunk=64").settings
    assert str(parse("kvcomm@0.3:gamma=0.5")) == "kvcomm@0.3:gamma=0.5"
    assert parse("bcr-chunk").option("chunk") == 64 and parse("bcr-chunk:chunk=8").option("chunk") == 8
    assert parse("bcr-chunk").default_value == 0.2 and parse("opengate").default_value == 0.5
    assert parse("coin-chunk@0.3").with_options(seed=2).label == "coin-chunk@0.3:seed=2"
    assert parse_spec("oracle-attn:rank=predicted").label == "kv-error-attn:rank=predicted"
    assert parse_spec("draft").option("k") == 2 and parse_spec("cacheblend").option("layer") == 1
    assert CONDITIONS.made("coin-single", 0.2, seed=0, rank="all").label == "coin-single@0.2:seed=0"
    with pytest.raises(UsageError, match=r"^cannot read condition 'bcr-chunk@x': expected name\[@number\]"):
        parse("bcr-chunk@x")
    with pytest.raises(UsageError, match=r"^unknown selector 'bcr-chunk'; known: kv-error, kv-error-attn, draft"):
        parse_spec("bcr-chunk@0.2")
