"""Selectors: what ranks an assembled cache's rows for repair. One protocol, three rules.

`scores(bb, kv, ids, last_id) -> (rows,) tensor`, higher = repair first.

- DraftSelector (BCR, Algorithm 2): draft k = 2 tokens, score rows by the attention they got.
- CoinSelector (the random control): uniform scores from a seeded stream that advances once per
  repaired call; no draft, so it spends k fewer decode steps.
- CacheBlendSelector (App. D, ported): the deviation between fresh layer-1 values and the
  assembled cache's layer-1 values, row by row. Fresh values need layer 0 over every row, which
  is exact in an assembled cache, so two layers are run over the whole prompt.
"""

from __future__ import annotations

import numpy as np
import torch

from bcr_core.draft_scores import row_scores


class DraftSelector:
    name = "draft"

    def __init__(self, k: int = 2):
        self.k = k

    def scores(self, bb, kv, ids, last_id):
        return row_scores(bb.draft(kv, last_id, self.k).attention)


class CoinSelector:
    name = "coin"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def scores(self, bb, kv, ids, last_id):
        return self.draw(kv.length)

    def draw(self, m: int) -> torch.Tensor:
        """One draw of the stream: a uniformly random ranking of m rows."""
        return torch.from_numpy(self.rng.random(m))


class CacheBlendSelector:
    name = "cacheblend"

    def scores(self, bb, kv, ids, last_id):
        fresh = bb.prefill_layers(ids, kv.positions, layers=2)
        return (fresh.values[1] - kv.values[1].to(fresh.values.dtype)).float().norm(dim=-1).mean(dim=(0, 1))
