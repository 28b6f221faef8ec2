"""The lab's thread policy (`bcr_core.threads`): libgomp, which runs torch's CPU kernels, spins an idle
thread 2,000 times before it sleeps (its default: 300,000) in every process that loads the lab before
torch and in every process those start (notebook kernels, the room's kernels, lanes, Ray's workers),
unless the user chose how threads wait. What libgomp itself read is what it prints under
OMP_DISPLAY_ENV=VERBOSE: its spin count."""

import os
import re
import subprocess
import sys

import pytest

from bcr_core.threads import SPIN_COUNT

DEFAULT_SPINS, PASSIVE_SPINS, ACTIVE_SPINS = 300_000, 0, 30_000_000_000


def spin_count(code: str, **env) -> int:
    """The spin count libgomp reports when `code` runs in a fresh interpreter."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=clean | {"OMP_DISPLAY_ENV": "VERBOSE"} | env,
        capture_output=True,
        text=True,
        check=True,
    )
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr + out.stdout)
    assert counts, f"libgomp printed no spin count: {out.stderr[-500:]}"
    return int(counts[-1])


def test_torch_alone_spins_300000_times():
    """The yardstick: without the lab, libgomp's default."""
    assert spin_count("import torch") == DEFAULT_SPINS


@pytest.mark.parametrize("first", ["import bcr_core", "from bcr_core import cli"])
def test_a_process_that_loads_the_lab_first_spins_briefly(first):
    """What libgomp read is the lab's count, and it is brief: below libgomp's own default, which a process
    that loads torch alone spins (test_torch_alone_spins_300000_times)."""
    assert spin_count(f"{first}; import torch; torch.ones(1)") == SPIN_COUNT < DEFAULT_SPINS


def test_the_processes_the_lab_starts_inherit_the_policy():
    """A kernel, a lane or a worker is a child process: it inherits the environment the lab set, even
    if it loads torch first."""
    code = "import bcr_core, subprocess, sys; subprocess.run([sys.executable, '-c', 'import torch'], check=True)"
    assert spin_count(code) == SPIN_COUNT


@pytest.mark.parametrize(
    "chosen, spins",
    [
        ({"OMP_WAIT_POLICY": "ACTIVE"}, ACTIVE_SPINS),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, PASSIVE_SPINS),
        ({"GOMP_SPINCOUNT": "123"}, 123),
    ],
)
def test_a_policy_the_user_chose_wins(chosen, spins):
    assert spin_count("import bcr_core, torch", **chosen) == spins


def test_the_package_loads_no_torch_before_it_sets_the_policy():
    probe = "import sys, os, bcr_core; print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["False", str(SPIN_COUNT)]
