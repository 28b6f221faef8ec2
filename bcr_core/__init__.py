"""BCR lab: cross-context KV-cache reuse, its Budgeted Cache Repair, and the experiments of the paper."""

from bcr_core.threads import spin_briefly

spin_briefly()  # before any module of the package loads torch (bcr_core.threads says why)
