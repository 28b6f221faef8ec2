"""Allocation policies over whole agent calls (paper App. A.1, Table 7), on top of KVComm's gate.

- Protect-the-Root: a dense prefill is forced at the entry node (agent 1).
- Protect-the-Leaf: a dense prefill is forced at the deepest node (the FinalRefer aggregator).
  The two force the same number of dense calls and differ only in which node: a matched pair.
- Random: each reuse the gate allows is given up with probability p, by a seeded biased coin;
  choose p = 1 - target / KVComm's reuse rate to land on a target reuse rate.
Forced dense calls still store anchors, as any dense call does.
"""

from __future__ import annotations

import numpy as np

from bcr_core import paper
from bcr_core.agents.graph import FINAL
from bcr_core.errors import UsageError
from bcr_core.reuse.anchors import REUSE, KVCommConfig
from bcr_core.reuse.servers import KVCommServer

ROOT = "agent_1"


class ProtectNodeServer(KVCommServer):
    def __init__(self, bb, protected: str, config: KVCommConfig = KVCommConfig(), name: str = "protect"):
        super().__init__(bb, config, name)
        self.protected = protected

    def allocate(self, decisions, node):
        reason = super().allocate(decisions, node)
        return "protected" if node == self.protected and reason == REUSE else reason


class RandomAllocationServer(KVCommServer):
    def __init__(
        self,
        bb,
        p: float = paper.RANDOM_ALLOCATION_P,
        seed: int = 0,
        config: KVCommConfig = KVCommConfig(),
        name: str = "random-alloc",
    ):
        super().__init__(bb, config, name)
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"random-alloc's probability must lie in [0, 1], got {p}")
        self.p = p
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def allocate(self, decisions, node):
        reason = super().allocate(decisions, node)
        if reason != REUSE:
            return reason
        return "coin" if self.rng.random() < self.p else REUSE

    def replay(self, call):
        super().replay(call)
        if call["reason"] in (REUSE, "coin"):
            self.rng.random()  # the coin was flipped on every call the gate allowed


def protect_root(bb, config=KVCommConfig(), name="protect-root"):
    return ProtectNodeServer(bb, ROOT, config, name)


def protect_leaf(bb, config=KVCommConfig(), name="protect-leaf"):
    return ProtectNodeServer(bb, FINAL, config, name)
