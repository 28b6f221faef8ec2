"""`written_whole`: a file's name holds its old content or the whole new one, never a part."""

import pytest

from bcr_core.paths import written_whole


def test_the_name_keeps_the_old_content_until_the_block_finishes(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("old\n")
    with written_whole(path) as partial:
        partial.write_text("new, first half\n")
        assert path.read_text() == "old\n"  # a reader meanwhile
        with open(partial, "a") as f:
            f.write("second half\n")
    assert path.read_text() == "new, first half\nsecond half\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_bytes(b"{}")
    with pytest.raises(KeyboardInterrupt), written_whole(path) as partial:
        partial.write_bytes(b'{"half": ')
        raise KeyboardInterrupt  # a user's ^C halfway through
    assert path.read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_a_new_file_appears_only_whole(tmp_path):
    path = tmp_path / "inspection.pt"
    with pytest.raises(OSError), written_whole(path) as partial:
        partial.write_bytes(b"x" * 10)
        raise OSError("disk full")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_two_writers_at_once_each_finish_and_the_last_one_wins(tmp_path):
    path = tmp_path / "model.gguf"  # two lanes fetching the model on first use, interleaved
    with written_whole(path) as first:
        first.write_bytes(b"A")
        with written_whole(path) as second:
            second.write_bytes(b"B")
        assert path.read_bytes() == b"B"
    assert path.read_bytes() == b"A"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def test_a_directory_replaces_the_old_one_whole_and_a_failed_one_leaves_nothing(tmp_path):
    path = tmp_path / "model"  # a converted model: config and weights, written as one directory
    path.mkdir()
    (path / "config.json").write_text("old")
    with pytest.raises(KeyboardInterrupt), written_whole(path) as partial:
        partial.mkdir()
        (partial / "config.json").write_text("half")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"] and (path / "config.json").read_text() == "old"
    with written_whole(path) as partial:
        partial.mkdir()
        (partial / "weights.safetensors").write_text("new")
    assert sorted(p.name for p in path.iterdir()) == ["weights.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
