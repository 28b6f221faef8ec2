"""KVComm's anchor pool and entropy gate (paper §3, Equations 1-2; docs/design.md §2).

An anchor is a segment seen before, stored with its base cache (the segment behind the user-turn
header alone, at position 0) and, per agent node that prefilled it densely, the deviations
real - base of the segment and of the template text that follows it (Equation 1).

Serving a new segment for a node: the anchors of that placeholder holding a deviation for that
node and at least as long as the segment are eligible; d_j is the L2 distance between the
candidate's and anchor j's base VALUE caches over their first len(candidate) rows (all layers,
heads, dims); s = softmax(-d); reuse iff n >= 2 and H(s) <= gamma * log2(n). Chosen anchors are
the top-p of s, renormalised; the prediction is base + the weighted deviations, layer 0 left exact.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from bcr_core import paper
from bcr_core.engine.kv import KV, ROW_DIM
from bcr_core.errors import UsageError

ASSEMBLIES = ("released", "aligned")  # segments tokenized alone (the released code), or cut at Dense's boundaries


@dataclass(frozen=True)
class KVCommConfig:
    """The released repository's defaults (paper §3, §4: "anchor-pool hyperparameters stay at the
    repository defaults")."""

    gamma: float = paper.GAMMA
    max_anchors: int = paper.MAX_ANCHORS
    eviction_window: int = paper.EVICTION_WINDOW
    top_p: float = paper.TOP_P
    assembly: str = "released"  # how a prompt is cut into segments (`ASSEMBLIES`, `reuse.prompts.Prompt.aligned`)

    def __post_init__(self):
        if self.assembly not in ASSEMBLIES:
            raise UsageError(f"assembly must be one of {', '.join(ASSEMBLIES)}; got {self.assembly!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise UsageError(f"gamma must lie in [0, 1] (1.0 never refuses), got {self.gamma}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_anchors < 2 or not 1 <= self.eviction_window <= self.max_anchors:
            raise UsageError("need max_anchors >= 2 and 1 <= eviction_window <= max_anchors")


@dataclass
class Deviation:
    """real - base for one node: of the segment, and of the template text after it (if any)."""

    segment: KV
    after: KV | None


@dataclass(eq=False)  # an anchor is itself, not its contents: two of the same segment are two anchors
class Anchor:
    key: tuple[int, ...]  # the segment's token ids
    length: int
    base_values: torch.Tensor  # (L, B, H, length, D)
    deviations: dict[str, Deviation] = field(default_factory=dict)  # node -> deviation
    activations: int = 0
    serial: int = 0  # insertion order


# Reasons a placeholder is (not) reused; every gate decision is counted under one.
REUSE, NO_ANCHORS, ONE_ANCHOR, TOO_SHORT, ENTROPY = "reuse", "no_anchors", "one_anchor", "too_short", "entropy"


@dataclass
class GateDecision:
    placeholder: str
    reason: str
    n_pool: int  # anchors of this placeholder with a deviation for this node
    n_eligible: int  # ...that are also long enough
    entropy: float | None = None
    threshold: float | None = None
    chosen: list[tuple[Anchor, float]] = field(default_factory=list, repr=False)

    @property
    def reuse(self) -> bool:
        return self.reason == REUSE

    def to_dict(self) -> dict:
        return {
            "placeholder": self.placeholder,
            "reason": self.reason,
            "n_pool": self.n_pool,
            "n_eligible": self.n_eligible,
            "entropy": self.entropy,
            "threshold": self.threshold,
            "anchors": [a.serial for a, _ in self.chosen],
            "weights": [round(w, 6) for _, w in self.chosen],
        }


def entropy_bits(s: torch.Tensor) -> float:
    """H(s) = -sum s log2 s, with 0 log 0 = 0."""
    s = s.double()
    return float(-(s * torch.log2(s.clamp_min(1e-300))).sum())


def top_p(weights: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the smallest set of largest weights with mass >= p, and their renormalised weights."""
    order = weights.argsort(descending=True)
    mass = weights[order].cumsum(0)
    keep = int((mass < p).sum()) + 1
    chosen = order[: min(keep, weights.numel())]
    return chosen, weights[chosen] / weights[chosen].sum()


class AnchorPool:
    def __init__(self, config: KVCommConfig = KVCommConfig()):
        self.config = config
        self.pools: dict[str, list[Anchor]] = {}
        self.counts: Counter[str] = Counter()
        self._serial = 0

    def anchors(self, placeholder: str) -> list[Anchor]:
        return self.pools.get(placeholder, [])

    def decide(self, placeholder: str, node: str, candidate_base: KV) -> GateDecision:
        """Gate one placeholder of one call (Equation 2), counting the decision."""
        pool = [a for a in self.anchors(placeholder) if node in a.deviations]
        eligible = [a for a in pool if a.length >= candidate_base.length]
        decision = GateDecision(placeholder, REUSE, len(pool), len(eligible))
        if len(pool) == 0:
            decision.reason = NO_ANCHORS
        elif len(pool) == 1:
            decision.reason = ONE_ANCHOR
        elif len(eligible) < 2:
            decision.reason = TOO_SHORT
        else:
            distances = torch.stack([value_distance(a, candidate_base) for a in eligible])
            s = torch.softmax(-distances, dim=0)
            decision.entropy = entropy_bits(s)
            decision.threshold = self.config.gamma * math.log2(len(eligible))
            if decision.entropy > decision.threshold:
                decision.reason = ENTROPY
            else:
                chosen, weights = top_p(s, self.config.top_p)
                decision.chosen = [(eligible[i], float(w)) for i, w in zip(chosen.tolist(), weights)]
        self.counts[decision.reason] += 1
        return decision

    def activate(self, decision: GateDecision) -> None:
        for anchor, _ in decision.chosen:
            anchor.activations += 1

    def store(self, placeholder: str, key: tuple[int, ...], base: KV, node: str, deviation: Deviation) -> Anchor:
        """Record a node's deviation for a segment, creating its anchor (and evicting) if new.

        The nodes of one request that read the same segment share one anchor. A node that already
        holds a deviation for these ids saw them in another context (a later request with the same
        text), so that occurrence starts a new anchor instead of overwriting the old one.
        """
        pool = self.pools.setdefault(placeholder, [])
        anchor = next((a for a in reversed(pool) if a.key == key and node not in a.deviations), None)
        if anchor is None:
            if len(pool) >= self.config.max_anchors:
                self.evict(placeholder)
            self._serial += 1
            anchor = Anchor(key, base.length, base.values, serial=self._serial)
            pool.append(anchor)
        anchor.deviations[node] = deviation
        return anchor

    def copy(self) -> AnchorPool:
        """A pool that holds the same anchors and goes on from here on its own: every anchor is a new
        object with its own activation count and node map, and the same tensors (base values and
        deviations are never written into once stored, so they are shared, not copied)."""
        twin = AnchorPool(self.config)
        twin.pools = {p: [replace(a, deviations=dict(a.deviations)) for a in pool] for p, pool in self.pools.items()}
        twin.counts = Counter(self.counts)
        twin._serial = self._serial
        return twin

    def evict(self, placeholder: str) -> Anchor:
        """Drop the least-activated of the oldest `eviction_window` anchors (the oldest on ties)."""
        pool = self.pools[placeholder]
        oldest = sorted(pool, key=lambda a: a.serial)[: self.config.eviction_window]
        victim = min(oldest, key=lambda a: (a.activations, a.serial))
        pool.remove(victim)
        return victim


def value_distance(anchor: Anchor, candidate_base: KV) -> torch.Tensor:
    """L2 distance (float64) between the candidate's base values and the anchor's first rows.

    Squares are summed per row in float32 (64 terms) and across rows in float64, which keeps
    double-precision accuracy without a float64 copy of a cache-sized tensor.
    """
    n = candidate_base.length
    per_row = torch.linalg.vector_norm(anchor.base_values[:, :, :, :n] - candidate_base.values, dim=-1)
    return per_row.double().square().sum().sqrt()


def predict(base: KV, deviations: list[KV], weights: list[float]) -> KV:
    """base + sum_j w_j * deviation_j over the base's rows, layer 0 left exact (frame of `base`)."""
    n = base.length
    w = torch.tensor(weights, dtype=base.keys.dtype, device=base.keys.device).view(-1, 1, 1, 1, 1, 1)
    d_keys = (torch.stack([d.keys[:, :, :, :n] for d in deviations]) * w).sum(0)
    d_values = (torch.stack([d.values[:, :, :, :n] for d in deviations]) * w).sum(0)
    d_keys[0] = 0
    d_values[0] = 0
    return KV(base.keys + d_keys, base.values + d_values, base.positions)


def predict_into(
    keys: torch.Tensor, values: torch.Tensor, base: KV, deviations: list[KV], weights: list[float], rotate
) -> None:
    """`predict` for the first keys.shape[3] rows, with the keys' shift applied by `rotate(src, out)`,
    written straight into the (L, B, H, n, D) views `keys` and `values` of an assembled cache.
    Same result as shift(predict(...)) up to float rounding, without stacking or concatenating."""
    n = keys.shape[ROW_DIM]
    values.copy_(base.values[:, :, :, :n])
    moved = base.keys[:, :, :, :n].clone()
    for w, d in zip(weights, deviations):  # layer 0 stays exact
        values[1:].add_(d.values[1:, :, :, :n], alpha=w)
        moved[1:].add_(d.keys[1:, :, :, :n], alpha=w)
    rotate(moved, keys)


def deviation(real: KV, base: KV) -> KV:
    """real - base, both in the base's frame (keys re-rotated there by the caller)."""
    return KV(real.keys - base.keys, real.values - base.values, base.positions)
