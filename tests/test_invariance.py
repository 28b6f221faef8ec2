"""Batch-invariant decoding (`engine.invariance`): a sequence's tokens and every step's logits are bit for bit
the same decoded alone, in a batch of 3 or of 8 beside different companions, and joining a batch that is
already running, in every family on tiny random models and on the real models (the Qwen coder in bfloat16
on HumanEval prompts, SmolLM2 in float32). Bitwise, not within a tolerance: the claim is identity."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, FAMILIES, random_ids, tiny_family_config
from helpers import Products

from bcr_core.data import datasets
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.invariance import ROWS, fixed_row_linear

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="batch invariance is promised on a CPU (engine.invariance)")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request) -> Backbone:
    return Backbone.from_config(tiny_family_config(request.param), device="cpu", dtype=torch.float32, seed=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_product_is_the_same_at_any_place_among_any_companions(dtype):
    """What the decoder relies on: one row's `fixed_row_linear` is one value, alone or at any of 13 places
    among random companions (two blocks), and equals `F.linear` up to rounding. Every product it issues has
    `ROWS` rows, whatever the batch: a lone row and 13 rows alike are padded to that one shape, and the 13
    span more than one block, so the places cover a full block and the padded one."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 96, generator=generator).to(dtype)
    row = torch.randn(96, generator=generator).to(dtype)
    alone = fixed_row_linear(row[None], weight)[0]
    for place in range(13):
        batch = torch.randn(13, 96, generator=generator).to(dtype)
        batch[place] = row
        assert torch.equal(fixed_row_linear(batch, weight)[place], alone)
    plain = F.linear(row[None], weight)[0].double()
    assert (alone.double() - plain).abs().max() <= 64 * torch.finfo(dtype).eps * plain.abs().max()
    for m in (1, 13):  # one shape: a lone row padded to `ROWS` rows, 13 rows cut into blocks of `ROWS`
        with Products() as products:
            fixed_row_linear(torch.randn(m, 96, generator=generator).to(dtype), weight)
        assert products.rows == [ROWS] * -(-m // ROWS), (m, products.rows)
    assert 1 < ROWS < 13 and 13 % ROWS  # so the 13 places above meet companions, a full block and a padded one


class Logits:
    """The logits of every step of a `BatchDecoder` whose rows never leave early: (step, row, vocab)."""

    def __init__(self, bb):
        self.steps, self.handle = [], bb.model.lm_head.register_forward_hook(self.keep)

    def keep(self, module, args, out):
        self.steps.append(out[:, -1].float().clone())

    def row(self, b: int) -> torch.Tensor:
        self.handle.remove()
        return torch.stack([s[b] for s in self.steps])


def decoded_in_batch(bb, caches: list, target: int, steps: int, join_after: int = 0):
    """`caches[target]`'s tokens and logits decoded beside the others; with `join_after`, it joins after the
    others have run that many steps."""
    decoder, logits, done = BatchDecoder(bb, stop_ids=()), None, {}
    order = [i for i in range(len(caches)) if i != target] + [target]
    for i in order[:-1]:
        decoder.add(i, *caches[i], steps + join_after)
    for _ in range(join_after):
        done.update(decoder.step())
    logits = Logits(bb)
    decoder.add(target, *caches[target], steps)
    while decoder:
        done.update(decoder.step())
    return done[target].tokens, logits.row(len(order) - 1)[:steps]


def alone(bb, kv, last, steps: int):
    generation = bb.generate(kv, last, steps, stop_ids=(), keep_logits=True)
    return generation.tokens, torch.stack(generation.logits)


def assert_invariant(bb, caches: list, target: int, steps: int, companions: list[list[int]]):
    tokens, logits = alone(bb, *caches[target], steps)
    for group in companions:
        chosen = [caches[i] for i in group] + [caches[target]]
        got_tokens, got_logits = decoded_in_batch(bb, chosen, len(chosen) - 1, steps)
        assert got_tokens == tokens, f"beside {group}"
        assert torch.equal(got_logits, logits), f"beside {group}: logits differ by {(got_logits - logits).abs().max()}"


@pytest.mark.parametrize("rows", [1, 8])
def test_tiny_models_decode_alone_as_in_any_batch(tiny, rows, monkeypatch):
    """Caches of different lengths (left padding moves), positions not from 0, windows longer and shorter
    than the caches (Mistral, Phi-3, Gemma 3 window their layers); products of one row (half precision's)
    and of eight (float32's)."""
    monkeypatch.setattr(tiny, "decode_rows", rows)
    caches = []
    for i, n in enumerate([5, 17, 40, 33, 9, 26, 50, 12, 21]):
        ids = random_ids(n + 1, seed=10 + i)
        caches.append((tiny.prefill(ids[:-1], positions=torch.arange(3 * i, 3 * i + n)), ids[-1]))
    for target in (2, 4):
        others = [i for i in range(len(caches)) if i != target]
        assert_invariant(tiny, caches, target, 12, [others[:2], others[2:4], others[:7]])
    tokens, logits = alone(tiny, *caches[2], 12)
    late = decoded_in_batch(tiny, caches[:3] + caches[5:8], 2, 12, join_after=5)
    assert late[0] == tokens and torch.equal(late[1], logits)


def prompt_caches(bb, prompts: list[str]) -> list:
    caches = []
    for text in prompts:
        ids = bb.chat_ids([{"role": "user", "content": text}])
        caches.append((bb.prefill(ids[:-1]), ids[-1]))
    return caches


def test_the_qwen_coder_in_bfloat16_decodes_humaneval_prompts_alone_as_in_any_batch(qwen_coder):
    """The committed HumanEval cell's model and dtype: three tasks' prompts, each alone, at batch 3 and at
    batch 8 beside other tasks."""
    tasks = datasets.load_humaneval()[:11]
    caches = prompt_caches(qwen_coder, [f"Complete this function.\n{t['prompt']}" for t in tasks])
    for target in (0, 1, 2):
        others = [i for i in range(11) if i != target]
        assert_invariant(qwen_coder, caches, target, 16, [others[:2], others[3:10]])


def test_smollm2_in_float32_decodes_alone_as_in_any_batch(real):
    prompts = [f"Question {i}: what is {3 * i} plus {i + 4}? Explain step by step." for i in range(10)]
    caches = prompt_caches(real, prompts)
    for target in (0, 5):
        others = [i for i in range(10) if i != target]
        assert_invariant(real, caches, target, 24, [others[:2], others[2:9]])
