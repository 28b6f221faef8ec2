"""A short Dense-vs-repaired demonstration on one prompt.

The prompt's cache is computed behind a foreign prefix and moved back to position 0, as a reuse
method would serve it. Greedy answers are then compared with Dense's: unrepaired, with the
draft's highest-scoring rows recomputed at a few budgets, and fully repaired.
"""

from __future__ import annotations

import pandas as pd

from bcr_core.engine.backbone import Backbone
from bcr_core.probes.verify import DEFAULT_PROMPT, cache_under_prefix
from bcr_core.repair.row_scores import row_scores


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or None when one sequence is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def demo(
    bb: Backbone, prompt: str = DEFAULT_PROMPT, budgets=(0.1, 0.2, 0.4, 1.0), new_tokens: int = 48
) -> pd.DataFrame:
    ids = bb.chat_ids([{"role": "user", "content": prompt}])
    cached, last = ids[:-1], ids[-1]
    dense = bb.generate(bb.prefill(cached), last, new_tokens).tokens
    under_prefix, d = cache_under_prefix(bb, cached)
    reused = bb.shift(under_prefix, -d)
    ranking = row_scores(bb.draft(reused, last).attention).argsort(descending=True)

    served = [("dense", 0, dense), ("reused, unrepaired", 0, bb.generate(reused, last, new_tokens).tokens)]
    for rho in budgets:
        rows = ranking[: max(1, round(rho * len(cached)))]
        repaired = bb.repair(reused, cached, rows)
        served.append(
            (f"reused, draft-repaired rho={rho:g}", len(rows), bb.generate(repaired, last, new_tokens).tokens)
        )
    return pd.DataFrame(
        [
            {
                "condition": name,
                "rows_recomputed": rows,
                "identical_to_dense": tokens == dense,
                "first_divergence": first_divergence(tokens, dense),
                "answer": bb.decode(tokens),
            }
            for name, rows, tokens in served
        ]
    )
