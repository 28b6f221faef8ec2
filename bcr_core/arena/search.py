"""`searched`: the arena's ceiling, per assembled call and budget, the row set that leaves the least
of the arena's own measure (KL(Dense || copy), teacher-forced on Dense's continuation, the number
every selector is scored by). Not deployable: it scores sets by measuring them against Dense.

The space (`chunk_space`): the sets the chunk layout can spend at R rows of an M-row cache, i.e.
what `Chunk.exactly` returns for some scores: a set of whole chunks of the B-row grid over all M
rows and, where their rows fall short of R, the first R - (their rows) rows of one more chunk (fewer
than that chunk holds). `space_size` counts them without listing them.

Per call and budget, one case (recorded with the evaluations spent and the seconds):

- `exhaustive`, when the space holds at most `cap` sets: every one is measured, so the space's best
  is the true optimum over that space (`optimum` true, its KL `space_kl`).
- `local`, otherwise: a local search started from the best set any arena selector spent at that
  count (selectors' sets with exactly R rows: the seeds), so it never ends worse than any of them.
  A move (`moves`) takes the donor chunk's last t chosen rows out and the receiver chunk's first t
  unchosen rows in, t the smaller of the two, for every ordered pair of chunks of the grid (on a
  set of the space: swap a whole chunk, or move the cut); moves are tried best-voted first (a chunk's
  votes: the seeds' rows in it) in batches, the batch's best taken when it improves, until no move
  improves (`local_optimum`; not where the cap cut the last round short) or `evals` evaluations are
  spent. Its best is a search's best, not an optimum.
- `none`, at a count of 0 (a call its skip rule left unrepaired): the empty set.

In both searching cases the seeds take part: the searched set is the best of everything measured,
so a row rule's set outside the space (`seams`, `window`) may beat the space's optimum (`from`).
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable

CAP = 64  # sets of the chunk space measured exhaustively at most
EVALS = 48  # the local search's evaluations per call and budget
BATCH = 8  # sets measured per batch (one teacher-forced forward for the batch)

Rows = tuple[int, ...]


def grid(m: int, chunk: int) -> list[tuple[int, int]]:
    """The chunk grid over every row of an M-row cache: [start, stop) per chunk, the last one short."""
    return [(start, min(start + chunk, m)) for start in range(0, m, chunk)]


def space_size(m: int, rows: int, chunk: int) -> int:
    """How many sets the chunk layout can spend at `rows` rows of an M-row cache."""
    ways: dict[tuple[int, bool], int] = {(0, False): 1}  # (rows taken, cut used) -> sets
    for start, stop in grid(m, chunk):
        size, step = stop - start, defaultdict(int)
        for (taken, cut), count in ways.items():
            step[taken, cut] += count  # chunk left out
            if taken + size <= rows:
                step[taken + size, cut] += count  # taken whole
            if not cut:
                for part in range(1, min(size - 1, rows - taken) + 1):
                    step[taken + part, True] += count  # the cut chunk: its first rows
        ways = step
    return ways.get((rows, False), 0) + ways.get((rows, True), 0)


def chunk_space(m: int, rows: int, chunk: int):
    """Every set of the space, each once (sorted row tuples)."""
    chunks = grid(m, chunk)
    sizes = [stop - start for start, stop in chunks]
    for k in range(min(len(chunks), rows // min(sizes, default=1)) + 1):
        for whole in itertools.combinations(range(len(chunks)), k):
            left = rows - sum(sizes[c] for c in whole)
            if left < 0:
                continue
            base = [j for c in whole for j in range(*chunks[c])]
            if left == 0:
                yield tuple(base)
                continue
            for c, (start, _) in enumerate(chunks):
                if c not in whole and sizes[c] > left:
                    yield tuple(sorted(base + list(range(start, start + left))))


def moves(rows: Rows, m: int, chunk: int) -> list[tuple[int, int, Rows]]:
    """(donor, receiver, new set) for every ordered pair of chunks: the donor's last t chosen rows
    out, the receiver's first t unchosen rows in, t = min(donor's chosen, receiver's unchosen)."""
    chosen = set(rows)
    chunks = grid(m, chunk)
    inside = [[j for j in range(a, b) if j in chosen] for a, b in chunks]
    outside = [[j for j in range(a, b) if j not in chosen] for a, b in chunks]
    out = []
    for donor, give in enumerate(inside):
        for receiver, room in enumerate(outside):
            if donor == receiver or not give or not room:
                continue
            t = min(len(give), len(room))
            out.append((donor, receiver, tuple(sorted((chosen - set(give[-t:])) | set(room[:t])))))
    return out


def chunk_votes(seeds, m: int, chunk: int) -> list[int]:
    """Each chunk's votes: the seeds' rows in it (the local search tries best-voted moves first)."""
    return [sum(sum(a <= j < b for j in s) for s in seeds) for a, b in grid(m, chunk)]


def local_search(
    evaluate: Callable[[list[Rows]], list[float]],
    seen: dict[Rows, float],
    start: Rows,
    m: int,
    chunk: int,
    votes: list[float],
    evals: int,
) -> tuple[Rows, int, bool]:
    """(best set, evaluations spent, whether it ended at a local optimum) from `start`; `seen` holds
    the KL of every set measured so far and gains those measured here."""
    best, spent = start, 0
    while True:
        ordered = sorted(moves(best, m, chunk), key=lambda mv: (votes[mv[0]] - votes[mv[1]], mv[0], mv[1]))
        pending = [s for s in dict.fromkeys(s for _, _, s in ordered) if s not in seen]
        improved = False
        for first in range(0, len(pending), BATCH):
            if spent >= evals:
                return best, spent, False
            group = pending[first : first + BATCH][: evals - spent]
            seen.update(zip(group, evaluate(group)))
            spent += len(group)
            candidate = min(group, key=lambda s: (seen[s], s))
            if seen[candidate] < seen[best]:
                best, improved = candidate, True
                break
        if not improved:  # a local optimum only if the cap left no move of the last round untried
            return best, spent, all(s in seen for s in pending)


def search(
    evaluate: Callable[[list[Rows]], list[float]],
    seeds: dict[Rows, float],
    m: int,
    rows: int,
    chunk: int,
    cap: int = CAP,
    evals: int = EVALS,
) -> tuple[Rows, dict]:
    """The searched set at `rows` rows and its record: `case`, `space` (the chunk space's size),
    `evaluations`, `seconds`, `optimum` (true where the space was exhausted), `space_kl` (the
    space's best where exhausted), `local_optimum` (local case), `from` (`space`, `seed` or `search`).
    `seeds`: {set: KL} of the selectors' sets with exactly `rows` rows, already measured."""
    started = time.perf_counter()
    size = space_size(m, rows, chunk)
    info = {"space": size, "evaluations": 0, "optimum": False}
    if rows == 0:
        return (), info | {"case": "none", "seconds": 0.0, "from": "seed"}
    seen = dict(seeds)
    if size <= cap:
        space = list(chunk_space(m, rows, chunk))
        fresh = [s for s in space if s not in seen]
        for first in range(0, len(fresh), BATCH):
            group = fresh[first : first + BATCH]
            seen.update(zip(group, evaluate(group)))
        inside = min(space, key=lambda s: (seen[s], s))
        overall = min(seen, key=lambda s: (seen[s], s))
        best, origin = (overall, "seed") if seen[overall] < seen[inside] else (inside, "space")
        info |= {"case": "exhaustive", "evaluations": len(fresh), "optimum": True, "space_kl": seen[inside]}
        info["from"] = origin
    else:
        if not seeds:
            raise ValueError(f"the local search at {rows} rows needs a selector's set of that many rows to start")
        start = min(seeds, key=lambda s: (seeds[s], s))
        best, spent, local = local_search(evaluate, seen, start, m, chunk, chunk_votes(seeds, m, chunk), evals)
        info |= {"case": "local", "evaluations": spent, "local_optimum": local}
        info["from"] = "seed" if best == start else "search"
    return best, info | {"seconds": time.perf_counter() - started}


def stopped_at_cap(record: dict, evals: int) -> bool:
    """Whether a search's record says the cap of `evals` stopped it: a local search not at a local
    optimum, or one that spent the whole cap (records made before `local_search` checked the last
    round's untried moves may call such a search a local optimum)."""
    return record["case"] == "local" and (not record["local_optimum"] or record["evaluations"] >= evals)


def runs(rows) -> list[list[int]]:
    """A sorted row set as its maximal runs of consecutive rows, [[start, stop), ...]."""
    out: list[list[int]] = []
    for j in sorted(rows):
        if out and out[-1][1] == j:
            out[-1][1] = j + 1
        else:
            out.append([j, j + 1])
    return out


def rows_of(spans) -> list[int]:
    """The rows of a run list (`runs`' inverse)."""
    return [j for start, stop in spans for j in range(start, stop)]
