"""Half-precision products on a CPU without half-precision matrix units (`engine.products`): what such a unit
computes (the half-precision values' products summed in float32, rounded once), through float32 BLAS for
products of several rows; one row, and every decode step's rows, in half precision as before."""

import pytest
import torch
import torch.nn.functional as F
from conftest import random_ids, tiny_family_config
from helpers import Products
from torch import nn

from bcr_core.engine import products
from bcr_core.engine.backbone import Backbone
from bcr_core.engine.batching import BatchDecoder
from bcr_core.engine.invariance import FixedRowProducts
from bcr_core.engine.products import Float32Products, float32_products, needs_float32_products

HALF = [torch.bfloat16, torch.float16]


def layer(dtype, rows_in=96, rows_out=300, seed=0) -> Float32Products:
    torch.manual_seed(seed)
    linear = nn.Linear(rows_in, rows_out).to(dtype)
    float32_products(linear)
    return linear


@pytest.mark.parametrize("dtype", HALF)
def test_a_product_is_the_exact_sum_rounded_once_to_half_precision(dtype):
    """Against the exact (float64) product of the half-precision values: within half an ulp of the output
    dtype from the rounding, plus float32's summation error, which scales with the sum of |x w|."""
    linear = layer(dtype)
    x = torch.randn(2, 7, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = linear(x)
    assert out.dtype == dtype and out.shape == (2, 7, 300)
    exact = F.linear(x.double(), linear.weight.double(), linear.bias.double())
    magnitude = F.linear(x.double().abs(), linear.weight.double().abs(), linear.bias.double().abs())
    bound = exact.abs() * torch.finfo(dtype).eps / 2 + 96 * torch.finfo(torch.float32).eps * magnitude
    assert ((out.double() - exact).abs() <= bound).all()


def test_products_of_several_rows_run_in_float32_and_one_row_or_a_decode_step_in_half_precision():
    linear = layer(torch.bfloat16)
    x = torch.randn(3, 96).to(torch.bfloat16)
    for rows, expected in [(x[:1], [(1, torch.bfloat16)]), (x, [(3, torch.float32)]), (x[None], [(3, torch.float32)])]:
        with Products() as seen:
            linear(rows)
        assert seen.seen == expected
    with Products() as seen, FixedRowProducts(1):
        stepped = linear(x)
    assert seen.seen == [(1, torch.bfloat16)] * 3  # the decode step's own rows, in half precision
    assert all(torch.equal(stepped[i], F.linear(x[i : i + 1], linear.weight, linear.bias)[0]) for i in range(3))
    with Products() as seen:
        linear(x)
    assert seen.seen == [(3, torch.float32)]  # the decode step's rule ended with it


def test_the_float32_weights_follow_the_weights():
    """Doubling weight and bias in place doubles the output exactly (a power of two commutes with rounding);
    a stale float32 copy would give the old output."""
    linear = layer(torch.bfloat16)
    x = torch.randn(4, 96).to(torch.bfloat16)
    before = linear(x)
    with torch.no_grad():
        linear.weight.mul_(2)
        linear.bias.mul_(2)
    assert torch.equal(linear(x), 2 * before)


def test_float32_products_can_be_turned_off_again():
    linear = layer(torch.bfloat16)
    float32_products(linear, enabled=False)
    assert type(linear) is nn.Linear
    with Products() as seen:
        linear(torch.randn(3, 96).to(torch.bfloat16))
    assert seen.seen == [(3, torch.bfloat16)]


@pytest.mark.parametrize("native", [False, True])
def test_a_half_precision_model_computes_in_float32_only_on_a_cpu_without_its_units(native, monkeypatch):
    monkeypatch.setitem(products.NATIVE_SUPPORT, torch.bfloat16, lambda: native)
    cpu = torch.device("cpu")
    assert needs_float32_products(cpu, torch.bfloat16) is not native
    assert not needs_float32_products(cpu, torch.float32)
    assert not needs_float32_products(torch.device("cuda"), torch.bfloat16)
    bb = Backbone.from_config(tiny_family_config("llama"), device="cpu", dtype=torch.bfloat16, seed=0)
    linears = [m for m in bb.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all((type(m) is Float32Products) is not native for m in linears)
    # and a run folder records which (`arithmetic.json`), so a resume on the other kind of CPU is refused
    assert bb.arithmetic()["products"] == (
        "bfloat16, the device's own kernels" if native else "bfloat16 values, float32 sums (Float32Products)"
    )
    assert bb.arithmetic()["cpu kernels"] == torch.backends.cpu.get_cpu_capability()
    assert Backbone.from_config(tiny_family_config("llama"), device="cpu", seed=0).arithmetic()["products"] == "float32"


def test_a_tiny_bfloat16_model_with_float32_products_decodes_alone_as_in_a_batch():
    """Prefills in float32 products, decode steps in one-row bfloat16 ones: a sequence's tokens and logits are
    the same decoded alone and beside two companions (a rule that read the batch's rows would send the batch's
    products to float32 and the lone row's to bfloat16; at the Qwen coder's width, where the two round apart)."""
    wide = {"hidden_size": 896, "intermediate_size": 3584, "num_attention_heads": 56, "num_key_value_heads": 28}
    bb = Backbone.from_config(tiny_family_config("llama", **wide), device="cpu", dtype=torch.bfloat16, seed=0)
    float32_products(bb.model)
    caches = []
    for i, n in enumerate([9, 23, 14]):
        ids = random_ids(n + 1, seed=i)
        caches.append((bb.prefill(ids[:-1]), ids[-1]))
    alone = bb.generate(*caches[0], 10, stop_ids=(), keep_logits=True)
    decoder, done, steps = BatchDecoder(bb, stop_ids=()), {}, []
    handle = bb.model.lm_head.register_forward_hook(lambda module, args, out: steps.append(out[0, -1].float()))
    for i, (kv, last) in enumerate(caches):
        decoder.add(i, kv, last, 10)
    while decoder:
        done.update(decoder.step())
    handle.remove()
    assert done[0].tokens == alone.tokens
    assert torch.equal(torch.stack(steps), torch.stack(alone.logits).float())
