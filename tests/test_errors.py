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
from bcr_core.runs.grid_cells import GridError
from bcr_core.settings import SettingError


def run_cli(body: str) -> subprocess.CompletedProcess:
    """`bcr` in a fresh interpreter, after `body` (Python with `cli` and `commands` imported) has set a fault up."""
    code = f"import sys\nfrom bcr_core import cli, commands\n{body}\nsys.exit(cli.main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "verify"], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("error", [ValueError, RuntimeError, KeyError])
def test_an_internal_error_keeps_its_traceback_and_fails(error):
    """A plain ValueError is an internal invariant, not a user's mistake: it must not be reduced to a line."""
    done = run_cli(
        f"def broken(model):\n    raise {error.__name__}('invariant broken deep inside')\n"
        "import bcr_core.engine.loading as loading\n"
        "loading.load_backbone = broken"
    )
    assert done.returncode not in (0, 2)
    assert "Traceback (most recent call last)" in done.stderr
    assert "in broken" in done.stderr and "invariant broken deep inside" in done.stderr


def test_a_usage_error_is_one_line_and_exit_2():
    done = run_cli(
        "from bcr_core.errors import UsageError\n"
        "def refused(model):\n    raise UsageError('--model nowhere: no such folder')\n"
        "import bcr_core.engine.loading as loading\n"
        "loading.load_backbone = refused"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["bcr verify: error: --model nowhere: no such folder"]


def test_a_bug_inside_a_command_is_raised_not_printed(monkeypatch, capsys):
    def broken(model):
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
    from bcr_core.lab.records import find_runs

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "cell.json").write_text('{"n": 4}')
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "cell.json").write_text(text)
    with pytest.raises(
        UsageError, match=rf"damaged/cell.json should hold a run's settings as a JSON object, but holds {holds}"
    ):
        find_runs(tmp_path)
    (tmp_path / "damaged" / "cell.json").unlink()
    assert find_runs(tmp_path) == [(tmp_path / "good", {"n": 4})]


def test_two_arena_folders_of_one_model_are_a_user_error_not_a_value_error():
    from bcr_core.arena import report
    from bcr_core.paths import RESULTS

    with pytest.raises(UsageError, match="two arena folders hold the same model") as caught:
        report.transfer_table([RESULTS / "arena", RESULTS / "arena"])
    assert not isinstance(caught.value, ValueError)
