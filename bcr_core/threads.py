"""How long a lab process's idle CPU threads spin before they sleep: briefly, so that processes sharing
cores do not spin against each other.

torch runs its CPU kernels (its own, MKL's and oneDNN's) on one OpenMP pool of a thread per core,
from the libgomp the PyPI wheels ship. Unless told otherwise, libgomp lets a thread that has run out
of work spin 300,000 times (about 3 ms) before it sleeps: free when the process has the cores to
itself, ruinous when it does not. Four `bcr verify` on two cores each took 8x their one-thread time
alone, two `bcr run` 4x, and the quickstart notebook beside a one-thread `bcr run` more than 6x
(docs/performance.md, `benchmarks/threads.py`). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) ends that
but costs a process alone about 3%, the wake-up of its threads between kernels; spinning 2,000 times
(about 20 us) costs it nothing measurable and keeps four processes on two cores at 2.5x.

libgomp reads the count once, when torch loads it. The package therefore sets it on import, before
any of its modules imports torch, and every process the lab starts inherits it: papermill's and
Voila's kernels, arena lanes, Ray's workers. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. A
process that imported torch before `bcr_core` keeps libgomp's default.
"""

from __future__ import annotations

import os

SPIN_COUNT = 2000  # libgomp's spins (~10 ns each) before an idle thread sleeps; its default is 300,000


def spin_briefly() -> None:
    """Ask libgomp to spin idle threads briefly, unless the environment already chose how they wait."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
