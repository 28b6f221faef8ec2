"""Running a grid's cells on Ray: one task per cell, on a local instance started for the run or on
a cluster. A task writes its cell's records itself, to DIR (shared storage on a cluster); the
driver only watches DIR, so it holds no results, and a task that dies is reported.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from bcr_core.errors import UsageError
from bcr_core.run_folder import count_lines
from bcr_core.runs.grid_file import GridCell, GridError
from bcr_core.runs.grid_folder import check_folders, items_done, lock_holder
from bcr_core.runs.grid_task import run_grid_cell

LOCAL = "local"  # `--ray` without an address: start a Ray instance for this run
THREAD_SETTINGS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # passed to every task


RAY_VERSION = "2.60.0"  # the version tested (pyproject's `cluster` extra)


INSTALL_RAY = f'--ray needs Ray: pip install -e ".[cluster]" (or pip install "ray=={RAY_VERSION}")'


def import_ray():
    try:
        import ray
    except ImportError:
        raise GridError(INSTALL_RAY) from None
    return ray


def connect(ray, address: str, quiet: bool) -> None:
    """Start a local Ray instance (address LOCAL) or join a cluster. The driver's thread settings reach
    the workers: OMP_NUM_THREADS where set (torch in a task uses as many threads as the driver was
    told to), and how idle threads wait (`bcr_core.threads`), even on a worker that loads torch first."""
    env = {key: os.environ[key] for key in THREAD_SETTINGS if key in os.environ}
    options = dict(runtime_env={"env_vars": env} if env else None, log_to_driver=not quiet)
    if address == LOCAL:
        start_local(ray, **options)
        return
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "5")  # Ray's own wait for a cluster's answer, ~1 s a try
    try:
        ray.init(address=address, **options)
    except Exception as err:
        if not cannot_start(err):
            raise  # a bug, with its traceback
        raise GridError(
            f"--ray {address}: cannot join the Ray cluster: {one_line(err)}; start it with "
            "`ray start --head` (and `ray start --address HEAD:PORT` on the other nodes)"
        ) from None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, within `timeout_s`, a HOST:PORT (or ray://HOST:PORT) nothing answers at: Ray itself
    keeps retrying such an address for minutes. `auto` is Ray's to find, and fails fast."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        reason = "no answer" if isinstance(err, TimeoutError) else err.strerror or type(err).__name__
        raise GridError(
            f"--ray {address}: cannot reach the Ray cluster ({reason} within {timeout_s:g} s); start it "
            "with `ray start --head` on that node, or check the address and port"
        ) from None


def start_local(ray, **options) -> None:
    """A local Ray instance for this run. Ray gives its node 30 s to register; a machine busy with
    other work can miss that once, so a failed start is retried once before it is an error."""
    for attempt in range(2):
        try:
            ray.init(include_dashboard=False, **options)
            return
        except Exception as err:
            if not cannot_start(err):
                raise  # a bug, with its traceback
            ray.shutdown()
            if attempt:
                raise GridError(
                    f"--ray: could not start a local Ray instance: {one_line(err)}; on a busy machine "
                    "start one beforehand (`ray start --head`) and pass `--ray auto`"
                ) from None


def cannot_start(err: Exception) -> bool:
    """Whether `err` is Ray saying it cannot start or join an instance: a ConnectionError or
    TimeoutError, a RuntimeError of its start-up, or the bare `Exception` its node raises when it
    does not register in time ("timed out during startup"). Anything else is a bug and propagates."""
    return isinstance(err, (ConnectionError, TimeoutError, RuntimeError)) or type(err) is Exception


def task_failure(err: Exception) -> str:
    """A failed task's reason: a usage error's last line (its message), else Ray's whole report,
    the task's traceback included, for a bug or a worker's death."""
    text = str(err).strip()
    if not text:
        return type(err).__name__
    cause = getattr(err, "cause", err)  # Ray's RayTaskError wraps the task's own exception
    return text.splitlines()[-1] if isinstance(cause, UsageError) else text


def one_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def task_resources(ray) -> dict:
    """One GPU per cell where the cluster has GPUs, else one CPU."""
    return {"num_gpus": 1} if ray.cluster_resources().get("GPU", 0) > 0 else {"num_cpus": 1}


def run_on_ray(
    grid: list[GridCell], out: Path, address: str = LOCAL, poll_s: float = 2.0, quiet: bool = False
) -> list[str]:
    """Every unfinished cell as a Ray task; one line per cell start and end and a running count of
    items on stderr, read from DIR. A task that dies is reported and not retried here: the next
    invocation resubmits its cell, which resumes from its records. Returns the failed cells' names."""
    if address != LOCAL:
        check_reachable(address)  # before Ray's import, which alone can take seconds
    ray = import_ray()
    todo = check_folders(grid, out)
    out = Path(out).resolve()
    started_here = not ray.is_initialized()
    if started_here and todo:
        connect(ray, address, quiet)
    try:
        return watch(ray, grid, todo, out, poll_s)
    finally:
        if started_here and ray.is_initialized():
            ray.shutdown()


def watch(ray, grid: list[GridCell], todo: list[GridCell], out: Path, poll_s: float) -> list[str]:
    total = sum(g.items for g in grid)
    done = {g.name: items_done(g, out) for g in grid}

    def say(text: str) -> None:
        print(f"bcr grid: {text}", file=sys.stderr, flush=True)

    say(f"{len(grid) - len(todo)} of {len(grid)} cells already finished; {sum(done.values())}/{total} items")
    if not todo:
        return []
    task, resources = ray.remote(run_grid_cell), task_resources(ray)
    stale = {g.name: lock_holder(out / g.name) for g in todo}  # a killed run's lock, until a task takes it
    pending = {task.options(name=f"bcr-grid:{g.name}", max_retries=0, **resources).remote(g, str(out)): g for g in todo}
    began, started, failed, shown_count = time.monotonic(), {}, [], sum(done.values())
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
        for ref in ready:
            g = pending.pop(ref)
            if g.name not in started:
                say(f"cell {g.name} started")
            try:
                ray.get(ref)
                say(f"cell {g.name} finished ({time.monotonic() - started.get(g.name, began):.1f} s)")
            except Exception as err:  # a task's error or its worker's death: report, the next run resumes it
                say(f"cell {g.name} failed: {task_failure(err)}")
                failed.append(g.name)
        for g in pending.values():
            holder = lock_holder(out / g.name)
            if g.name not in started and holder is not None and holder != stale[g.name]:
                started[g.name] = time.monotonic()
                say(f"cell {g.name} started")
        for g in todo:
            done[g.name] = min(count_lines(out / g.name / "items.jsonl"), g.items)
        if sum(done.values()) != shown_count:
            shown_count = sum(done.values())
            say(f"{shown_count}/{total} items")
    return failed
