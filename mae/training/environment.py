"""What a bug report needs about the machine a run would train on (``mae env``): the interpreter and
platform, the versions of the packages the package runs on, the device, bf16 support, and the precision,
model step and attention kernels a training run would pick by default (``mae.training.runtime``)."""

import platform
import sys

import torch

from mae.training.runtime import default_lightning_precision, native_bf16, training_settings
from mae.training.trackers import NOT_INSTALLED, package_versions

CORE_PACKAGES = (
    "torch",
    "torchvision",
    "timm",
    "lightning",
    "torchmetrics",
    "jsonargparse",
    "litdata",
    "numpy",
    "pillow",
)
EXTRA_PACKAGES = (
    "onnx",
    "onnxscript",
    "onnxruntime",
    "pycocotools",
    "pyarrow",
    "gradio",
    "transformers",
    "shtab",
)


def environment() -> dict[str, str]:
    """Label -> value, in the order ``mae env`` prints them (after the package's own line)."""
    info = {"python": f"{platform.python_version()} ({sys.executable})", "platform": platform.platform()}
    info |= package_versions(CORE_PACKAGES)
    extras = package_versions(EXTRA_PACKAGES)
    info["extras"] = ", ".join(f"{p} {'-' if v == NOT_INSTALLED else v}" for p, v in extras.items())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info["device"] = (
        _cuda_device()
        if device == "cuda"
        else (f"cpu ({torch.get_num_threads()} threads; no CUDA device visible to torch)")
    )
    info["bf16"] = "native" if native_bf16(device) else "emulated (slower than fp32: runs train in fp32)"
    settings = training_settings(device)
    info["default run"] = (
        f"trainer.precision {default_lightning_precision()}; the model step: {settings.describe()}"
    )
    if device == "cuda":
        info["attention kernels"] = "scaled_dot_product_attention may pick " + ", ".join(_attention_kernels())
    return info


def _cuda_device() -> str:
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    capability = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return (
        f"cuda: {torch.cuda.device_count()} x {names[0]} (compute capability {capability}), "
        f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    )


def _attention_kernels() -> list[str]:
    """The kernels ``scaled_dot_product_attention`` may pick on this CUDA device."""
    enabled = (
        ("flash", torch.backends.cuda.flash_sdp_enabled()),
        ("memory-efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
        ("math", torch.backends.cuda.math_sdp_enabled()),
    )
    return [name for name, on in enabled if on]
