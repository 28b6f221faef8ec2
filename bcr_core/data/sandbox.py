"""Running a HumanEval item where model code can change nothing outside and cannot decide its own pass.

Two sandboxes per item, each a bare `python -I -S` under bubblewrap (`bwrap`) running `sandbox_harness`:
the *candidate* runs the prompt and the model's completion and answers calls of the entry point; the
*tests* run the prompt and the task's unit tests (trusted code) against a proxy of the entry point. Only
literal values cross between them (`ast.literal_eval`, never pickle), and the verdict travels on a pipe that
only the tests hold, so model code can neither print a pass nor return an object equal to everything.

What each sandbox promises (docs/design.md §8 says how each promise is tested):
- no capability: run as root, bwrap keeps only CAP_SETUID/CAP_SETGID, which the harness spends at once to
  become an unprivileged uid of its own (so `mount` fails); run as a user, a user namespace with every
  capability dropped;
- nothing of the machine but what Python needs, read-only: `/usr` (and `/lib*`, `/bin`), the interpreter's
  prefix wherever it lives (under `/tmp` too: it is bound over the private `/tmp`), a fresh `/proc` and
  `/dev`; no home folder, no `/run`, no `/etc`, no site-packages, no checkout; a private `/tmp` of
  `TMP_BYTES`;
- no network, and its own PID, IPC and UTS namespaces; a new session; dies with the run;
- an empty environment (`PATH`, `HOME=/tmp`, `LANG` only);
- caps on memory (`MEMORY_BYTES` of address space per process), on processes (`PROCESSES` under its uid),
  on the size of any file it writes (`FILE_BYTES`), on the output read back (`OUTPUT_BYTES`, the rest
  discarded unread into memory), and on wall-clock time (the item's timeout; then both are killed).
What it does not promise: protection against a kernel or bubblewrap exploit, against reading what `/usr`
holds, or against burning CPU until the timeout.

A sandbox that cannot start is not a failed item: `check_sandbox` runs one known-good item first, and a
run stops with one line naming the reason (bubblewrap missing, user namespaces off, the interpreter hidden).
"""

from __future__ import annotations

import functools
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from bcr_core.errors import UsageError

MEMORY_BYTES = 2 * 2**30  # address space of each sandboxed process: the tests need far less
FILE_BYTES = 16 * 2**20  # the largest file a sandboxed process may write (RLIMIT_FSIZE)
TMP_BYTES = 64 * 2**20  # its private /tmp
PROCESSES = 32  # processes under its uid (RLIMIT_NPROC): a fork bomb stops there
OUTPUT_BYTES = 4000  # what is kept of the two programs' output (stdout and stderr together)
HARNESS = Path(__file__).with_name("sandbox_harness.py")
UIDS = range(0x40000000, 0x7FFF0000, 2)  # unprivileged uids no account uses; one pair per item
TASK_FOLDER = "/sandbox"


class SandboxUnavailable(UsageError):
    """The sandbox cannot run here (bubblewrap missing, namespaces refused, the interpreter hidden):
    HumanEval's programs are never run outside it, and a run that cannot score stops."""


@dataclass(frozen=True)
class Task:
    """What the sandbox runs of a HumanEval task: model code is the prompt plus the completion."""

    prompt: str
    test: str
    entry_point: str


@dataclass(frozen=True)
class Outcome:
    passed: bool
    result: str  # "passed", "timed out", or "failed: <why, as the tests saw it>"
    output: str = ""  # the first OUTPUT_BYTES of what the two programs printed, for diagnosis


def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "HumanEval's unit tests run model code inside bubblewrap, which is not installed: "
            "`apt-get install bubblewrap` (Debian/Ubuntu) and run again"
        )
    return found


def interpreter() -> Path:
    """The base interpreter (a venv's `python` is a link to it): the sandbox binds its prefix, not the venv."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable))


def interpreter_roots() -> list[Path]:
    """The folders the interpreter needs besides `/usr`: its prefix (the standard library, libpython)."""
    roots = {Path(os.path.realpath(p)) for p in (sys.base_prefix, sys.base_exec_prefix)}
    roots.add(interpreter().parent.parent)
    return sorted(r for r in roots if r != Path("/usr") and Path("/usr") not in r.parents)


def system_mounts() -> list[str]:
    """`/usr` read-only and the top-level folders a merged `/usr` links into it (`/lib`, `/bin`, ...)."""
    mounts = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            mounts += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            mounts += ["--ro-bind", str(path), str(path)]
    return mounts


def bind_readable(root: Path) -> list[str]:
    """`root` read-only at its own path, the folders on the way made traversable (bwrap would copy a
    home folder's 0700 and hide the interpreter from the sandbox's uid)."""
    above = [a for a in reversed(root.parents) if a not in (Path("/"), Path("/tmp"))]
    return [*(arg for a in above for arg in ("--perms", "0755", "--dir", str(a))), "--ro-bind", str(root), str(root)]


def as_root() -> bool:
    return os.geteuid() == 0


def sandbox_command(folder: Path, args: list[str]) -> list[str]:
    """bwrap around `python -I -S sandbox_harness.py ARGS`, with `folder` (the harness and one program)
    read-only at /sandbox; see the module docstring for what it promises."""
    if as_root():  # real root: no user namespace; the harness drops to its uid with these two
        identity = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        identity = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    binds = [arg for root in interpreter_roots() for arg in bind_readable(root)]
    return [
        bwrap(),
        *system_mounts(),
        *("--proc", "/proc", "--dev", "/dev"),
        *("--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"),
        *binds,  # after /tmp's tmpfs, so an interpreter under /tmp stays visible
        *("--ro-bind", str(folder), TASK_FOLDER),
        *("--chdir", "/tmp"),
        "--clearenv",
        *("--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"),
        *("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"),
        *identity,
        "--new-session",
        "--die-with-parent",
        str(interpreter()),
        "-I",
        "-S",
        f"{TASK_FOLDER}/{HARNESS.name}",
        *args,
    ]


def processes_of_my_uid() -> int:
    uid, count = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            continue
    return count


def limits(processes: int):
    """What runs in the child before bwrap starts: bwrap and the program inherit these caps. Under root the
    process cap counts the sandbox's own uid; under a user it counts all of the user's processes, so it
    is set to what the user runs now plus `PROCESSES`."""

    def apply() -> None:
        for limit, value in (
            (resource.RLIMIT_AS, MEMORY_BYTES),
            (resource.RLIMIT_FSIZE, FILE_BYTES),
            (resource.RLIMIT_NPROC, processes),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(limit, (value, value))

    return apply


def write_folder(parent: Path, name: str, program: str) -> Path:
    """A folder readable by the sandbox's uid holding the harness and `program` (nothing else)."""
    folder = parent / name
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    for path, text in ((folder / HARNESS.name, HARNESS.read_text()), (folder / "program.py", program)):
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)
    return folder


class Sandboxes:
    """The two processes of one item, their pipes, and what came back."""

    def __init__(self, task: Task, completion: str, parent: Path):
        parent.chmod(0o755)
        uid = secrets.choice(UIDS)
        processes = PROCESSES if as_root() else processes_of_my_uid() + PROCESSES
        candidate_folder = write_folder(parent, "candidate", task.prompt + completion)
        tests_folder = write_folder(parent, "tests", f"{task.prompt}\n{task.test}\n")
        requests, replies, verdict, output = os.pipe(), os.pipe(), os.pipe(), os.pipe()
        program = f"{TASK_FOLDER}/program.py"
        started = []
        try:
            for folder, args, fds in (
                (candidate_folder, ["candidate", uid, uid, program, task.entry_point], (requests[0], replies[1])),
                (
                    tests_folder,
                    ["tests", uid + 1, uid + 1, program, task.entry_point],
                    (requests[1], replies[0], verdict[1]),
                ),
            ):
                command = sandbox_command(folder, [str(a) for a in args] + [str(fd) for fd in fds])
                started.append(
                    subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=output[1],
                        stderr=output[1],
                        pass_fds=fds,
                        preexec_fn=limits(processes),
                        start_new_session=True,  # its own process group: the end of the item kills all of it
                    )
                )
        finally:
            for fd in (*requests, *replies, verdict[1], output[1]):
                os.close(fd)
            self.processes = started
        self.verdict, self.output, self.kept = verdict[0], output[0], bytearray()

    def wait(self, timeout: float) -> bytes | None:
        """The verdict line, or None when the tests did not give one within `timeout` s; what the programs
        print meanwhile is drained into `self.kept` (its first OUTPUT_BYTES)."""
        deadline, verdict, open_fds = time.monotonic() + timeout, bytearray(), {self.verdict, self.output}
        with selectors.DefaultSelector() as selector:
            for fd in open_fds:
                selector.register(fd, selectors.EVENT_READ)
            while self.verdict in open_fds and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        open_fds.discard(key.fd)
                    elif key.fd == self.verdict:
                        verdict += chunk[: 4096 - len(verdict)]
                    else:
                        self.keep(chunk)
        return None if self.verdict in open_fds else bytes(verdict)

    def keep(self, chunk: bytes) -> None:
        self.kept += chunk[: OUTPUT_BYTES - len(self.kept)]

    def close(self, grace: float) -> list[int]:
        """Give the tests `grace` seconds to exit, kill both process groups (whatever they left running),
        read what is left of the output, and return the exit statuses."""
        if len(self.processes) == 2:
            with suppress(subprocess.TimeoutExpired):
                self.processes[1].wait(max(grace, 0.0))
        for process in self.processes:
            kill_group(process.pid, signal.SIGKILL)
        codes = [process.wait() for process in self.processes]
        os.set_blocking(self.output, False)
        with suppress(BlockingIOError):  # every writer is dead: the rest is what a pipe holds
            while chunk := os.read(self.output, 65536):
                self.keep(chunk)
        os.close(self.verdict)
        os.close(self.output)
        return codes


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run_unchecked(task: Task, completion: str, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="bcr-humaneval-") as parent:
        deadline = time.monotonic() + timeout
        sandboxes = Sandboxes(task, completion, Path(parent))
        verdict = None
        try:
            verdict = sandboxes.wait(timeout)
        finally:
            codes = sandboxes.close(grace=deadline - time.monotonic() if verdict is not None else 0.0)
    text = sandboxes.kept.decode(errors="replace")
    if verdict is None:
        return Outcome(False, "timed out", text)
    line = verdict.decode(errors="replace").strip()
    if line == "passed" and codes[1] == 0:
        return Outcome(True, "passed", text)
    if not line:  # the tests died without a verdict: bwrap's own error, or a limit
        last = next((t for t in reversed(text.splitlines()) if t.strip()), f"exit status {codes[1]}")
        line = f"failed: {last.strip()[:300]}"
    return Outcome(False, line if line.startswith("failed") else f"failed: {line[:300]}", text)


KNOWN_GOOD = Task(
    prompt='def add(a, b):\n    """a + b"""\n',
    test="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1.5, 0.5) == -1.0\n",
    entry_point="add",
)


def diagnosis(outcome: Outcome) -> str:
    """One line naming why the known-good item did not pass."""
    said = " / ".join(line.strip() for line in outcome.output.splitlines() if line.strip())
    if "execvp" in said or "No such file or directory" in said:
        return f"the interpreter {interpreter()} is not visible inside the sandbox ({said[:200]})"
    if "namespace" in said or "uid map" in said or "Operation not permitted" in said:
        return (
            "bubblewrap cannot create the sandbox's namespaces here (user namespaces off, or a container that "
            f"forbids them): {said[:200]}"
        )
    return f"a known-good program did not pass inside the sandbox: {outcome.result} ({said[:200]})"


@functools.cache
def check_sandbox() -> None:
    """Run one known-good item; raise SandboxUnavailable with the reason unless it passes. Once a process."""
    bwrap()
    outcome = run_unchecked(KNOWN_GOOD, "    return a + b\n", timeout=30.0)
    if not outcome.passed:
        raise SandboxUnavailable(f"HumanEval cannot be scored here: {diagnosis(outcome)}")


def run_task(task: Task, completion: str, timeout: float) -> Outcome:
    """Score `completion` against `task`'s unit tests, both sandboxed; a sandbox that cannot run raises."""
    check_sandbox()
    return run_unchecked(task, completion, timeout)
