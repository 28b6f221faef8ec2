"""One root for the mistakes a user can fix (`bcr_core.errors.UsageError`): the CLI prints those on
one line and exits 2; anything else is a bug, which keeps its traceback and a non-zero exit."""

import subprocess
import sys

import pytest

from bcr_core import cli
from bcr_core.engine.architectures import ModelError
from bcr_core.engine.assets import AssetError
from bcr_core.errors import UsageError
from bcr_core.lab.notebooks import NotebookError
from bcr_core.lab.params import ParameterError
from bcr_core.runs.grid_file import GridError
from bcr_core.setting_kinds import SettingError


def run_cli(body: str) -> subprocess.CompletedProcess:
    """`bcr` in a fresh interpreter, after `body` (Python with `cli` and `commands` imported) has set a fault up."""
    code = f"import sys\nfrom bcr_core import cli, commands\n{body}\nsys.exit(cli.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "verify"], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("error", [ValueError, RuntimeError, KeyError])
def test_an_internal_error_keeps_its_traceback_and_fails(error):
    """A plain ValueError is an internal invariant, not a user's mistake: it must not be reduced to a line."""
    done = run_cli(
        f"def broken(model, dtype=None):\n    raise {error.__name__}('invariant broken deep inside')\n"
        "import bcr_core.engine.loading as loading\n"
        "loading.load_backbone = broken"
    )
    assert done.returncode not in (0, 2)
    assert "Traceback (most recent call last)" in done.stderr
    assert "in broken" in done.stderr and "invariant broken deep inside" in done.stderr


def test_a_usage_error_is_one_line_and_exit_2():
    done = run_cli(
        "from bcr_core.errors import UsageError\n"
        "def refused(model, dtype=None):\n    raise UsageError('--model nowhere: no such folder')\n"
        "import bcr_core.engine.loading as loading\n"
        "loading.load_backbone = refused"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["bcr verify: error: --model nowhere: no such folder"]


def test_a_bug_inside_a_command_is_raised_not_printed(monkeypatch, capsys):
    def broken(model, dtype="auto"):
        raise ValueError("internal")

    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", broken)
    with pytest.raises(ValueError, match="internal"):
        cli.main(["verify"])
    assert "error" not in capsys.readouterr().err


def test_every_kind_of_user_mistake_shares_the_root_and_none_is_a_value_error():
    """A bug's ValueError must never pass for a user's mistake, nor a user's mistake for a ValueError."""
    assert not issubclass(UsageError, ValueError)
    for kind in (AssetError, ModelError, GridError, NotebookError, ParameterError, SettingError):
        assert issubclass(kind, UsageError) and not issubclass(kind, ValueError)
    assert issubclass(ParameterError, TypeError)  # as it was


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--benchmark", "synthetic", "--conditions", "nope", "--n", "1"], "unknown condition 'nope'"),
        (["run", "--benchmark", "synthetic", "--conditions", "dense", "--n", "0"], "--n: expected int >= 1, got 0"),
        (
            ["run", "--benchmark", "synthetic", "--agents", "9", "--conditions", "dense", "--n", "1"],
            "--agents: expected int in [2, 5], got 9",
        ),
        (["ttft", "--samples", "0"], "--samples must be >= 1"),
        (["notebooks", "--only", "no-such-notebook"], "no notebook matches"),
    ],
)
def test_mistakes_a_user_can_fix_are_one_line(argv, message, tmp_path, capsys):
    out = ["--out", str(tmp_path / "r")] if argv[0] in ("run", "notebooks") else []
    assert cli.main([*argv, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # a model load's progress bar may come first
    assert err[-1].startswith(f"bcr {argv[0]}: error: ") and message in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("text, holds", [("{'n': 4", "text that is not JSON"), ("[1, 2]", "a list")])
def test_a_damaged_cell_json_among_the_lab_s_runs_is_an_error_naming_it(tmp_path, text, holds):
    """The lab's search for earlier runs reads every `cell.json` as the runner does: a damaged one is
    refused, naming the file, not skipped (a skipped run would be silently recomputed)."""
    from bcr_core.run_folder import run_folders

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "cell.json").write_text('{"n": 4}')
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "cell.json").write_text(text)
    with pytest.raises(
        UsageError, match=rf"damaged/cell.json should hold a run's settings as a JSON object, but holds {holds}"
    ):
        run_folders(tmp_path)
    (tmp_path / "damaged" / "cell.json").unlink()
    assert [(run.path, run.settings) for run in run_folders(tmp_path)] == [(tmp_path / "good", {"n": 4})]


def test_two_arena_folders_of_one_model_are_a_user_error_not_a_value_error():
    from bcr_core.arena import report
    from bcr_core.paths import RESULTS

    with pytest.raises(UsageError, match="two arena folders hold the same model") as caught:
        report.transfer_table([RESULTS / "arena", RESULTS / "arena"])
    assert not isinstance(caught.value, ValueError)


DROP = object()  # a config key to delete


def tiny_config(tmp_path, name: str, changes: dict) -> str:
    """A folder with the embedded model's config.json as written, with `changes` (DROP deletes a key)."""
    import json

    from bcr_core.engine.models import embedded_model_dir

    settings = json.loads((embedded_model_dir() / "config.json").read_text())
    for key, value in changes.items():
        if value is DROP:
            settings.pop(key)
        else:
            settings[key] = value
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(settings))
    return str(folder)


@pytest.mark.parametrize("prefix", ["", "config:"])
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": DROP}, "model_type is missing"),
        ({"model_type": None}, "model_type is null"),
        ({"num_hidden_layers": 1}, "num_hidden_layers is 1; BCR needs at least 2 decoder layers"),
    ],
)
def test_a_config_no_decoder_can_use_is_refused_before_loading(prefix, changes, message, tmp_path, monkeypatch, capsys):
    from transformers import AutoConfig, AutoModelForCausalLM

    def never(*args, **kwargs):
        raise AssertionError("read by transformers: the refusal came too late")

    for cls in (AutoConfig, AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", never)
    monkeypatch.setattr(AutoModelForCausalLM, "from_config", never)
    folder = tiny_config(tmp_path, "m", changes)
    assert cli.main(["verify", "--model", prefix + folder]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bcr verify: error: ") and message in err[0]


def test_a_built_one_layer_config_is_refused():
    from transformers import AutoConfig

    from bcr_core.engine.architectures import check_architecture

    with pytest.raises(ModelError, match="num_hidden_layers is 1; BCR needs at least 2"):
        check_architecture(AutoConfig.for_model("llama", num_hidden_layers=1))
    check_architecture(AutoConfig.for_model("llama", num_hidden_layers=2))  # two are enough


@pytest.mark.parametrize("seed, seeds", [(-1, 3), (2**32 - 2, 3)])
def test_unit_curve_seeds_outside_numpys_range_are_refused_before_loading(seed, seeds, monkeypatch, capsys):
    def never(model):
        raise AssertionError("the model loaded before the seed was checked")

    monkeypatch.setattr("bcr_core.engine.loading.load_backbone", never)
    assert cli.main(["unit-curve", "--seed", str(seed), "--seeds", str(seeds)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"bcr unit-curve: error: --seed: the random selections' seeds {seed}..{seed + seeds - 1} must lie in "
        f"[0, {2**32 - 1}] (numpy's seed range); got --seed {seed}"
    ]


def test_a_hub_failure_is_one_line_whatever_transformers_says(monkeypatch, capsys):
    from transformers import AutoConfig

    from bcr_core.engine import models

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub.\nCheck your internet connection.\n\nSee the docs.")

    monkeypatch.setattr(models, "check_hub", lambda repo_id: None)
    monkeypatch.setattr(AutoConfig, "from_pretrained", offline)
    assert cli.main(["verify", "--model", "someorg/some-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "bcr verify: error: could not load model 'someorg/some-model' from the local Hugging Face cache or the hub: "
        "We couldn't connect to the hub."
    ]
