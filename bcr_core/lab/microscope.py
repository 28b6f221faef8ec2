"""The repair microscope: the selector arena's field on one call, as the explorer draws it.

For a call served from an assembled cache, `rank_field` runs every selector of `FIELD` on that
cache (the arena's own rules, `bcr_core.arena`), with the exact cache of the same ids for the
K/V-error rankings, and keeps each one's per-row scores on the `CallView`. From them the explorer shows:

- the true per-row error, `kv-error`'s score: `arena.error_selectors.row_error`, the L2 norm over every
  layer, head and dimension of the assembled rows' key and value deviation from the exact cache;
- CacheBlend's deviation at its default check layer 1 (`CacheBlendSelector`'s score);
- the rows each selector picks when it spends exactly as many rows as the explorer's layout picks
  at the current rho (the arena's paired budget: selectors differ in nothing but selection), turned
  into rows as the arena does (`arena.copies.spend`: whole chunks for a ranking, single rows for
  a row rule);
- the continuation each selector's repaired copy gives, beside Dense's.

One more lane, `searched`, is the arena's ceiling on this call (`bcr_core.arena.search`): the row set
at the layout's count that leaves the least KL to Dense's continuation of the same prompt, seeded by
this field's picks at that count (one coin, so on a call the arena ran too it may end elsewhere).
It measures sets against Dense, so it is searched once per call at the count the inspection is
saved with (`search_at`, by `lab.saved_inspection.save`) and shown at that count only.

The scores are computed once, when the call is inspected (they need the cache and the model), and
saved with the inspection, so a loaded one shows every selector's picks at any rho without a model
(an inspection saved before the K/V-error rankings were renamed holds them as `oracle` and
`oracle-attn`: read under today's names).
"""

from __future__ import annotations

import torch

from bcr_core.arena import search
from bcr_core.arena.copies import DenseReference, kl_of_sets, measure_copies, spend
from bcr_core.arena.registry import Entry, current_label, make_entries, make_entry
from bcr_core.repair.call_context import CallContext

# the arena's field, one coin seed (the picks of one draw; the arena averages three)
FIELD = (
    "kv-error",
    "kv-error-attn",
    "draft",
    "draft:rank=predicted",
    "coin:seed=0",
    "cacheblend",
    "cacheblend:layer=3",
    "question",
    "seams",
    "window",
    "ours",
)
ERROR, DEVIATION = "kv-error", "cacheblend"  # the two bands under the heatmap
SEARCHED = "searched"  # the lane of the searched set, where the call holds one at the count


def field_entries(layers: int, chunk: int) -> list[Entry]:
    """`FIELD` as arena entries, less CacheBlend check layers the model does not have."""
    entries = make_entries(",".join(FIELD), chunk)
    return [e for e in entries if e.name != "cacheblend" or e.options.get("layer", 1) < layers]


def rank_field(bb, view, key: tuple[int, ...], chunk: int) -> dict[str, torch.Tensor]:
    """{selector label: its scores over the rows it ranks} on `view`'s assembled cache (float32;
    the coin seeded by `key`, the call's place in the run, as in the arena)."""
    if view.kv is None:
        raise ValueError("the microscope ranks the assembled cache: a loaded view does not hold it")
    ids = view.ids
    context = CallContext(view.segments, key, bb.prefill(ids[:-1]))
    scores = {}
    for entry in field_entries(bb.num_layers, chunk):
        candidates = entry.candidates(view.rows, view.segments)
        ranking = entry.rank(bb, view.kv, ids[:-1], ids[-1], candidates, context)
        scores[entry.label] = ranking.scores.detach().float().cpu()
    return scores


def picks(view, count: int, chunk: int) -> dict[str, list[int]]:
    """The rows each selector of the view's field repairs when it spends exactly `count` rows
    (capped at the rows it ranks), in `FIELD` order, then the searched set where the view holds one
    at `count`."""
    out = {}
    for label, scores in view.rankings.items():
        entry = make_entry(label, chunk)
        candidates = entry.candidates(view.rows, view.segments)
        out[current_label(label)] = spend(entry, scores, candidates, count, chunk) if count else []
    if count in view.searched:
        out[SEARCHED] = view.searched[count]["rows"]
    return out


def search_at(bb, view, count: int, chunk: int, max_new_tokens: int) -> dict:
    """The searched set on `view` at `count` rows and its record: `rows`, `kl` (KL(Dense || copy),
    teacher-forced on Dense's continuation, as the arena measures), `unrepaired_kl`, and the
    search's own record (`case`, `evaluations`, `seconds`, `optimum`, ...: `arena.search.search`).
    Needs the assembled cache and Dense's served record of the same prompt (a view inspected
    with Dense, not a loaded one)."""
    if view.kv is None or view.dense is None:
        raise ValueError("the searched set needs the assembled cache and Dense's cache: a loaded view holds neither")
    reference = DenseReference(bb, view.dense, max_new_tokens)
    field = picks(view, count, chunk)
    seeds = [tuple(rows) for label, rows in field.items() if label != SEARCHED and len(rows) == count]
    measured = measure_copies(bb, view.kv, view.ids, reference, [(), *seeds])
    evaluate = kl_of_sets(bb, view.kv, view.ids, reference, measured)
    rows, record = search.search(evaluate, {s: measured[s]["kl"] for s in seeds}, view.rows, count, chunk)
    return {"rows": list(rows), "kl": measured[rows]["kl"], "unrepaired_kl": measured[()]["kl"]} | record


def band(view, label: str):
    """A selector's scores over every cached row (NaN where it ranks none), for the bands."""
    scores = next((v for k, v in view.rankings.items() if current_label(k) == label), None)
    if scores is None:
        return None
    entry = make_entry(label)
    full = torch.full((view.rows,), float("nan"))
    full[entry.candidates(view.rows, view.segments)] = scores
    return full.numpy()
