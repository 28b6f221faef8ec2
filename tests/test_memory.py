"""Resident memory under the kept-freed-memory allocator setting (glibc only)."""

import pytest
import torch

from bcr_core.engine.memory import keep_freed_memory, release_freed_memory


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_releasing_hands_back_the_holes_a_freed_cache_leaves():
    """Caches freed between two that stay leave holes whose pages stay resident (nothing trims a
    heap under `keep_freed_memory`); `release_freed_memory` returns them."""
    if not keep_freed_memory():
        pytest.skip("not glibc: the allocator setting does not apply")
    release_freed_memory()
    kept = [torch.ones(4 * 2**20) for _ in range(2)]  # 16 MiB each, touched
    freed = [torch.ones(4 * 2**20) for _ in range(12)]
    kept.append(torch.ones(4 * 2**20))  # above the freed ones: the heap cannot shrink past it
    held = resident_mb()
    del freed
    assert resident_mb() > held - 16  # still resident: kept, not returned
    release_freed_memory()
    assert resident_mb() < held - 150  # the 192 MiB of holes went back
    assert all(float(t.sum()) == 4 * 2**20 for t in kept)
