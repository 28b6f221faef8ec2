"""One settings model (`bcr_core.setting_kinds`) for `bcr run`, `bcr grid` and the notebooks' parameter
cells: the same bad value is refused with the same words on each, under that surface's name for the key."""

import pytest

from bcr_core import cli
from bcr_core.conditions import parse
from bcr_core.errors import UsageError
from bcr_core.lab import params
from bcr_core.runs.run_settings import check_run
from bcr_core.setting_kinds import SettingError

# (key, a bad value, the CLI's spelling of it, what every surface must say after the key)
CASES = [
    ("agents", 9, ["--agents", "9"], "expected int in [2, 5], got 9 (9 is outside in [2, 5])"),
    ("n", 0, ["--n", "0"], "expected int >= 1, got 0 (0 is outside >= 1)"),
    ("max_new_tokens", 0, ["--max-new-tokens", "0"], "expected int >= 1, got 0 (0 is outside >= 1)"),
    ("item_seed", -1, ["--item-seed", "-1"], "expected int >= 0, got -1 (-1 is outside >= 0)"),
]


def run_argv(flag: list[str], out) -> list[str]:
    argv = ["run", "--benchmark", "synthetic", "--conditions", "dense", "--n", "2", "--out", str(out)]
    if flag[0] == "--n":
        argv[argv.index("--n") + 1] = flag[1]
        return argv
    return argv + flag


@pytest.mark.parametrize("key, value, flag, detail", CASES)
def test_one_bad_value_one_line_on_every_surface(key, value, flag, detail, tmp_path, capsys):
    # bcr run: the key as its option
    assert cli.main(run_argv(flag, tmp_path / "run")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"bcr run: error: {flag[0]}: {detail}"
    # bcr grid: the key where the file sets it
    grid = tmp_path / "grid.toml"
    grid.write_text(f'[defaults]\nbenchmark = "synthetic"\nconditions = ["dense"]\nn = 2\n[cells.a]\n{key} = {value}\n')
    assert cli.main(["grid", str(grid), "--out", str(tmp_path / "g")]) == 2
    assert capsys.readouterr().err.strip() == f"bcr grid: error: {grid}: cells.a.{key}: {detail}"
    # a notebook's parameter cell
    with pytest.raises(params.ParameterError) as refused:
        params.check(**{key: value})
    assert str(refused.value) == f"parameter {key!r}: {detail}"


def test_an_error_carries_its_key_so_no_caller_reads_the_message():
    """Checks that read two settings say which one is wrong through the error's key."""
    cases = [
        (dict(benchmark="synthetic", pinned="Nobody"), "pinned"),
        (dict(benchmark="synthetic", agents=6), "agents"),
        (dict(conditions="dense,kvcom"), "conditions"),
        (dict(seeds=[-1]), "seeds"),
        (dict(fidelity=1), "fidelity"),
    ]
    for settings, key in cases:
        with pytest.raises(SettingError) as refused:
            check_run(settings)
        assert refused.value.key == key and str(refused.value).startswith(f"--{key}: ")
    with pytest.raises(SettingError, match="unknown setting"):
        check_run({"agent": 3})


def test_a_grid_default_is_blamed_where_it_was_set(tmp_path, capsys):
    """A bad value the cell inherits is named in [defaults]; one the cell sets, in the cell."""
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[defaults]\nbenchmark = "synthetic"\nconditions = "dense,kvcomm"\nn = 2\npinned = "Nobody"\n[cells.a]\n'
    )
    assert cli.main(["grid", str(grid), "--out", str(tmp_path / "g")]) == 2
    assert "defaults.pinned: unknown role 'Nobody'" in capsys.readouterr().err
    grid.write_text(
        '[defaults]\nbenchmark = "synthetic"\nconditions = "dense,kvcomm"\nn = 2\n[cells.a]\nreference = "opengate"\n'
    )
    assert cli.main(["grid", str(grid), "--out", str(tmp_path / "g")]) == 2
    assert "cells.a.reference: opengate is not among the conditions: dense, kvcomm" in capsys.readouterr().err


def test_condition_options_use_the_same_validator():
    with pytest.raises(UsageError) as refused:
        parse("bcr-chunk:chunk=0")
    assert (
        str(refused.value)
        == "condition 'bcr-chunk:chunk=0': option chunk: expected int >= 1, got 0 (0 is outside >= 1)"
    )
    with pytest.raises(UsageError, match=r"option gamma: expected float \(a number\) in \[0, 1\], got 1.5"):
        parse("kvcomm:gamma=1.5")
    assert parse("bcr-grow:tau=0.5,span_cap=3").options == {"tau": 0.5, "span_cap": 3}


def test_every_option_of_every_condition_reads_its_own_default_back():
    """Written out as `name:key=default`, each option parses to its default (opengate's gamma was
    declared with `float` for its kind, and reading it crashed instead of parsing)."""
    from bcr_core.conditions import DEFINITIONS

    for name, spec in DEFINITIONS.items():
        for key, option in spec.options.items():
            text = f"{option.default:g}" if isinstance(option.default, float) else str(option.default)
            assert parse(f"{name}:{key}={text}").option(key) == option.default, (name, key)


def test_every_condition_is_one_definition_and_the_readme_lists_each():
    from bcr_core.conditions import DEFINITIONS
    from bcr_core.paths import CHECKOUT

    table = (CHECKOUT / "README.md").read_text().split("| condition | what it is |")[1].split("\n\n")[0]
    for name, spec in DEFINITIONS.items():
        assert spec.about and f"`{name}" in table, name
        assert (spec.layout is None) == (spec.budget(parse(f"{name}@0.3")) is None), name  # a budget iff a layout


# ---------------------------------------------------------------- flags generated from the schema
def parsed(argv: list[str]):
    return cli.build_parser().parse_args(argv)


def test_bcr_run_s_flags_read_back_every_run_setting_at_its_default():
    from bcr_core.commands import settings_of
    from bcr_core.schema import RUN

    args = parsed(["run", "--benchmark", "synthetic", "--conditions", "dense,kvcomm", "--n", "3", "--out", "x"])
    given = {"benchmark": "synthetic", "conditions": "dense,kvcomm", "n": 3}
    assert settings_of(args, RUN) == {key: given.get(key, s.default) for key, s in RUN.items()}
    args = parsed(["run", "--benchmark", "mmlu", "--conditions", "dense", "--n", "1", "--out", "x", "--seeds", "4,5"])
    assert settings_of(args, RUN)["seeds"] == [4, 5] and args.fidelity is False


def test_bcr_arena_s_flags_are_the_arena_schema_with_its_own_defaults():
    from bcr_core import paper
    from bcr_core.arena.run import make_arena_cell
    from bcr_core.commands import settings_of
    from bcr_core.schema import ARENA, RUN

    settings = settings_of(parsed(["arena", "--n", "5", "--out", "x"]), ARENA)
    assert settings == {key: s.default for key, s in ARENA.items()} | {"n": 5}
    # the arena's own defaults, where they differ from `bcr run`'s: a task `bcr run` makes the user name, and
    # shorter answers than a run's
    run = settings_of(parsed(["run", "--benchmark", "mmlu", "--conditions", "dense", "--n", "5", "--out", "x"]), RUN)
    with pytest.raises(SystemExit):
        parsed(["run", "--conditions", "dense", "--n", "5", "--out", "x"])  # no --benchmark
    assert settings["benchmark"] == "synthetic" and settings["max_new_tokens"] < run["max_new_tokens"]
    cell = make_arena_cell(**settings)  # the cell serves at the settings' budget and unit and sweeps their rhos
    assert cell.conditions == (f"bcr-chunk@{settings['rho']:g}:chunk={settings['chunk']}",) and cell.fidelity
    assert cell.rhos == tuple(settings["rhos"]) and settings["rho"] == paper.RHO  # serving at the paper's budget
    assert make_arena_cell(**settings | {"rho": 0.3, "chunk": 8}).conditions == ("bcr-chunk@0.3:chunk=8",)


def test_each_generated_flag_shows_its_setting_s_help_and_choices():
    from bcr_core.schema import ARENA

    arena = cli.build_parser()._subparsers._group_actions[0].choices["arena"]
    flags = {a.dest: a for a in arena._actions}
    for key, setting in ARENA.items():
        assert flags[key].help == setting.help and flags[key].option_strings == ["--" + key.replace("_", "-")]
    assert tuple(flags["prompt"].choices) == ("standard", "one-shot") and flags["n"].required


def test_make_arena_cell_names_an_unknown_or_missing_setting():
    from bcr_core.arena.run import make_arena_cell

    with pytest.raises(SettingError, match="--n: missing"):
        make_arena_cell(agents=2)
    with pytest.raises(SettingError, match="--rho-s: unknown setting"):
        make_arena_cell(n=2, rho_s=0.2)


def test_saved_inspections_key_on_the_schema_checked_as_the_notebook_parameters_are():
    """An inspection is found by what decides its content, written out: the items, the model, the
    gate and the repair (layout, rho, B); the explorer's starting item, call, layer and head are not."""
    from bcr_core.lab import saved_inspection
    from bcr_core.repair.layouts import LAYOUTS
    from bcr_core.schema import INSPECTION
    from bcr_core.schema import LAYOUTS as NAMES

    content = {"model", "benchmark", "item_seed", "agents", "n", "max_new_tokens", "gamma", "layout", "rho", "chunk"}
    assert set(saved_inspection.KEYS) == content == set(INSPECTION)
    assert NAMES == tuple(LAYOUTS)
    for key, setting in INSPECTION.items():
        assert params.SCHEMA[key] == setting.kind, key
    with pytest.raises(params.ParameterError, match="parameter 'layout'"):
        params.check_value("layout", "tile")


def test_every_repair_condition_is_a_selector_and_a_layout_the_arena_knows_too():
    """The paper's repair conditions written out (BCR = the draft's score; the coin; CacheBlend's
    layer-1 rule), the lab's `ours` and the arena's segment-map rules, each its selector and layout; the arena
    ranks with the same classes, and every selector of its field but the K/V-error rankings (which read the exact
    cache) is served by some condition."""
    from bcr_core.arena.registry import SELECTORS as FIELD
    from bcr_core.conditions import DEFINITIONS, make_selector
    from bcr_core.repair import selectors as s

    paper = {
        "bcr-chunk": ("draft", "chunk"),
        "bcr-grow": ("draft", "grow"),
        "bcr-single": ("draft", "single"),
        "coin-chunk": ("coin", "chunk"),
        "coin-single": ("coin", "single"),
        "cacheblend-cost": ("cacheblend", "single"),
        "cacheblend-reuse": ("cacheblend", "single"),
        "ours-chunk": ("ours", "chunk"),
        "ours-single": ("ours", "single"),
        "cacheblend-chunk": ("cacheblend", "chunk"),
        "question-chunk": ("question", "chunk"),
        "question-single": ("question", "single"),
        "seams-single": ("seams", "single"),
        "window-single": ("window", "single"),
    }
    repairs = {name: (d.selector, d.layout) for name, d in DEFINITIONS.items() if d.layout is not None}
    assert repairs == paper
    classes = {
        "draft": s.DraftSelector,
        "coin": s.CoinSelector,
        "cacheblend": s.CacheBlendSelector,
        "ours": s.AttendedDeviationSelector,
        "question": s.QuestionSelector,
        "seams": s.SeamsSelector,
        "window": s.WindowSelector,
    }
    for name, (selector, _) in paper.items():
        made = make_selector(parse(f"{name}@0.5" if name == "cacheblend-reuse" else name))
        assert type(made) is classes[selector] is FIELD[selector], name
    assert set(FIELD) - set(classes) == {"kv-error", "kv-error-attn"}
    assert all(FIELD[name].reads_exact for name in ("kv-error", "kv-error-attn"))
    assert make_selector(parse("cacheblend-chunk:layer=3")).layer == 3
    # a coin draws once per chunk on the chunk layout, once per row on single rows
    assert make_selector(parse("coin-chunk:chunk=8,seed=3")).unit == 8
    assert make_selector(parse("coin-single:chunk=8,seed=3")).unit == 1
    assert make_selector(parse("coin-chunk:seed=3")).seed == 3


def test_notebooks_10_and_11_start_from_the_schema_s_defaults():
    """Their parameter cells are what a user edits; each setting they share with the claims' grid or the
    arena starts at the schema's default, so the notebook and `bcr arena` / `ClaimsGrid` run the same."""
    from ast import literal_eval

    from bcr_core.analysis.reports.claims_grid import ClaimsGrid
    from bcr_core.lab.notebooks import declared_parameters, notebook_paths
    from bcr_core.schema import ARENA, CLAIMS

    paths = {p.name[:2]: p for p in notebook_paths()}
    for key, schema in (("10", CLAIMS), ("11", ARENA)):
        declared = declared_parameters(paths[key])
        shared = [
            n for n in declared if n in schema and not schema[n].required and n not in ("model", "dtype", "seeds")
        ]
        assert len(shared) >= 5, (key, shared)
        for name in shared:
            assert literal_eval(declared[name]["default"]) == schema[name].default, (key, name)
    with pytest.raises(SettingError, match=r"ClaimsGrid.gammas: entry 0: 1.5 is outside in \[0, 1\]"):
        ClaimsGrid(gammas=[1.5])
    assert ClaimsGrid(seeds=[4]).seeds == (4,)
