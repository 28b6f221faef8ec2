"""`written_whole`: a file's name holds its old content or the whole new one, never a part; and first-time
work that several processes start at once is done once, the others waiting for it (`held_exclusively`)."""

import os
import subprocess
import sys
import time

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


def test_files_that_belong_together_take_their_names_together_or_not_at_all(tmp_path):
    """A full disk on the second of two files: the first keeps its old content too, and the error is
    one line naming the folder and the cause."""
    import errno

    from bcr_core.paths import WriteError, all_written_whole

    first, second = tmp_path / "cell.json", tmp_path / "calls.jsonl.gz"
    first.write_text("old cell")
    second.write_text("old calls")
    with pytest.raises(WriteError) as refused, all_written_whole([first, second]) as (a, b):
        a.write_text("new cell")
        b.write_text("new ca")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(refused.value) == (
        f"{tmp_path}: cannot write cell.json, calls.jsonl.gz (No space left on device); nothing there was "
        "changed: free space or give a folder you can write, then run again"
    )
    assert (first.read_text(), second.read_text()) == ("old cell", "old calls")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl.gz", "cell.json"]


def test_a_folder_under_a_file_is_one_error_and_folders_made_on_the_way_are_removed(tmp_path):
    from bcr_core.paths import WriteError

    (tmp_path / "taken").write_text("a file where a folder should be")
    with pytest.raises(WriteError, match=r"taken/new/deeper: cannot write summary.csv \(Not a directory\)"):
        with written_whole(tmp_path / "taken" / "new" / "deeper" / "summary.csv") as partial:
            partial.write_text("never")
    with pytest.raises(KeyboardInterrupt), written_whole(tmp_path / "new" / "deeper" / "summary.csv") as partial:
        partial.write_text("half")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_sibling_left_by_a_killed_writer_is_removed_by_the_next_one_and_a_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from bcr_core.paths import partial_sibling

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    path = tmp_path / "report.html"
    killed = path.with_name(partial_sibling(path).name.replace(f".{os.getpid()}-", f".{dead}-"))
    killed.write_text("half a report")
    running = partial_sibling(path)  # this process's: a writer still at work
    running.write_text("being written")
    other = tmp_path / killed.name.replace("report.", "other.", 1)  # a dead writer's, of another file
    other.write_text("another file's sibling")
    with written_whole(path) as partial:
        partial.write_text("whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["report.html", running.name, other.name])


FIRST_USE = """
import hashlib, sys, time
from pathlib import Path
from bcr_core.engine import models

go, log = Path(sys.argv[1]), Path(sys.argv[2])
CONTENT = {"config.json": b"{}", "model.safetensors": b"w" * 1_000_000}
FILES = {name: hashlib.sha256(data).hexdigest() for name, data in CONTENT.items()}

def convert(target):  # slow, like a real conversion: the others arrive while it writes
    with open(log, "a") as f:
        f.write("converted\\n")
    with models.written_whole(target) as partial:
        partial.mkdir()
        for name, data in CONTENT.items():
            time.sleep(0.3)
            (partial / name).write_bytes(data)

while not go.exists():
    time.sleep(0.01)
folder = models.converted_dir("the test model", "test-model", FILES, convert)
print(sorted(p.name for p in folder.iterdir()))
"""


def test_several_processes_using_an_empty_cache_at_once_all_succeed_and_one_converts(tmp_path):
    """First use by a class starting together (or Ray workers on a fresh node): each process gets the whole
    converted folder; one converts, the others wait for it. Without the lock every process converted, and
    one lost the race renaming its folder onto the one just finished (`Directory not empty`)."""
    go, log = tmp_path / "go", tmp_path / "conversions.log"
    env = os.environ | {"BCR_CACHE": str(tmp_path / "cache")}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE, str(go), str(log)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    time.sleep(1.5)  # every interpreter imported and waiting
    go.touch()
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * 4
    assert all(out.split("\n")[0] == "['config.json', 'model.safetensors']" for out in outputs), outputs
    assert log.read_text() == "converted\n"
