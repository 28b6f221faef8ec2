"""Half-precision matrix products on a CPU without half-precision matrix units, computed in float32.

There a bfloat16 product falls back to PyTorch's generic kernels: on an AMD EPYC with AVX2 only, the Qwen
coder's 654-token prefill took 30.0 s in bfloat16 against 4.16 s with its products in float32
(benchmarks/half_products.py, docs/performance.md). What a half-precision matrix unit computes (AMX, a GPU's
tensor cores) is the product of the half-precision values summed in float32 and rounded once to half precision;
`Float32Products` computes exactly that through float32 BLAS, from a float32 copy of the weights (widening is
exact). Its result differs from the generic kernel's only in the order of the float32 sums, as two CPUs' kernels
differ.

Products of one row stay in half precision: a matrix-vector product is bound by reading the weights, which
half precision halves, and the generic kernel computes it as fast as float32 would. That covers every
decode step, whose products `engine.invariance` computes one row at a time (`decode_step_rows`): the rule
reads only the product's own rows, never its batch, so batch invariance holds through it.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import nn

from bcr_core.engine.invariance import decode_step_rows
from bcr_core.engine.models import dtype_name

NATIVE_SUPPORT = {  # whether oneDNN computes the dtype's products on this CPU (AMX, AVX-512 BF16/FP16, or emulated)
    torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
    torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported,
}


def needs_float32_products(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `dtype`'s products on `device` fall back to PyTorch's generic kernels (module docstring)."""
    return device.type == "cpu" and dtype in NATIVE_SUPPORT and not NATIVE_SUPPORT[dtype]()


class Float32Products(nn.Linear):
    """An `nn.Linear` whose half-precision products of more than one row run in float32 on the CPU, rounded
    once to the input's dtype (module docstring). The float32 weights are made on first use and again
    whenever the weights change (their version counters move)."""

    _float32: tuple = ()  # (weight version, weight, bias) in float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one_row = x.numel() == x.shape[-1]
        if x.dtype not in NATIVE_SUPPORT or x.device.type != "cpu" or one_row or decode_step_rows() is not None:
            return F.linear(x, self.weight, self.bias)
        weight, bias = self.float32_weights()
        return F.linear(x.float(), weight, bias).to(x.dtype)

    def float32_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        version = (self.weight.data_ptr(), self.weight._version, None if self.bias is None else self.bias._version)
        if not self._float32 or self._float32[0] != version:
            bias = None if self.bias is None else self.bias.float()
            self._float32 = (version, self.weight.detach().float(), bias)
        return self._float32[1], self._float32[2]


def arithmetic(device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """What decides a run's rounding on this machine, for a run folder to record (`runs.run_writer`): the
    device, PyTorch's version, its CPU kernels' instruction set or the GPU, and how half-precision products
    are computed. `cpu model` is for the reader only: two CPUs with one instruction set run the same kernels."""
    if device.type == "cuda":
        found = {"device": "cuda", "gpu": torch.cuda.get_device_name(device)}
    else:
        found = {"device": device.type, "cpu kernels": torch.backends.cpu.get_cpu_capability()}
    products = dtype_name(dtype)
    if dtype in NATIVE_SUPPORT and needs_float32_products(device, dtype):
        products += " values, float32 sums (Float32Products)"
    elif dtype in NATIVE_SUPPORT:
        products += ", the device's own kernels"
    return found | {"torch": torch.__version__, "products": products, "cpu model": cpu_model()}


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (`/proc/cpuinfo`), else `platform.processor()`."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def float32_products(model: nn.Module, enabled: bool = True) -> None:
    """Every `nn.Linear` of `model` computes its products as `Float32Products` (or, not `enabled`, as it did)."""
    for module in model.modules():
        if enabled and type(module) is nn.Linear:
            module.__class__ = Float32Products
        elif not enabled and type(module) is Float32Products:
            module.__class__ = nn.Linear
            module.__dict__.pop("_float32", None)
