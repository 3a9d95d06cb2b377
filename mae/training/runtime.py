"""How a training step runs on this device: precision, attention kernel, compilation, fused optimizer,
and the host memory allocator.

The defaults are measured, not assumed (``benchmarks/throughput.py``, docs/performance.md): on CPUs
with native bf16 (AVX-512 BF16 / AMX), bf16 autocast with explicit attention, fused AdamW, a
compiled model for runs long enough to repay compilation, and an allocator that keeps freed pages;
on GPUs, bf16 with PyTorch's fused SDPA (flash attention).
"""

import ctypes
import ctypes.util
import platform
from dataclasses import dataclass
from typing import Literal

import torch
from timm.layers import Attention
from torch import nn

from mae.errors import ConfigError
from mae.models.cross_attention import CrossAttention

Precision = Literal["fp32", "bf16"]
AttentionKernel = Literal["sdpa", "explicit"]


@dataclass(frozen=True)
class TrainingSettings:
    """precision: "bf16" (autocast) or "fp32"; attention: "sdpa" (``scaled_dot_product_attention``) or
    "explicit" (softmax(q k^T) v as matmuls); compile: ``torch.compile`` the model; fused_adamw: the
    single-kernel AdamW."""

    precision: Precision
    attention: AttentionKernel
    compile: bool
    fused_adamw: bool

    def describe(self) -> str:
        extras = [name for name, on in (("compile", self.compile), ("fused AdamW", self.fused_adamw)) if on]
        return " + ".join([self.precision, self.attention] + extras)


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bf16 matmuls natively (CUDA compute capability >= 8, or a CPU with
    AVX-512 BF16 / AMX); emulated bf16 is slower than fp32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        capabilities = torch.cpu.get_capabilities()
        return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_tile"))
    return False


def default_precision(device: torch.device | str) -> Precision:
    """The precision a run on ``device`` trains in unless told: bf16 autocast where the device computes
    bf16 natively (a GPU from Ampere on, a CPU with AVX-512 BF16 / AMX; fp16 MAE runs are known to hit
    NaNs), else fp32."""
    return "bf16" if native_bf16(device) else "fp32"


def default_lightning_precision() -> str:
    """``default_precision`` of the device a run trains on (CUDA when there is one) as Lightning's
    ``trainer.precision``: "bf16-mixed" or "32-true"."""
    return {"bf16": "bf16-mixed", "fp32": "32-true"}[
        default_precision("cuda" if torch.cuda.is_available() else "cpu")
    ]


# Compiling the model costs about a minute on 2 CPU cores (less with a warm cache) and saves 25-40 %
# of every step after it: worth it from about a thousand steps on.
COMPILE_MIN_STEPS = 1000


def training_settings(
    device: torch.device | str, precision: Precision | None = None, steps: int | float | None = None
) -> TrainingSettings:
    """The fastest measured settings for pretraining on ``device`` in ``precision`` (default: bf16
    where the device computes it natively, else fp32), for a run of ``steps`` optimizer steps (None:
    a long run)."""
    device = torch.device(device)
    precision = precision or default_precision(device)
    # On CPU, SDPA's bf16 path is slower than two matmuls and a softmax at MAE's sequence lengths.
    attention = "explicit" if device.type == "cpu" and precision == "bf16" else "sdpa"
    compile_pays = steps is None or steps >= COMPILE_MIN_STEPS
    fused = device.type in ("cpu", "cuda")
    return TrainingSettings(precision=precision, attention=attention, compile=compile_pays, fused_adamw=fused)


def settings_for_trainer(trainer, steps: int | float | None = None) -> TrainingSettings:
    """``training_settings`` for a Lightning run: its precision and the device its strategy trains on
    (a module's ``setup()`` runs before the module is moved there, so ``module.device`` is not it yet)."""
    precision = "bf16" if "bf16" in str(trainer.precision) else "fp32"
    return training_settings(trainer.strategy.root_device, precision, steps)


def set_attention_kernel(model: nn.Module, kernel: AttentionKernel) -> nn.Module:
    """Switch every timm ``Attention`` (and the cross decoder's ``CrossAttention``) in ``model`` to
    ``kernel``; returns ``model``."""
    if kernel not in ("sdpa", "explicit"):
        raise ConfigError(f"attention kernel must be 'sdpa' or 'explicit', got {kernel!r}")
    for module in model.modules():
        if isinstance(module, Attention | CrossAttention):
            module.fused_attn = kernel == "sdpa"
    return model


def keep_freed_memory() -> bool:
    """Stop glibc from returning tensor memory to the OS between training steps; returns whether set.

    By default glibc serves large blocks (activations) by ``mmap`` and unmaps them when freed, and
    trims the heap top, so each step page-faults its activations in again: on CPU that costs 2-22 %
    of a step. Serving blocks up to 32 MiB (glibc's maximum) from the heap and never trimming it
    keeps the pages mapped, at the cost of the process keeping its peak memory. Linux/glibc only.
    """
    if platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 2**20)) and bool(
        libc.mallopt(m_trim_threshold, 2**31 - 1)
    )
