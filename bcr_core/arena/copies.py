"""One call of the arena: every selector ranks the same assembled cache, each repairs a copy at
exactly the same number of rows, and each copy is measured against Dense on the same prompt.

The budgets (`counts`): `paired`, the rows the run's own BCR-chunk repaired on this very call (0
where its skip rule left the call unrepaired: every copy is then the unrepaired cache), and for
each rho of the sweep round(rho x M) rows, M the cached rows (no skip rule: the sweep asks what a
count of rows buys). A ranking becomes rows through the chunk layout's `exactly` (whole chunks best
first, the last cut to the count); a row rule (`seams`, `window`) through the single layout's.
Rankings are computed once per call and spent at every budget.

Each copy gets one teacher-forced forward on Dense's continuation (`DenseReference`; copies of
one call are stacked along the cache's batch dimension, `BATCH` per forward through
`Backbone.forced_logits_batch`, and copies with the same rows are measured once):
`kl`, the mean over Dense's steps of KL(Dense || copy), exactly `fidelity.teacher_forced_kl`'s
definition; `first_token_agree`; `identical`, the copy's argmax equal to Dense's token at every
step (and, where Dense stopped before its token limit, a stop token at the step after), so the
greedy continuation from the copy is Dense's; `rows` and `rows_wasted` (rows KVComm did not
predict: the agent's exact prefix, where repair changes nothing), and `runs`, the rows themselves
as runs of consecutive rows ([[start, stop), ...]). Per selector and call: its own cost, `passes`
(model forwards) and `ms` (the K/V-error rankings' include the exact prefill).

`searched` (`bcr_core.arena.search`) is no ranking: after every selector is measured, it searches
each budget's row sets on the measured KL itself, seeded by the selectors' sets at that count; its
`passes` are the sets it measured (each a repair and a share of a batched forward), its `ms` the
search's time and the exact prefill.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from bcr_core.arena import search
from bcr_core.arena.registry import Entry
from bcr_core.engine.kv import KV
from bcr_core.repair.call_context import CallContext
from bcr_core.repair.layouts import LayoutConfig, layout
from bcr_core.reuse.calls import CallRecord
from bcr_core.reuse.fidelity import mean_kl
from bcr_core.reuse.segments import predicted_rows

PAIRED = "paired"
BATCH = 8  # copies per teacher-forced forward


def budget_label(rho: float) -> str:
    return f"{rho:g}"


def counts(paired_rows: int, m: int, rhos) -> dict[str, int]:
    """Rows per budget on an M-row cache: the paired BCR-chunk count, then round(rho x M) per rho."""
    return {PAIRED: paired_rows, **{budget_label(rho): round(rho * m) for rho in rhos}}


class DenseReference:
    """Dense's continuation of one call, teacher-forced once; `measure` scores a copy against it."""

    def __init__(self, bb, dense: CallRecord, max_new_tokens: int):
        if dense.served is None:
            raise ValueError("the arena needs Dense's served cache for every call")
        tokens = list(dense.output_tokens)
        self.bb, self.tokens, self.steps = bb, tokens, max(len(tokens), 1)
        self.stop = set(bb.stop_ids)
        stopped = len(tokens) < max_new_tokens
        self.fed = tokens + [bb.stop_ids[0]] if stopped or not tokens else tokens
        self.checks_stop = stopped
        self.log_p = bb.forced_logits(*dense.served, self.fed).log_softmax(-1)[: self.steps]

    def measure(self, kv, last_id: int) -> dict:
        return self.measure_many([kv], last_id)[0]

    def measure_many(self, kvs: list, last_id: int) -> list[dict]:
        """Copies of one cache (same rows, same positions) measured in one batched forward."""
        return [self.score(logits) for logits in self.bb.forced_logits_batch(KV.batch(kvs), last_id, self.fed)]

    def score(self, logits: torch.Tensor) -> dict:
        kl = mean_kl(self.log_p, logits[: self.steps].log_softmax(-1))
        greedy = logits.argmax(-1).tolist()
        n = len(self.tokens)
        same = greedy[:n] == self.tokens and (not self.checks_stop or greedy[n] in self.stop)
        first = greedy[0] == self.tokens[0] if self.tokens else greedy[0] in self.stop
        return {"kl": kl, "first_token_agree": bool(first), "identical": bool(same)}


@dataclass
class ArenaCall:
    """One assembled call: its cache, ids, segment map, the paired count and its place in the run."""

    kv: object  # KV: the assembled cache, before any repair
    ids: list[int]  # the reuse path's ids, the last one included
    spans: list[dict]
    paired_rows: int
    key: tuple[int, ...] = ()


def spend(entry: Entry, scores: torch.Tensor, candidates: torch.Tensor, rows: int, chunk: int) -> list[int]:
    """The rows a ranking buys at `rows`: exactly that many (capped at the candidates), in the chunk
    layout's unit for a ranking, one by one for a row rule."""
    unit = layout("single" if entry.row_rule else "chunk", LayoutConfig(chunk=chunk))
    chosen = unit.exactly(scores, min(rows, scores.numel()))
    return sorted(int(candidates[j]) for j in chosen)


def run_call(bb, call: ArenaCall, reference: DenseReference, entries: list[Entry], rhos, chunk: int) -> dict:
    """Every selector on one call at every budget; returns {"entries": [...], "cost": {...}}, plus,
    with a `searched` entry, `search` (its record per budget) and `token_matched` (the exact cache
    of the same ids, measured: the floor every repair of this cache reaches at every row)."""
    kv, ids, m = call.kv, call.ids, call.kv.length
    predicted = set(predicted_rows(call.spans, m))
    exact_ms, exact = timed(lambda: bb.prefill(ids[:-1])) if any(e.reads_exact for e in entries) else (0.0, None)
    context = CallContext(call.spans, call.key, exact)
    budgets = counts(call.paired_rows, m, rhos)
    chosen: list[tuple[dict, tuple[int, ...]]] = []
    cost = {}
    for entry in (e for e in entries if not e.searched):
        candidates = entry.candidates(m, call.spans)
        ms, ranking = timed(lambda entry=entry, c=candidates: entry.rank(bb, kv, ids[:-1], ids[-1], c, context))
        cost[entry.label] = {"passes": entry.passes, "ms": ms + (exact_ms if entry.reads_exact else 0.0)}
        for budget, count in budgets.items():
            rows = spend(entry, ranking.scores.detach().cpu(), candidates, count, chunk) if count else []
            chosen.append(({"selector": entry.label, "budget": budget, "rows": len(rows)}, tuple(rows)))
    measured = measure_copies(bb, kv, ids, reference, [(), *(rows for _, rows in chosen)])
    out = {"cached_rows": m, "unrepaired": measured[()], "cost": cost}

    evaluate = kl_of_sets(bb, kv, ids, reference, measured)
    for entry in (e for e in entries if e.searched):
        started, records = time.perf_counter(), {}
        for budget, count in budgets.items():
            seeds = {rows: measured[rows]["kl"] for e, rows in chosen if e["budget"] == budget and len(rows) == count}
            rows, records[budget] = search.search(evaluate, seeds, m, count, chunk, **entry.options)
            chosen.append(({"selector": entry.label, "budget": budget, "rows": len(rows)}, rows))
        spent = sum(r["evaluations"] for r in records.values())
        cost[entry.label] = {"passes": spent, "ms": 1000 * (time.perf_counter() - started) + exact_ms}
        out |= {"search": out.get("search", {}) | {entry.label: records}}
        out["token_matched"] = reference.measure(exact, ids[-1])
    wasted = lambda rows: sum(j not in predicted for j in rows)
    out["entries"] = [e | {"rows_wasted": wasted(r)} | measured[r] | {"runs": search.runs(r)} for e, r in chosen]
    return out


def measure_copies(bb, kv, ids, reference: DenseReference, row_sets, batch: int = BATCH) -> dict:
    """{rows: measures} for every distinct row set (the empty one: the unrepaired cache): each
    repaired on its own copy, measured `batch` copies per forward."""
    distinct = list(dict.fromkeys(row_sets))
    measured = {}
    for first in range(0, len(distinct), batch):
        group = distinct[first : first + batch]
        copies = [bb.repair(kv, ids[:-1], list(rows)) if rows else kv for rows in group]
        measured.update(zip(group, reference.measure_many(copies, ids[-1])))
    return measured


def kl_of_sets(bb, kv, ids, reference: DenseReference, measured: dict):
    """`search.search`'s `evaluate`: the KL of each row set, measured `BATCH` copies per forward
    (`measure_copies`) and kept in `measured` with the rest."""

    def evaluate(sets):
        measured.update(measure_copies(bb, kv, ids, reference, sets))
        return [measured[rows]["kl"] for rows in sets]

    return evaluate


def timed(work):
    started = time.perf_counter()
    value = work()
    return 1000 * (time.perf_counter() - started), value
