"""The unit-of-choice probe (paper §4.2, Table 8): how much choosing rows is worth, by unit.

One long segment sits behind an agent prefix. Its cache is predicted by KVComm's reuse path from
anchors built on the other prompts (leave-one-out, gate forced open), then a nominal budget of
its rows is restored from the dense cache, grouped in units of 1, 16, 64, 256 or 1024 rows and
chosen either by the attention the consuming context's decode queries pay them in the predicted
cache (informed) or by coin (several seeds). The budget keeps max(1, round(budget * n_units))
units, so coarse units are not budget-matched, as in Table 8.

Error: the relative L2 distance between the attention outputs (every layer's input to o_proj) of
the decode queries run over the test cache and over the dense cache, pooled over layers, heads
and queries. The decode queries are the prompt's final token and Dense's first greedy tokens,
teacher-forced. gap_share = (random - informed) / unrepaired.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats
from tqdm.auto import tqdm

from bcr_core import paper
from bcr_core.engine.kv import KV
from bcr_core.errors import UsageError
from bcr_core.paths import utf8_text
from bcr_core.repair.layouts import best
from bcr_core.repair.row_scores import group_scores, row_scores
from bcr_core.reuse.anchors import KVCommConfig
from bcr_core.reuse.prompts import QUESTION, render, tokenize
from bcr_core.reuse.servers import KVCommServer

SYSTEM = "You are a careful reader. Use the document the user gives you."
USER = "Document:\n{" + QUESTION + "}\n\nIn one sentence, what is the document above mostly about?"


@dataclass(frozen=True)
class UnitCurveConfig:
    segment_tokens: int = 2048
    budget: float = paper.RHO
    units: tuple[int, ...] = (1, 16, 64, 256, 1024)
    seeds: tuple[int, ...] = (0, 1, 2)
    decode_queries: int = 8  # the final prompt token + this many - 1 of Dense's greedy tokens

    def __post_init__(self):
        if not self.seeds:
            raise UsageError("the probe needs at least one random seed to compare informed choice with")
        if not 0.0 < self.budget <= 1.0:
            raise UsageError(f"the budget must lie in (0, 1], got {self.budget}")
        if not self.units or len(set(self.units)) != len(self.units):
            raise UsageError(f"units {list(self.units)}: give at least one unit, each once")
        too_long = [u for u in self.units if u < 1 or u > self.segment_tokens]
        if too_long:
            raise UsageError(f"units {too_long} do not fit a {self.segment_tokens}-token segment")


def default_texts(n: int = 6) -> list[str]:
    """Six long documents from the committed data: GSM8K problems with their worked solutions,
    each document starting at a different problem."""
    from bcr_core.data.datasets import load_gsm8k

    items = load_gsm8k()
    blocks = [f"Problem: {it['question']}\nSolution: {it.get('solution', it['answer'])}\n" for it in items]
    step = len(blocks) // n
    return ["\n".join(blocks[i * step :] + blocks[: i * step]) for i in range(n)]


def read_prompts(path: Path) -> list[str]:
    """The `text` of every line of a JSONL file; a missing file, a folder or a bad line is an error
    naming the file (and the line)."""
    path = Path(path)
    wanted = "give a JSONL file, one object with a 'text' field per line"
    if path.is_dir() or not path.exists():
        raise UsageError(f"--prompts {path}: {'is a folder' if path.is_dir() else 'no such file'}; {wanted}")
    texts = []
    for number, line in enumerate(utf8_text(path, "JSON lines with a 'text' field").splitlines(), start=1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise UsageError(f"{path}:{number}: each line must be a JSON object with a 'text' field")
            texts.append(row["text"])
    if not texts:
        raise UsageError(f"--prompts {path} holds no prompts; {wanted}")
    return texts


@dataclass
class Case:
    """One prompt: ids, where the segment sits, and the caches the probe compares."""

    ids: list[int]
    spans: list[dict]
    segment: slice
    full: KV  # the dense cache of every prompt row (anchors need the last one too)
    queries: list[int]  # the decode tokens fed over a cache: final prompt token, then Dense's greedy ones

    @property
    def dense(self) -> KV:
        """The served dense cache: one row short of the prompt."""
        return self.full.truncate(len(self.ids) - 1)


def build_case(bb, text: str, config: UnitCurveConfig) -> Case:
    segment = tokenize(bb.tokenizer, text)
    if len(segment) < config.segment_tokens:
        raise UsageError(f"a prompt has {len(segment)} tokens, fewer than --segment-tokens {config.segment_tokens}")
    segment = segment[: config.segment_tokens]
    before, after = render(bb.tokenizer, SYSTEM, USER).split("{" + QUESTION + "}")
    prefix, suffix = tokenize(bb.tokenizer, before), tokenize(bb.tokenizer, after)
    ids = prefix + segment + suffix
    a, b = len(prefix), len(prefix) + len(segment)
    spans = [
        {"name": "prefix", "start": 0, "stop": a, "placeholder": False},
        {"name": QUESTION, "start": a, "stop": b, "placeholder": True},
        {"name": f"after:{QUESTION}", "start": b, "stop": len(ids), "placeholder": False},
    ]
    full = bb.prefill(ids)
    greedy = bb.generate(full.truncate(len(ids) - 1), ids[-1], config.decode_queries - 1, stop_ids=()).tokens
    return Case(ids, spans, slice(a, b), full, [ids[-1], *greedy])


def feed(bb, kv: KV, tokens: list[int], **kwargs):
    """Run `tokens` over `kv` at the positions that follow it (the cache is not modified)."""
    with torch.inference_mode():
        ids = torch.tensor([tokens], device=bb.device)
        positions = torch.arange(kv.next_position, kv.next_position + len(tokens), device=bb.device)[None]
        return bb.model.base_model(input_ids=ids, position_ids=positions, cache=kv.to_cache(), use_cache=True, **kwargs)


def attention_outputs(bb, kv: KV, tokens: list[int]) -> torch.Tensor:
    """Every layer's attention output (the input to o_proj) for `tokens` fed over `kv`, stacked."""
    captured = []
    hooks = [
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: captured.append(args[0][0].float()))
        for layer in bb.model.base_model.layers
    ]
    try:
        feed(bb, kv, tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(captured)


def consumer_attention(bb, kv: KV, tokens: list[int]) -> torch.Tensor:
    """The decode queries' attention over the cached rows: (layers, queries, heads, rows)."""
    with bb.attention_implementation("eager"):
        out = feed(bb, kv, tokens, output_attentions=True)
    return torch.stack([a[0, :, :, : kv.length].transpose(0, 1) for a in out.attentions]).float()


def relative_error(test: torch.Tensor, reference: torch.Tensor) -> float:
    return float((test - reference).norm() / reference.norm())


def units_to_rows(chosen: torch.Tensor, unit: int, segment: slice) -> torch.Tensor:
    starts = segment.start + chosen * unit
    rows = (starts[:, None] + torch.arange(unit)[None, :]).flatten()
    return rows[rows < segment.stop].sort().values


def predicted_caches(bb, cases: list[Case]) -> list[KV]:
    """Each case's segment predicted from the other cases' anchors (leave-one-out, gate forced open);
    the prefix and the consuming text after the segment are exact, so all error is the segment's."""
    out = []
    for i, case in enumerate(cases):
        server = KVCommServer(bb, KVCommConfig(gamma=1.0))
        for j, other in enumerate(cases):
            if j != i:
                server.store_anchors(other.ids, other.spans, "consumer", other.full)
        decisions = server.gate(case.ids, case.spans, "consumer")
        if not all(d.reuse for d in decisions):
            raise RuntimeError(f"the reuse path refused prompt {i}: {[d.reason for d in decisions]}")
        assembled = server.assemble(case.ids, case.spans, "consumer", decisions)
        consumer = torch.arange(case.segment.stop, assembled.length)  # the consuming context stays exact
        out.append(assembled.replace(consumer, case.dense.select(consumer)))
    return out


def unit_curve(
    bb, texts: list[str], config: UnitCurveConfig = UnitCurveConfig(), progress: bool = True
) -> pd.DataFrame:
    """Per prompt and unit: errors unrepaired, informed, and random (one row per seed)."""
    if len(texts) < 3:
        raise UsageError("the probe needs at least 3 prompts: each is predicted from the others' anchors")
    cases = [build_case(bb, t, config) for t in tqdm(texts, desc="dense prefills", disable=not progress)]
    predicted = predicted_caches(bb, cases)
    rows = []
    for p, (case, kv) in enumerate(tqdm(list(zip(cases, predicted)), desc="unit curve", disable=not progress)):
        reference = attention_outputs(bb, case.dense, case.queries)
        unrepaired = relative_error(attention_outputs(bb, kv, case.queries), reference)
        scores = row_scores(consumer_attention(bb, kv, case.queries))[case.segment]
        for unit in config.units:
            n_units = -(-config.segment_tokens // unit)
            keep = max(1, round(config.budget * n_units))
            choices = {("informed", None): best(group_scores(scores, unit), keep)}
            for seed in config.seeds:
                rng = np.random.Generator(np.random.PCG64(seed))
                choices[("random", seed)] = torch.from_numpy(rng.permutation(n_units)[:keep])
            for (selection, seed), chosen in choices.items():
                restored = units_to_rows(chosen, unit, case.segment)
                test = kv.replace(restored, case.dense.select(restored))
                rows.append(
                    {
                        "prompt": p,
                        "unit": unit,
                        "selection": selection,
                        "seed": seed,
                        "budget_realised": len(restored) / config.segment_tokens,
                        "error": relative_error(attention_outputs(bb, test, case.queries), reference),
                        "unrepaired_error": unrepaired,
                    }
                )
    return pd.DataFrame(rows)


def summarize_curve(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Table 8: per unit, mean errors over prompts, gap share, and informed's wins with a paired t."""
    out = []
    for unit, group in per_prompt.groupby("unit", sort=True):
        informed = group[group.selection == "informed"].set_index("prompt")["error"]
        random = group[group.selection == "random"].groupby("prompt")["error"].mean()
        unrepaired = group.groupby("prompt")["unrepaired_error"].first()
        gap = random - informed
        t = stats.ttest_rel(random, informed) if len(gap) > 1 and gap.std() > 0 else None
        out.append(
            {
                "unit": int(unit),
                "budget_realised": float(group["budget_realised"].mean()),
                "informed_error": float(informed.mean()),
                "random_error": float(random.mean()),
                "unrepaired_error": float(unrepaired.mean()),
                "gap_share": float(gap.mean() / unrepaired.mean()),
                "informed_wins": f"{int((gap > 0).sum())}/{len(gap)}",
                "p_paired_t": float(t.pvalue) if t is not None else float("nan"),
            }
        )
    return pd.DataFrame(out)


SEED_MAX = 2**32 - 1  # numpy's largest seed


def seeds_from(first: int, count: int) -> tuple[int, ...]:
    """`bcr unit-curve`'s `--seed`, `--seeds`: `count` consecutive seeds of the random selections from `first`,
    every one inside numpy's seed range."""
    if count < 1:
        raise UsageError(f"--seeds is how many random selections to compare with, at least 1; got {count}")
    if not 0 <= first <= SEED_MAX - count + 1:
        raise UsageError(
            f"--seed: the random selections' seeds {first}..{first + count - 1} must lie in "
            f"[0, {SEED_MAX}] (numpy's seed range); got --seed {first}"
        )
    return tuple(first + i for i in range(count))


def curve_table(model: str, dtype: str, segment_tokens: int, budget: float, units, seeds, prompts=None) -> pd.DataFrame:
    """`bcr unit-curve`: Table 8's probe on `model`, over the texts of `prompts` (JSONL) or the default documents,
    summarized per unit; every setting checked (`UnitCurveConfig`) before the model loads."""
    from bcr_core.engine.loading import load_backbone

    config = UnitCurveConfig(segment_tokens, budget, tuple(units), tuple(seeds))
    texts = read_prompts(prompts) if prompts else default_texts()
    return summarize_curve(unit_curve(load_backbone(model, dtype), texts, config, progress=True))
