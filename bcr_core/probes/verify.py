"""`bcr verify`: the exactness checks every repair path must pass (paper App. B, "Correctness").

1. Full repair: the prompt's cache computed under a foreign prefix and re-rotated back to
   position 0 is wrong everywhere past layer 0; recomputing every row (rho = 1) must give Dense's cache
   bit for bit and make greedy generation token-identical to Dense. Dense here runs through the repair's
   own attention kernel (`Backbone.reference_prefill`): on a GPU in half precision the model's default
   causal kernel rounds differently from the repair's masked query blocks, and that difference, which
   greedy decoding amplifies, says nothing about the repair. How far the default kernel's Dense lies from
   it is reported beside (`kernel_max_abs_err`), and in fp32 held to a tolerance that scales with the values
   compared (`kernel_tolerance`): rounding through every layer in another summation order, not a wrong kernel.
2. Re-rotation round trip: keys moved by +d then -d come back to float tolerance.
3. Placement: a prefix-free cache moved to offset d matches, at layer 0, a dense prefill of the
   same tokens behind a d-token prefix (layer 0 depends only on token and position).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from bcr_core.engine.backbone import Backbone

DEFAULT_PROMPT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
FOREIGN_PREFIX = (
    "The following note was found in a ship's logbook, written by a captain who loved long stories "
    "about storms, maps and buried treasure. Read it carefully before answering anything.\n"
)
MIN_TOKENS_COMPARED = 24
ROUND_TRIP_SHIFT = 4096


@dataclass
class VerifyReport:
    model: str
    full_repair_token_identical: bool
    tokens_compared: int
    rerotation_max_abs_err: float
    rerotation_tolerance: float
    dtype: str
    kernel_max_abs_err: float  # Dense through the model's default kernel vs through the repair's
    kernel_tolerance: float  # what fp32 holds it to: a share of the largest key or value compared
    unrepaired_token_identical: bool  # informational: the corruption should usually change the answer
    corruption_max_abs_err: float  # how wrong the corrupted cache's values were
    repair_max_abs_err: float  # fully repaired cache vs Dense through the same kernel, all layers: 0 when exact
    dense_text: str
    repaired_text: str

    @property
    def passed(self) -> bool:
        return (
            self.full_repair_token_identical
            and self.repair_max_abs_err == 0.0
            and self.tokens_compared >= MIN_TOKENS_COMPARED
            and self.rerotation_max_abs_err <= self.rerotation_tolerance
            and (self.dtype != "float32" or self.kernel_max_abs_err <= self.kernel_tolerance)
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


ROUNDINGS = 4  # a re-rotation's round trip may leave this many roundings of the largest key in half precision


def rerotation_tolerance(dtype: torch.dtype, largest_key: float) -> float:
    """1e-3 in fp32; in half precision a few roundings at the keys' own scale (bf16 keeps 8 bits, so one
    rounding of a key near 10 is 0.06): a wrong rotation moves keys by their own size."""
    return 1e-3 if dtype == torch.float32 else ROUNDINGS * torch.finfo(dtype).eps * largest_key


KERNEL_SHARE = 1e-3  # of the largest key or value: two kernels' rounding through every layer reached 6e-5 of it
# (Gemma 3 270M, 581 rows, float32, an AMD EPYC); a kernel attending to the wrong rows moves values by their size


def kernel_tolerance(largest: float) -> float:
    """How far Dense through the default kernel may lie from Dense through the repair's, in fp32."""
    return KERNEL_SHARE * largest


def verify(backbone: Backbone, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32) -> VerifyReport:
    bb = backbone
    ids = bb.chat_ids([{"role": "user", "content": prompt}])
    cached, last = ids[:-1], ids[-1]
    dense = bb.prefill(cached)
    reference = bb.reference_prefill(cached)
    under_prefix, d = cache_under_prefix(bb, cached)
    corrupted = bb.shift(under_prefix, -d)
    repaired = bb.repair(corrupted, cached, range(len(cached)))

    never_stop = ()
    from_reference = bb.generate(reference, last, new_tokens, stop_ids=never_stop).tokens
    from_repaired = bb.generate(repaired, last, new_tokens, stop_ids=never_stop).tokens
    from_corrupted = bb.generate(corrupted, last, new_tokens, stop_ids=never_stop).tokens

    placed = bb.shift(dense, d)
    placement_err = max_abs(placed.keys[0], under_prefix.keys[0], placed.values[0], under_prefix.values[0])
    round_trip = bb.rerotate(bb.rerotate(dense.keys, ROUND_TRIP_SHIFT), -ROUND_TRIP_SHIFT)
    round_trip_err = max_abs(round_trip, dense.keys)

    return VerifyReport(
        model=bb.name,
        full_repair_token_identical=from_repaired == from_reference,
        tokens_compared=min(len(from_reference), len(from_repaired)),
        rerotation_max_abs_err=max(placement_err, round_trip_err),
        rerotation_tolerance=rerotation_tolerance(bb.dtype, float(dense.keys.abs().max())),
        dtype=str(bb.dtype).removeprefix("torch."),
        kernel_max_abs_err=max_abs(dense.keys, reference.keys, dense.values, reference.values),
        kernel_tolerance=kernel_tolerance(max(float(reference.keys.abs().max()), float(reference.values.abs().max()))),
        unrepaired_token_identical=from_corrupted == from_reference,
        corruption_max_abs_err=max_abs(corrupted.values, reference.values),
        repair_max_abs_err=max_abs(repaired.keys, reference.keys, repaired.values, reference.values),
        dense_text=bb.decode(from_reference),
        repaired_text=bb.decode(from_repaired),
    )


def cache_under_prefix(bb: Backbone, ids: list[int], prefix: str = FOREIGN_PREFIX):
    """The rows of `ids` computed behind a foreign prefix, and that prefix's length in tokens.

    Shifted back by the prefix length, this is what reusing a cache computed in another
    context looks like: exact at layer 0, wrong past it.
    """
    prefix_ids = bb.tokenizer(prefix, add_special_tokens=False)["input_ids"]
    return bb.prefill(prefix_ids + list(ids)).slice(len(prefix_ids)), len(prefix_ids)


def max_abs(*pairs: torch.Tensor) -> float:
    """Largest |a - b| over consecutive pairs (a1, b1, a2, b2, ...)."""
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(pairs[::2], pairs[1::2]))
