"""Full repair equals Dense in every dtype, also where the device runs Dense's causal prefill and the repair's
masked query blocks through different attention kernels (what a GPU does in half precision).

The CPU reproduces that class of defect: Hugging Face's default attention path is forced onto SDPA's math
backend and the repair's blocked kernel onto its flash backend. The two round differently in bf16 and fp16, so
comparing a repair with the default kernel's Dense tests the kernels; `bcr verify` compares it with Dense run
through the repair's own kernel (`Backbone.reference_prefill`), which must match it bit for bit.
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, tiny_speaking
from torch.nn.attention import SDPBackend, sdpa_kernel

from bcr_core.engine import kernels
from bcr_core.probes.verify import cache_under_prefix, verify

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class FlashOnly:
    """`torch.nn.functional` as the repair's kernel sees it: SDPA restricted to the flash backend."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(*args, **kwargs):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(*args, **kwargs)


@contextlib.contextmanager
def kernels_differ_by_path(monkeypatch):
    """Dense's default path on SDPA's math backend, the repair's blocked kernel on its flash backend; on a
    GPU (`BCR_TEST_DEVICE=cuda`) the device's own choice, which differs by path already."""
    if DEVICE != "cpu":
        yield
        return
    with monkeypatch.context() as patch, sdpa_kernel(SDPBackend.MATH):
        patch.setattr(kernels, "F", FlashOnly())
        yield


def test_the_kernel_defect_reproduces_on_the_cpu_in_bf16(chat_tokenizer, monkeypatch):
    """Under path-dependent kernels the repair of every row no longer equals the default kernel's Dense: its
    cache and the logits read from it differ (what the defect changes on any CPU; whether the rounding also
    flips a greedy token is a near-tie, which one CPU gives and another does not), so comparing a repair with
    the default kernel's Dense tests the kernels. Against Dense through the repair's own kernel the repair is
    exact, bit for bit, cache and logits."""
    bb = tiny_speaking(chat_tokenizer, torch.bfloat16)
    ids = bb.chat_ids([{"role": "user", "content": "Natalia sold clips"}])
    cached, last = ids[:-1], ids[-1]
    with kernels_differ_by_path(monkeypatch):
        default_dense = bb.prefill(cached)
        under_prefix, shift = cache_under_prefix(bb, cached)
        repaired = bb.repair(bb.shift(under_prefix, -shift), cached, range(len(cached)))
        from_default = bb.generate(default_dense, last, 32, stop_ids=(), keep_logits=True)
        from_repaired = bb.generate(repaired, last, 32, stop_ids=(), forced=from_default.tokens, keep_logits=True)
        reference = bb.reference_prefill(cached)
        from_reference = bb.generate(reference, last, 32, stop_ids=(), forced=from_default.tokens, keep_logits=True)
    assert float((repaired.values - default_dense.values).abs().max()) > 0
    assert not torch.equal(torch.stack(from_repaired.logits), torch.stack(from_default.logits))
    assert torch.equal(repaired.keys, reference.keys) and torch.equal(repaired.values, reference.values)
    assert torch.equal(torch.stack(from_repaired.logits), torch.stack(from_reference.logits))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_verify_passes_in_every_dtype_when_the_kernels_differ_by_path(chat_tokenizer, monkeypatch, dtype):
    bb = tiny_speaking(chat_tokenizer, dtype)
    with kernels_differ_by_path(monkeypatch):
        report = verify(bb)
    assert report.passed, report.to_dict()
    assert report.repair_max_abs_err == 0.0 and report.full_repair_token_identical
    assert report.dtype == str(dtype).removeprefix("torch.")
    if dtype != torch.float32:  # the defect is there, and reported: the default kernel's Dense differs
        assert report.kernel_max_abs_err > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_left_stale_makes_verify_fail_in_every_dtype(chat_tokenizer, monkeypatch, dtype):
    bb = tiny_speaking(chat_tokenizer, dtype)
    full_repair = bb.repair

    def all_but_one(kv, ids, rows, **kwargs):
        rows = [r for r in rows if r != 5]
        return full_repair(kv, ids, rows, **kwargs)

    monkeypatch.setattr(bb, "repair", all_but_one)  # Dense (`reference_prefill`) still recomputes every row
    report = verify(bb)
    assert not report.passed
    assert report.repair_max_abs_err > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_rotation_one_position_off_makes_verify_fail_in_every_dtype(chat_tokenizer, monkeypatch, dtype):
    """The half-precision tolerance is at the keys' own scale; a rotation by the wrong offset moves keys
    by their size, and verify says FAIL."""
    bb = tiny_speaking(chat_tokenizer, dtype)
    rotate = bb.rerotate
    monkeypatch.setattr(bb, "rerotate", lambda keys, delta, out=None: rotate(keys, delta + 1, out=out))
    report = verify(bb)
    assert not report.passed
    assert report.rerotation_max_abs_err > report.rerotation_tolerance


def test_the_fp32_kernel_check_scales_with_the_values_it_compares():
    """Dense through two kernels in fp32: rounding through every layer of a long prompt reached 0.0056 on
    values near 98 (Gemma 3 270M, 581 rows, an AMD EPYC), which a fixed 1e-3 failed; a kernel that attends to
    the wrong rows moves values by their own size, which the scaled tolerance still refuses."""
    from dataclasses import replace

    from bcr_core.probes.verify import VerifyReport, kernel_tolerance

    fine = VerifyReport(
        model="m",
        full_repair_token_identical=True,
        tokens_compared=32,
        rerotation_max_abs_err=0.0,
        rerotation_tolerance=1e-3,
        dtype="float32",
        kernel_max_abs_err=0.0056,
        kernel_tolerance=kernel_tolerance(98.3),
        unrepaired_token_identical=False,
        corruption_max_abs_err=5.0,
        repair_max_abs_err=0.0,
        dense_text="",
        repaired_text="",
    )
    assert fine.passed
    assert not replace(fine, kernel_max_abs_err=20.0).passed  # wrong rows: an error at the values' own scale
    assert not replace(fine, kernel_max_abs_err=0.0056, kernel_tolerance=kernel_tolerance(1.0)).passed
    assert replace(fine, dtype="bfloat16", kernel_max_abs_err=20.0).passed  # half precision: reported, not held
