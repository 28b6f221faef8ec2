"""`--dtype`: the precision a model is served in, the released code's rule for `auto`, and its record in
cell.json (committed folders, written before the key existed, stay one identity with fp32 runs)."""

import json

import pytest
import torch
from conftest import tiny_llama_config

from bcr_core.cli import main
from bcr_core.engine.architectures import ModelError
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.models import resolve_dtype
from bcr_core.errors import UsageError
from bcr_core.runs.cell import Cell
from bcr_core.runs.grid_file import read_grid
from bcr_core.runs.run_writer import check_folder, identity
from bcr_core.runs.runner import run_cell


@pytest.mark.parametrize(
    "model, device, expected",
    [  # the released KVCOMM code: float16 where the model's name contains "llama", float32 otherwise; a CPU fp32
        ("meta-llama/Llama-3.1-8B-Instruct", "cuda", torch.float16),
        ("config:llama-3.1-8b", "cuda:0", torch.float16),
        ("/models/TinyLlama-1.1B", "cuda", torch.float16),
        ("Qwen/Qwen2.5-Coder-7B-Instruct", "cuda", torch.float32),
        ("mistralai/Mistral-7B-Instruct-v0.3", "cuda", torch.float32),
        ("default", "cuda", torch.float32),
        ("meta-llama/Llama-3.1-8B-Instruct", "cpu", torch.float32),
        ("default", "cpu", torch.float32),
    ],
)
def test_auto_follows_the_released_rule(model, device, expected):
    assert resolve_dtype("auto", model, device) == expected


def test_a_named_dtype_is_taken_as_named_and_an_unknown_one_refused():
    assert resolve_dtype("bfloat16", "meta-llama/Llama-3.1-8B", "cuda") == torch.bfloat16
    assert resolve_dtype("float16", "default", "cpu") == torch.float16
    with pytest.raises(ModelError, match="unknown dtype 'float64'"):
        resolve_dtype("float64", "default", "cpu")


def test_the_command_line_refuses_an_unknown_dtype(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "--dtype", "float64"])
    assert exit_.value.code == 2
    assert "--dtype: invalid choice: 'float64'" in capsys.readouterr().err


def test_from_config_reads_the_model_type_as_the_name():
    assert Backbone.from_config(tiny_llama_config(), device="cpu").dtype == torch.float32
    assert Backbone.from_config(tiny_llama_config(), device="cpu", dtype="bfloat16").dtype == torch.bfloat16


CELL = dict(benchmark="synthetic", agents=2, conditions=("dense",), n=1, max_new_tokens=2, item_seed=34)


def test_a_cell_records_the_dtype_it_is_served_in():
    assert Cell(**CELL).dtype == "float32"  # auto, on this CPU
    assert Cell(**CELL, dtype="bfloat16").record()["dtype"] == "bfloat16"


def test_a_committed_cell_without_a_dtype_is_the_fp32_run_and_not_the_bf16_one():
    committed = {k: v for k, v in Cell(**CELL).record().items() if k != "dtype"}  # as written before the key
    assert Cell.from_record(committed).dtype == "float32"
    assert identity(committed) == identity(Cell(**CELL).record())
    assert identity(committed) != identity(Cell(**CELL, dtype="bfloat16").record())


def test_a_folder_of_one_dtype_refuses_to_resume_in_another(tiny_chat, tmp_path):
    run_cell(tiny_chat, Cell(**CELL), tmp_path, progress=False)
    assert json.loads((tmp_path / "cell.json").read_text()).get("dtype", "float32") == "float32"
    with pytest.raises(UsageError, match="holds a run with other settings"):
        check_folder(tmp_path, Cell(**CELL, dtype="float16"))


def test_a_cell_and_a_model_in_two_dtypes_are_refused(tiny_chat, tmp_path):
    with pytest.raises(UsageError, match="cell is in bfloat16 but the model is served in float32"):
        run_cell(tiny_chat, Cell(**CELL, dtype="bfloat16"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_grid_takes_the_command_lines_dtype_where_its_file_names_none(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        '[defaults]\nbenchmark = "synthetic"\nn = 2\nconditions = ["dense"]\n[cells.a]\n[cells.b]\ndtype = "float32"\n'
    )
    cells = {c.name: c.cell.dtype for c in read_grid(path, dtype="bfloat16")}
    assert cells == {"a": "bfloat16", "b": "float32"}
